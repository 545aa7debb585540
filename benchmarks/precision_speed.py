"""Does the shipped precision fit this machine? Training-step time of a recipe as shipped, in fp32, and in bf16.

Prints the CPU, whether oneDNN runs bf16 natively on it, what `precision: auto` resolves to, and the
median time of a training step (all-MiniLM-L6-v2, the recipe's batch and max length) with the recipe as
shipped, with `train.precision=fp32` and with `train.precision=bf16`. On a CPU without native bf16 the
shipped recipe must be as fast as fp32 (bf16 there is emulated and many times slower).

    python benchmarks/precision_speed.py --recipe recipes/quickstart.yaml --steps 3 --batch-size 64
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState
from transformers.utils import logging as hf_logging

from csekit.config import load_recipe
from csekit.data import TrainCollator, open_corpus
from csekit.data_dir import resolve_data_dir
from csekit.encoder import SentenceEncoder
from csekit.model import build_model
from csekit.precision import cpu_has_native_bf16, resolve_precision
from csekit.training import MIXED_PRECISION, forward_backward, make_optimizer


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def step_seconds(recipe_path: str, precision: str, steps: int, batch_size: int) -> list[float]:
    """Seconds of each training step after one warm-up step, through the trainer's own forward/backward."""
    recipe = load_recipe(recipe_path, [f"train.batch_size={batch_size}"])
    resolved = resolve_precision(precision, "cpu")[0]
    torch.manual_seed(0)
    encoder = SentenceEncoder.load(recipe.model.backbone, recipe.model.pooler, dropout=recipe.model.dropout)
    model, views = build_model(recipe, encoder)
    accelerator = Accelerator(cpu=True, mixed_precision=MIXED_PRECISION[resolved])
    optimizer = make_optimizer(model, recipe)
    model, optimizer = accelerator.prepare(model, optimizer)
    corpus = open_corpus(
        recipe.data.corpus, resolve_data_dir(None), recipe.data.max_chars, "skip", recipe.data.text_column
    )
    collate = TrainCollator(views, recipe.data.text_column)
    model.train()
    times = []
    for step in range(steps + 1):
        batch = collate([corpus[i] for i in range(step * batch_size, (step + 1) * batch_size)])
        start = time.perf_counter()
        forward_backward(accelerator, model, batch, recipe.train.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step:
            times.append(time.perf_counter() - start)
    AcceleratorState._reset_state(reset_partial_state=True)  # accelerate keeps one precision per process
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="recipes/quickstart.yaml")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--skip-bf16", action="store_true", help="skip the (possibly very slow) bf16 run")
    args = parser.parse_args()
    hf_logging.disable_progress_bar()
    shipped = load_recipe(args.recipe).train.precision
    chosen, reason = resolve_precision(shipped, "cpu")
    print(f"CPU: {cpu_name()}; {torch.get_num_threads()} threads; oneDNN native bf16: {cpu_has_native_bf16()}")
    print(f"{args.recipe}: precision {shipped} -> {chosen} ({reason})")
    runs = [("as shipped", shipped), ("fp32", "fp32")] + ([] if args.skip_bf16 else [("bf16", "bf16")])
    medians = {}
    for label, precision in runs:
        times = step_seconds(args.recipe, precision, args.steps, args.batch_size)
        medians[label] = statistics.median(times)
        each = ", ".join(f"{t:.2f}" for t in times)
        print(f"  {label:10s} {medians[label]:8.2f} s/step (median of {len(times)}: {each})")
    print(f"as shipped / fp32: {medians['as shipped'] / medians['fp32']:.2f}")
    if "bf16" in medians:
        print(f"bf16 / fp32: {medians['bf16'] / medians['fp32']:.1f}")


if __name__ == "__main__":
    main()

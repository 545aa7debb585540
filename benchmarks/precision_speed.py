"""Does the shipped precision fit this machine? Training-step time of a recipe as shipped, in fp32, and in bf16.

Prints the CPU, whether oneDNN runs bf16 natively on it, what `precision: auto` resolves to, and the
median time of a training step (profile_step's trainer step on one random batch of the corpus) with the recipe as
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
from accelerate.state import AcceleratorState
from profile_step import csekit_step  # benchmarks/ is on the path when run as a script
from transformers.utils import logging as hf_logging

from csekit.core.precision import cpu_has_native_bf16, cpu_model_and_flags, resolve_precision
from csekit.training.recipe import load_recipe


def cpu_name() -> str:
    """The CPU model as /proc/cpuinfo names it, else as the platform does."""
    name = cpu_model_and_flags()[0]
    return name if name != "unknown CPU" else platform.processor() or name


def step_seconds(recipe_path: str, precision: str, steps: int, batch_size: int) -> list[float]:
    """Seconds of each training step after one warm-up step: profile_step's copy-free trainer step."""
    recipe = load_recipe(recipe_path)
    resolved = resolve_precision(precision, "cpu")[0]
    step = csekit_step(Path(recipe_path), resolved, batch_size, recipe.model.max_length)
    step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    AcceleratorState._reset_state(reset_partial_state=True)  # accelerate keeps one precision per process
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="recipes/quickstart.yaml")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2, help="turns of the shipped and fp32 runs")
    parser.add_argument("--skip-bf16", action="store_true", help="skip the (possibly very slow) bf16 run")
    args = parser.parse_args()
    hf_logging.disable_progress_bar()
    shipped = load_recipe(args.recipe).train.precision
    chosen, reason = resolve_precision(shipped, "cpu")
    print(f"CPU: {cpu_name()}; {torch.get_num_threads()} threads; oneDNN native bf16: {cpu_has_native_bf16()}")
    print(f"{args.recipe}: precision {shipped} -> {chosen} ({reason})")
    # The first configuration a process builds runs a little slower (allocator and caches still cold), so the
    # shipped and fp32 runs take turns, `--rounds` times each; bf16 (slow where emulated) runs once, last.
    runs = [("as shipped", shipped), ("fp32", "fp32")] * args.rounds + ([] if args.skip_bf16 else [("bf16", "bf16")])
    times: dict[str, list[float]] = {}
    for label, precision in runs:
        times.setdefault(label, []).extend(step_seconds(args.recipe, precision, args.steps, args.batch_size))
    medians = {label: statistics.median(values) for label, values in times.items()}
    for label, values in times.items():
        each = ", ".join(f"{t:.2f}" for t in values)
        print(f"  {label:10s} {medians[label]:8.2f} s/step (median of {len(values)}: {each})")
    print(f"as shipped / fp32: {medians['as shipped'] / medians['fp32']:.2f}")
    if "bf16" in medians:
        print(f"bf16 / fp32: {medians['bf16'] / medians['fp32']:.1f}")


if __name__ == "__main__":
    main()

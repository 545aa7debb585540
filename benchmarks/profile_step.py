"""Where a training step's time goes: csekit's step against the matrix-product bound (and a plain bf16 loop).

    python benchmarks/profile_step.py                 # quickstart recipe (MiniLM, cls, batch 64, length 32)
    python benchmarks/profile_step.py --table 25      # longer operator tables

For each variant it times `--steps` steps after `--warmup` steps and prints seconds per step, the
step's matrix-product FLOPs (counted by `torch.utils.flop_counter`) and the rate they imply, next to
the matrix-product rate this CPU reaches on a large product at the same precision (the bound). Then it prints the
torch profiler's operators by self CPU time for csekit's step, so the rest of the time is named.

Variants (same model, same batch of real corpus sentences, same loss):
  csekit (--precision)        the trainer's own step: accelerate's autocast, backward, clip, AdamW; the
                              native precision by default (bf16 where the CPU has it, else fp32)
  plain bf16                  the model cast to bf16 (weights, gradients and AdamW state in bf16); only
                              when the precision is bf16
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils.flop_counter import FlopCounterMode

from csekit.core.precision import DTYPES, resolve_precision

REPO = Path(__file__).resolve().parents[1]


def matmul_bound(dtype: torch.dtype, size: int = 2048, repeats: int = 10) -> float:
    """GFLOP/s of a large square matrix product in `dtype` (what the step's products could reach)."""
    a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
    a @ b
    started = time.perf_counter()
    for _ in range(repeats):
        a @ b
    return 2 * size**3 * repeats / (time.perf_counter() - started) / 1e9


def build(recipe_path: Path, batch_size: int, max_length: int):  # type: ignore[no-untyped-def]
    """The recipe's model, views and optimizer, one random batch of its corpus's sentences, and the recipe."""
    from csekit.data.corpus import open_corpus
    from csekit.data.data_dir import resolve_data_dir
    from csekit.encoding.encoder import SentenceEncoder
    from csekit.training.model import build_model
    from csekit.training.optimization import make_optimizer
    from csekit.training.recipe import load_recipe

    recipe = load_recipe(recipe_path, [f"train.batch_size={batch_size}", f"model.max_length={max_length}"])
    data = recipe.data
    corpus = open_corpus(data.corpus, resolve_data_dir(None), data.max_chars, data.bad_lines, data.text_column)
    sentences = [corpus[i] for i in random.Random(0).sample(range(len(corpus)), batch_size)]  # a random batch
    encoder = SentenceEncoder.load(recipe.model.backbone, recipe.model.pooler)
    model, views = build_model(recipe, encoder)
    return model, views, make_optimizer(model, recipe), sentences, recipe


def csekit_step(recipe_path: Path, precision: str, batch_size: int, max_length: int) -> Callable[..., None]:
    """One step as `csekit.training.trainer.train` takes it: collation (tokenisation, as in its DataLoader),
    the loop's `forward_backward`, the logged loss's all-reduce, AdamW. The step takes a batch of sentences
    (by default one random batch of the recipe's corpus).

    accelerate allows one Accelerator (one precision) a process: one csekit variant a run.
    """
    from accelerate import Accelerator

    from csekit.data.corpus import TrainCollator
    from csekit.training.optimization import forward_backward
    from csekit.training.processes import MIXED_PRECISION, keep_freed_memory

    keep_freed_memory()  # as `train` does on CPU (process-wide, so the plain loop gets it too)
    model, views, optimizer, sentences, recipe = build(recipe_path, batch_size, max_length)
    accelerator = Accelerator(mixed_precision=MIXED_PRECISION[precision])
    model, optimizer = accelerator.prepare(model, optimizer)
    model.train()
    collate = TrainCollator(views, recipe.data.text_column)

    def step(batch: list[str] = sentences) -> None:
        loss, parts, _ = forward_backward(accelerator, model, collate(batch), recipe.train.max_grad_norm)
        accelerator.reduce(torch.stack([loss.detach(), *parts.values()]).float(), "mean").tolist()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def plain_bf16_step(recipe_path: Path, batch_size: int, max_length: int) -> Callable[[], None]:
    """The same model and loss with every weight in bf16 and no autocast: the fastest, least accurate step."""
    model, views, _, sentences, _ = build(recipe_path, batch_size, max_length)
    model.to(torch.bfloat16).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-5, fused=True)

    def step() -> None:
        loss, _ = model(views(sentences), sentences)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def native_precision() -> str:
    """bf16 where this CPU runs it natively, else fp32 (what `precision: auto` picks)."""
    return resolve_precision("auto", "cpu")[0]


def seconds_per_step(step: Callable[[], None], warmup: int, steps: int) -> float:
    for _ in range(warmup):
        step()
    started = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - started) / steps


def matmul_flops(step: Callable[[], None]) -> int:
    with FlopCounterMode(display=False) as counter:
        step()
    return counter.get_total_flops()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", type=Path, default=REPO / "recipes" / "quickstart.yaml")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--max-length", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument(
        "--precision",
        default="native",
        help="csekit's precision: native (bf16 where the CPU runs it natively, else fp32), bf16 or fp32",
    )
    parser.add_argument("--table", type=int, default=15, help="operators shown in each profile table")
    args = parser.parse_args()
    precision = native_precision() if args.precision == "native" else args.precision
    shape = (args.recipe, args.batch_size, args.max_length)
    bound = matmul_bound(DTYPES[precision])
    print(f"{torch.get_num_threads()} threads; {precision} 2048x2048 matrix product: {bound:.0f} GFLOP/s (the bound)")
    csekit = f"csekit {precision}"
    variants = {csekit: csekit_step(args.recipe, precision, args.batch_size, args.max_length)}
    if precision == "bf16":  # on a CPU that only emulates bf16 this loop would take minutes a step
        variants["plain bf16"] = plain_bf16_step(*shape)
    flops = matmul_flops(variants[csekit])
    print(f"matrix-product FLOPs a step: {flops / 1e9:.1f} G; at the bound a step takes {flops / bound / 1e9:.3f} s")
    for name, step in variants.items():
        seconds = seconds_per_step(step, args.warmup, args.steps)
        rate = flops / seconds / 1e9
        print(f"{name:<12} {seconds:.3f} s/step  {rate:5.0f} GFLOP/s  {rate / bound:.0%} of the bound")
    for name in variants:
        with profile(activities=[ProfilerActivity.CPU]) as profiler:
            for _ in range(3):
                variants[name]()
        print(f"\n{name}: operators by self CPU time over 3 steps")
        print(profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.table))


if __name__ == "__main__":
    main()

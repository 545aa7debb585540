"""Where a training step's time goes: a short summary of the loop's own step on a CPU or a GPU, in under a minute.

    python benchmarks/profile_step.py --device cuda --batch 64 --out profile-64.md
    python benchmarks/profile_step.py --device cuda --batch 512 --out profile-512.md --assets .gpu/assets
    python benchmarks/profile_step.py --device cpu --batch 16 --out profile-cpu.md --set run.sync_free=true

It sets up `csekit.training.trainer.Trainer` on the quickstart recipe (MiniLM, [CLS], max length 32; with
`--assets DIR`, a random BERT-base with DIR/tokenizer-bert and DIR/corpus.txt, as gpu_throughput.py) and
runs the loop's own step (`Trainer.step`, then what follows it) on its batches: `--warmup` steps, then
`--steps` timed steps, then 3 profiled steps. The summary (printed and written to `--out`):

- the step time (wall clock, the device synchronised after the timed steps only, as the loop runs);
- kernel launches per step (GPU kernels the profiler saw; on a CPU, operator calls) and host syncs per
  step: reads of a tensor's value on the host (`.item()`, `.tolist()`, `bool()`, `float()`, `int()` from
  Python) and, on a GPU, every synchronising CUDA call torch reports (`torch.cuda.set_sync_debug_mode`);
- the top 25 kernels by device time (on a CPU the operators by self time: the CPU runs the kernels) and
  the top 25 host operators by self CPU time.

`--set KEY=VALUE` overrides recipe keys (e.g. run.sync_free=true, run.compile=reduce-overhead, run.packed=true).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from step_tools import counting_syncs, random_bert_base  # benchmarks/ is on the path of a script run from it
from torch.profiler import ProfilerActivity, profile

from csekit.core.precision import resolve_precision

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))


def cpu_name() -> str:
    from csekit.core.precision import cpu_model_and_flags

    return cpu_model_and_flags()[0]


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
    from csekit.training.execution import build_run_model
    from csekit.training.optimization import make_optimizer
    from csekit.training.recipe import load_recipe

    recipe = load_recipe(recipe_path, [f"train.batch_size={batch_size}", f"model.max_length={max_length}"])
    data = recipe.data
    corpus = open_corpus(data.corpus, resolve_data_dir(None), data.max_chars, data.bad_lines, data.text_column)
    sentences = [corpus[i] for i in random.Random(0).sample(range(len(corpus)), batch_size)]  # a random batch
    encoder = SentenceEncoder.load(recipe.model.backbone, recipe.model.pooler)
    model, views = build_run_model(recipe, encoder)
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


def native_precision() -> str:
    """bf16 where this CPU runs it natively, else fp32 (what `precision: auto` picks)."""
    return resolve_precision("auto", "cpu")[0]


def trainer_for(args: argparse.Namespace, folder: Path) -> Any:
    """A Trainer on the quickstart recipe (or a random BERT-base from --assets) on `args.device`."""
    from csekit.training.processes import own_accelerator_state
    from csekit.training.recipe import load_recipe
    from csekit.training.trainer import Trainer

    overrides = [
        f"train.batch_size={args.batch}",
        f"model.max_length={args.max_length}",
        "model.pooler=cls",
        "train.max_steps=100000",
        "train.dev_task=none",
        "train.eval_every=0",
        "train.log_every=100000",
        f"train.precision={args.precision}",
    ]
    if args.assets is not None:
        model_dir = random_bert_base(args.assets, folder / "bert-base-random")
        overrides += [f"model.backbone={model_dir}", f"data.corpus={args.assets / 'corpus.txt'}"]
    recipe = load_recipe(args.recipe, [*overrides, *args.set])
    held = contextlib.ExitStack()
    held.enter_context(own_accelerator_state())
    trainer = Trainer(recipe, folder / "run", None, False, False, False, held)
    trainer._start_progress()
    trainer.model.train()
    return trainer, held


def summary(args: argparse.Namespace, trainer: Any, seconds: float, syncs: list[str], profiler: Any) -> str:
    """The markdown summary: step time, launches and syncs per step, the top kernels and host operators."""
    device = trainer.accelerator.device
    averages = profiler.key_averages()
    on_gpu = device.type == "cuda"
    kernels = [e for e in profiler.events() if on_gpu and e.device_type == torch.autograd.DeviceType.CUDA]
    launches = len(kernels) if on_gpu else sum(a.count for a in averages)
    name = torch.cuda.get_device_name(device) if on_gpu else cpu_name()
    recipe = trainer.recipe
    lines = [
        f"# csekit step profile: {recipe.model.backbone}, batch {args.batch}, max length {args.max_length}",
        "",
        f"- device: {name}; torch {torch.__version__}; precision {trainer.execution.precision}; "
        f"{torch.get_num_threads()} threads; load average {os.getloadavg()[0]:.1f}",
        f"- keys: {', '.join(args.set) or 'defaults'} (sync-free {'on' if trainer.execution.sync_free else 'off'}, "
        f"compile {recipe.run.compile})",
        f"- step time: {seconds * 1e3:.1f} ms ({args.batch / seconds:,.0f} sentences/s), mean of {args.steps} steps",
        f"- {'kernel launches' if on_gpu else 'operator calls'} per step: {launches / PROFILED_STEPS:.0f}",
        f"- host syncs per step: {len(syncs) / args.steps:.1f} "
        f"({', '.join(f'{n} {syncs.count(n) / args.steps:.1f}' for n in sorted(set(syncs))) or 'none'})",
        "",
    ]
    if on_gpu:
        lines += [f"## Top {args.table} kernels by device time ({PROFILED_STEPS} steps)", "", "```"]
        lines.append(averages.table(sort_by="device_time_total", row_limit=args.table, max_name_column_width=60))
    else:
        lines += [f"## Top {args.table} kernels: on a CPU, operators by self CPU time ({PROFILED_STEPS} steps)"]
        lines += ["", "```", averages.table(sort_by="self_cpu_time_total", row_limit=args.table)]
    lines += ["```", "", f"## Top {args.table} host operators by self CPU time ({PROFILED_STEPS} steps)", "", "```"]
    host = averages.table(sort_by="self_cpu_time_total", row_limit=args.table, max_name_column_width=60)
    return "\n".join([*lines, host, "```", ""])


PROFILED_STEPS = 3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--out", type=Path, help="write the summary here too (markdown)")
    parser.add_argument("--recipe", type=Path, default=REPO / "recipes" / "quickstart.yaml")
    parser.add_argument("--assets", type=Path, help="a random BERT-base from DIR/tokenizer-bert, DIR/corpus.txt")
    parser.add_argument("--max-length", type=int, default=32)
    parser.add_argument("--precision", default="auto", help="auto (bf16 where native, else fp32), fp32 or bf16")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5, help="timed steps")
    parser.add_argument("--table", type=int, default=25, help="rows of each table")
    parser.add_argument("--set", action="append", default=[], help="a recipe override KEY=VALUE (repeatable)")
    args = parser.parse_args()
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # accelerate takes the GPU when there is one
    elif not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here")
    with tempfile.TemporaryDirectory() as folder:
        trainer, held = trainer_for(args, Path(folder))
        with held:
            batches = trainer._batches()

            def step() -> None:
                trainer.step(next(batches))
                trainer._after_step()

            for _ in range(args.warmup):
                step()
            synchronize = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
            synchronize()
            with counting_syncs(trainer.accelerator.device) as syncs:
                started = time.perf_counter()
                for _ in range(args.steps):
                    step()
                synchronize()
                seconds = (time.perf_counter() - started) / args.steps
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device == "cuda" else [])
            with profile(activities=activities) as profiler:
                for _ in range(PROFILED_STEPS):
                    step()
                synchronize()
            text = summary(args, trainer, seconds, syncs, profiler)
    print(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()

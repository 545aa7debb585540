"""Operator calls of a training step with and without compute copies (`run.compute_copies`, issue 62 item 4).

    python benchmarks/compute_copies.py                          # minilm-l6, batch 64, bf16, on the CPU
    python benchmarks/compute_copies.py --device cuda --steps 20  # on a GPU: kernel launches too

It sets up csekit's own `Trainer` on the quickstart recipe (all-MiniLM-L6-v2, [CLS], max length 32) in bf16,
once with `run.compute_copies: false` and once with `true`, each in a fresh process (a process's first steps pay
one-time costs), and runs the loop's own step (`Trainer.step`, then what follows it): `--warmup` steps, `--steps`
timed steps, then `--profiled` steps under torch.profiler. It prints, per step:

- every operator call the profiler records, nested ones included (a multi-tensor call on a CPU is a loop of
  per-tensor calls; a CPU without native bf16 runs a batched bf16 product as one product a matrix);
- the operator calls no other operator made (Python and autograd made them; autocast's forward casts are made
  inside the product they feed, so they are not among them);
- the copies and casts (`aten::copy_`, `aten::_to_copy`, `aten::to`, autograd's `ToCopyBackward0`), the
  multi-tensor copies, and the `aten::copy_` calls outside them (on CUDA a multi-tensor copy is one kernel);
- the step time. Counts do not depend on the machine's load; times do, and a CPU without native bf16 emulates it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

REPO = Path(__file__).resolve().parents[1]
COUNTED = (
    "aten::copy_",
    "aten::_to_copy",
    "aten::to",
    "ToCopyBackward0",
    "aten::_foreach_copy_",
    "aten::_foreach_add_",
)
"""The operators shown by name: the copies and casts compute copies remove or add."""
MULTI_TENSOR = ("aten::_foreach_copy_", "aten::_foreach_add_")


@contextlib.contextmanager
def trainer(args: argparse.Namespace, copies: bool, folder: Path) -> Iterator[Any]:
    """The quickstart recipe's Trainer, in training mode, with `run.compute_copies` as given."""
    from csekit.training.processes import own_accelerator_state
    from csekit.training.recipe import load_recipe
    from csekit.training.trainer import Trainer

    overrides = [
        f"model.backbone={args.backbone}",
        f"train.batch_size={args.batch}",
        "train.max_steps=100000",
        "train.eval_every=0",
        "train.log_every=100000",
        "train.dev_task=none",
        "train.precision=bf16",
        "run.compile=none",
        f"run.compute_copies={str(copies).lower()}",
        *args.set,
    ]
    recipe = load_recipe(REPO / "recipes" / "quickstart.yaml", overrides)
    with contextlib.ExitStack() as held:
        held.enter_context(own_accelerator_state())
        run = Trainer(recipe, folder, None, False, False, False, held)
        run._start_progress()
        run.model.train()
        yield run


def outermost(event: Any) -> bool:
    """Whether a profiler event is an operator call that no other operator made (Python or autograd made it)."""
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("aten::"):
            return False
        parent = parent.cpu_parent
    return event.name.startswith("aten::")


def outside_multi_tensor_calls(event: Any) -> bool:
    """Whether a profiler event was not called by a multi-tensor operator."""
    parent = event.cpu_parent
    while parent is not None:
        if parent.name in MULTI_TENSOR:
            return False
        parent = parent.cpu_parent
    return True


def measure(args: argparse.Namespace, copies: bool, folder: Path) -> dict[str, float]:
    """Per step: operator calls (all, and by name), copies outside multi-tensor calls, launches, the step time."""
    on_gpu = args.device == "cuda"
    synchronize = torch.cuda.synchronize if on_gpu else (lambda: None)
    with trainer(args, copies, folder) as run:
        batches = run._batches()

        def step() -> None:
            run.step(next(batches))
            run._after_step()

        for _ in range(args.warmup):
            step()
        synchronize()
        started = time.perf_counter()
        for _ in range(args.steps):
            step()
        synchronize()
        seconds = (time.perf_counter() - started) / args.steps
        activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if on_gpu else [])]
        with profile(activities=activities) as profiler:
            for _ in range(args.profiled):
                step()
            synchronize()
        copied = len(run.copies.copies) if run.copies is not None else 0
    events = [event for event in profiler.events() if event.device_type == torch.autograd.DeviceType.CPU]
    names = Counter(event.name for event in events)
    kernels = [event for event in profiler.events() if event.device_type == torch.autograd.DeviceType.CUDA]
    single = sum(1 for event in events if event.name == "aten::copy_" and outside_multi_tensor_calls(event))
    figures = {name: names[name] / args.profiled for name in COUNTED}
    figures.update(
        calls=sum(names.values()) / args.profiled,
        outermost=sum(1 for event in events if outermost(event)) / args.profiled,
        single_copies=single / args.profiled,
        launches=len(kernels) / args.profiled,
        ms=seconds * 1e3,
        copied=copied,
    )
    return figures


def device_name(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name()
    from csekit.core.precision import cpu_has_native_bf16, cpu_model_and_flags

    native = "native bf16" if cpu_has_native_bf16() else "no native bf16: bf16 products emulated"
    return f"{cpu_model_and_flags()[0]} ({native}), {torch.get_num_threads()} threads, load {os.getloadavg()[0]:.1f}"


def report(args: argparse.Namespace, rows: dict[str, dict[str, float]]) -> str:
    """The figures as a markdown table, a column a variant."""
    lines = [
        f"# Compute copies: {args.backbone}, batch {args.batch}, bf16, per step ({args.profiled} profiled steps)",
        "",
        f"- device: {device_name(args.device)}; torch {torch.__version__}",
        f"- keys: run.compile=none{''.join(', ' + item for item in args.set)}",
        "",
        f"| per step | {' | '.join(rows)} |",
        f"|---|{'---|' * len(rows)}",
    ]
    labels = {
        "copied": "weights with a compute copy",
        "calls": "operator calls, all",
        "outermost": "operator calls from Python or autograd (`aten::`, made by no other operator)",
        **{name: f"`{name}`" for name in COUNTED},
        "single_copies": "`aten::copy_` outside multi-tensor calls",
    }
    if args.device == "cuda":
        labels["launches"] = "kernel launches"
    labels["ms"] = f"step time, ms (mean of {args.steps}; {'this GPU' if args.device == 'cuda' else 'loaded CPU'})"
    for key, label in labels.items():
        values = [row[key] for row in rows.values()]
        shown = [f"{value:,.1f}" if key == "ms" else f"{value:,.0f}" for value in values]
        lines.append(f"| {label} | {' | '.join(shown)} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--backbone", default="minilm-l6")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=1, help="steps before any is timed (AdamW's state is made)")
    parser.add_argument("--steps", type=int, default=2, help="timed steps")
    parser.add_argument("--profiled", type=int, default=2, help="steps under the profiler (counts: their mean)")
    parser.add_argument("--set", action="append", default=[], help="a recipe override KEY=VALUE (repeatable)")
    parser.add_argument("--out", type=Path, help="write the table here too (markdown)")
    parser.add_argument("--only", choices=["false", "true"], help=argparse.SUPPRESS)  # one variant's process
    args = parser.parse_args()
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # accelerate takes the GPU when there is one
    elif not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here")
    if args.only is not None:  # one variant, in this process: its figures as JSON
        with tempfile.TemporaryDirectory() as folder:
            print(json.dumps(measure(args, args.only == "true", Path(folder) / "run")))
        return
    rows = {}
    for only in ("false", "true"):
        command = [sys.executable, __file__, *sys.argv[1:], "--only", only]
        done = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=True)
        rows[f"run.compute_copies={only}"] = json.loads(done.stdout.strip().splitlines()[-1])
    text = report(args, rows)
    print(text)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()

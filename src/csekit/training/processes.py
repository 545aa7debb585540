"""Where training runs: one or several processes, CPU or GPU, and the precision that fits the device."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import sys
from collections.abc import Iterator

import torch
from accelerate.state import AcceleratorState, GradientState

from csekit.core.errors import CsekitError
from csekit.core.precision import choose_precision

MIXED_PRECISION = {"fp32": "no", "bf16": "bf16", "fp16": "fp16"}


def several_cpu_processes() -> bool:
    """Launched as several processes (torchrun, accelerate launch --multi_gpu) on a machine without a GPU.

    accelerate then needs `cpu=True` to use its multi-CPU (gloo) mode instead of running each process alone.
    """
    return not has_gpu() and int(os.environ.get("WORLD_SIZE", "1")) > 1


def has_gpu() -> bool:
    return torch.cuda.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available())


def hint_if_accelerate_started_one_process() -> None:
    """`accelerate launch --num_processes N` with no config starts ONE process when there is no GPU: say so.

    Its simple launcher (the one used then) sets ACCELERATE_USE_CPU and no WORLD_SIZE; its torchrun
    launcher sets WORLD_SIZE. The requested N is not passed on, so this is a hint, not an error.
    """
    if "ACCELERATE_USE_CPU" in os.environ and "WORLD_SIZE" not in os.environ and not has_gpu():
        print(
            "csekit: accelerate started a single process. For several processes on CPUs, launch with "
            "--config_file configs/accelerate-cpu.yaml (or --multi_gpu); see docs/performance.md",
            file=sys.stderr,
        )


@contextlib.contextmanager
def own_accelerator_state() -> Iterator[None]:
    """A training with accelerate state of its own, and the caller's state as it was afterwards.

    accelerate keeps the precision and the gradient-accumulation settings in process-wide singletons and
    refuses a second Accelerator with another precision, so a notebook or a sweep that trained once in
    bf16 could not train again in fp32. The process group (`PartialState`) is kept: it belongs to the
    launcher, not to one training.
    """
    kept = [(state, dict(state._shared_state)) for state in (AcceleratorState, GradientState)]
    for state, _ in kept:
        state._shared_state.clear()
    try:
        yield
    finally:
        for state, saved in kept:
            state._shared_state.clear()
            state._shared_state.update(saved)


GLIBC_M_TRIM_THRESHOLD, GLIBC_M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (malloc.h)


def keep_freed_memory(limit: int = 1 << 30) -> bool:
    """Ask glibc's malloc to keep freed blocks (up to `limit` bytes) for reuse, not return them to the OS.

    A training step allocates and frees the same large blocks every step (BERT's vocabulary gradient
    alone is 47 MB). glibc serves blocks above its mmap threshold (32 MB at most) with fresh mappings
    and unmaps them on free, so every step page-faults them in again: about 48,000 faults and 0.11
    CPU-seconds of kernel time a MiniLM bf16 step on this project's machine. PyTorch's CPU tuning guide
    gets the same by preloading jemalloc or tcmalloc. Process-wide; Linux with glibc only (False elsewhere).
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return False
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:
        return False
    return bool(mallopt(GLIBC_M_MMAP_THRESHOLD, limit)) and bool(mallopt(GLIBC_M_TRIM_THRESHOLD, limit))


def training_device_type() -> str:
    """The kind of device accelerate will train on; needed before the Accelerator, whose precision depends on it."""
    if os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true", "yes") or several_cpu_processes():
        return "cpu"
    if torch.cuda.is_available():
        return "cuda"
    return "xpu" if has_gpu() else "cpu"


def training_precision(requested: str) -> tuple[str, list[str]]:
    """The recipe's precision for this machine (auto: bf16 where native, else fp32) and the line that says so.

    A run decides it once, in `csekit.training.execution.start_execution`, for its Accelerator and its Execution
    both. The line is printed once every input has been checked, so that an input error stays one line.
    """
    device = training_device_type()
    if requested == "fp16" and device == "cpu":
        raise CsekitError("recipe key train.precision: fp16 needs a GPU; use auto, bf16 or fp32 on the CPU")
    said: list[str] = []
    return choose_precision(requested, device, "train.precision", say=said.append), said

"""How training batches reach the device: on a GPU, made ahead in worker processes, pinned, copied without a wait.

A batch is collated on the CPU (tokenised, padded, its `PackingLayout` made) and then copied to the device.
With the DataLoader's defaults both happen on the main thread between steps: accelerate copies each tensor
with `non_blocking=False` from pageable memory, which waits for the device to finish the step queued before
it, and only then collates the next batch while the device idles. On a CUDA device csekit therefore

- pins each batch (`pin_memory`) and lets accelerate copy it with `non_blocking=True`: a copy from pinned
  memory is queued behind the step's work instead of waiting for it;
- with `run.num_workers: auto`, collates in `AUTO_WORKERS` persistent worker processes, so that the
  next batches are ready when the step is queued.

On a CPU the batch is already where the model is, and nothing changes (`auto`: no worker processes, no
pinning). The batches are the same either way: the views draw from per-batch generators, not from a
process's own random state.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from accelerate import Accelerator

AUTO_WORKERS = 2
"""Worker processes `run.num_workers: auto` starts per training process on a CUDA device (fewer where the
machine has fewer CPU cores to spare): batch 512 took 46-64 ms to collate on one core, about a step's time."""


@dataclass(frozen=True)
class LoaderOptions:
    """The DataLoader's and accelerate's settings for the training batches on one device."""

    num_workers: int
    pin_memory: bool
    persistent_workers: bool
    non_blocking: bool


def available_cores() -> int:
    """The CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def loader_options(num_workers: int | str, device: torch.device, cores: int | None = None) -> LoaderOptions:
    """The loader settings for `run.num_workers` (a count, or auto) on `device` (see the module's docstring)."""
    on_gpu = device.type == "cuda"
    if num_workers == "auto":
        spare = (available_cores() if cores is None else cores) - 1  # one core runs the training loop
        workers = max(0, min(AUTO_WORKERS, spare)) if on_gpu else 0
    else:
        workers = int(num_workers)
    return LoaderOptions(workers, pin_memory=on_gpu, persistent_workers=on_gpu and workers > 0, non_blocking=on_gpu)


def skipping_batches(accelerator: Accelerator, loader: Any, skip: int, options: LoaderOptions) -> Iterable[Any]:
    """`loader` from its batch `skip` on (a resumed run's first epoch), its copies as `options` say.

    accelerate's `skip_first_batches` builds a new loader that keeps the pinning and the workers but copies
    with `non_blocking=False` (accelerate 1.15), so on a GPU the rest of that epoch would wait at every copy.
    """
    skipped = accelerator.skip_first_batches(loader, skip)
    if hasattr(skipped, "_non_blocking"):
        skipped._non_blocking = options.non_blocking
    return skipped

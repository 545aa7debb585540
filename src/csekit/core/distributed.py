"""Gathering embeddings across processes so every anchor sees every process's negatives.

`gather_with_grad` uses `torch.distributed.nn.functional.all_gather`, whose backward sums the
gradients that all processes send to each slice. Each process then back-propagates the full gradient
of sum_q L_q (every process's loss) through its own slice; DDP averages the parameter gradients over
the P processes. With L_q the mean over process q's n anchors, the result is (1/P) sum_q L_q = the
mean over all nP anchors: exactly the one-process gradient on the same global batch.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor


def world() -> tuple[int, int]:
    """(rank, world size) of this process; (0, 1) when not distributed."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def gather_with_grad(tensor: Tensor) -> Tensor:
    """Concatenate `tensor` from all processes along dim 0, keeping gradients for every slice."""
    _, size = world()
    if size == 1:
        return tensor
    from torch.distributed.nn.functional import all_gather

    return torch.cat(all_gather(tensor.contiguous()), dim=0)


def gather_no_grad(tensor: Tensor) -> Tensor:
    """Concatenate `tensor` from all processes along dim 0, as constants."""
    _, size = world()
    if size == 1:
        return tensor
    parts = [torch.empty_like(tensor) for _ in range(size)]
    dist.all_gather(parts, tensor.contiguous())
    return torch.cat(parts, dim=0)

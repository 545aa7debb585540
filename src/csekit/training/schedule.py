"""The learning-rate schedule: its shape (`train.schedule`), its length (`train.schedule_steps`) and its warm-up.

`linear` is transformers' `get_linear_schedule_with_warmup` (SimCSE's and the HF Trainer's default): the rate rises
over the warm-up, then falls linearly to 0 at the schedule's last step. `constant` is transformers'
`get_constant_schedule_with_warmup` (sentence-transformers' `constantlr` without a warm-up, TSDAE's guide). The
schedule's length is the run's unless `train.schedule_steps` sets a longer one: LLM2Vec's runs stop at 1,000 steps
(`stop_after_n_steps`) of the HF Trainer's schedule over 3 epochs (23,439 steps of batch 128 on the million
Wikipedia sentences), so their rate falls from 3e-5 only to 2.87e-5. The warm-up is `train.warmup_ratio` of the
schedule's length, as the HF Trainer takes it of the steps it schedules.

The loop steps the host's scheduler; sync-free steps (`csekit.training.sync_free`) evaluate the same factor on the
device (`device_factor`), which reproduces the host's values exactly in float64.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.optim.lr_scheduler import LambdaLR

from csekit.core.errors import CsekitError

SCHEDULES = ("linear", "constant")
"""`train.schedule` choices."""


def linear_schedule_factor(step: Tensor, warmup_steps: int, total_steps: int) -> Tensor:
    """transformers' `get_linear_schedule_with_warmup` factor at `step`, on the device (float64: the same values)."""
    warming = step / max(1, warmup_steps)
    decaying = torch.clamp((total_steps - step) / max(1, total_steps - warmup_steps), min=0.0)
    return torch.where(step < warmup_steps, warming, decaying)


def constant_schedule_factor(step: Tensor, warmup_steps: int) -> Tensor:
    """transformers' `get_constant_schedule_with_warmup` factor at `step`, on the device."""
    return torch.where(step < warmup_steps, step / max(1, warmup_steps), torch.ones_like(step))


def _linear_factor(step: int, *, warmup_steps: int, total_steps: int) -> float:
    """transformers' `_get_linear_schedule_with_warmup_lr_lambda`, as written there."""
    if step < warmup_steps:
        return float(step) / float(max(1, warmup_steps))
    return max(0.0, float(total_steps - step) / float(max(1, total_steps - warmup_steps)))


def _constant_factor(step: int, *, warmup_steps: int) -> float:
    """transformers' `_get_constant_schedule_with_warmup_lr_lambda`, as written there."""
    if step < warmup_steps:
        return float(step) / float(max(1.0, warmup_steps))
    return 1.0


def check_schedule_length(train: Any, run_steps: int) -> int:
    """`run_steps` (the run's length), once `train.schedule_steps` is known not to end before it (a one-line error:
    the rate would be 0 for the rest of the run)."""
    length = train.schedule_steps
    if length is not None and length < run_steps:
        raise CsekitError(
            f"recipe key train.schedule_steps: {length:,} ends before the run's {run_steps:,} steps (train.max_steps "
            f"or train.epochs), so the last {run_steps - length:,} would train at a rate of 0; set it to at least "
            f"{run_steps:,}, or null for the run's length"
        )
    return run_steps


@dataclass(frozen=True)
class Schedule:
    """A run's schedule: its shape, warm-up and length in steps, and the run's own length."""

    kind: str  # linear | constant (SCHEDULES)
    warmup_steps: int
    length: int  # the schedule's steps (train.schedule_steps, else the run's)
    run_steps: int  # the steps the run takes (train.max_steps, else its epochs)

    @classmethod
    def of(cls, train: Any, run_steps: int) -> Schedule:
        """The schedule `train` (a recipe's `train` section) gives a run of `run_steps` steps."""
        if train.schedule not in SCHEDULES:
            raise CsekitError(
                f"recipe key train.schedule must be one of {', '.join(SCHEDULES)}, not {train.schedule!r}"
            )
        check_schedule_length(train, run_steps)
        length = train.schedule_steps or run_steps
        return cls(train.schedule, math.ceil(train.warmup_ratio * length), length, run_steps)

    def scheduler(self, optimizer: torch.optim.Optimizer) -> LambdaLR:
        """The host's scheduler over `optimizer`: transformers' `get_linear_schedule_with_warmup` or
        `get_constant_schedule_with_warmup`, the same factors and state (a `functools.partial`, so checkpoints of
        either load in the other; tests/unit/training/test_schedule.py compares them). Not imported from there:
        `transformers.optimization` imports peft, about 1.5 s of CPU of every `csekit train` start, LoRA or not."""
        if self.kind == "constant":
            factor = functools.partial(_constant_factor, warmup_steps=self.warmup_steps)
        else:
            factor = functools.partial(_linear_factor, warmup_steps=self.warmup_steps, total_steps=self.length)
        return LambdaLR(optimizer, factor)

    def device_factor(self, step: Tensor) -> Tensor:
        """The factor of the base rates after `step` steps, computed on `step`'s device (sync-free steps)."""
        if self.kind == "constant":
            return constant_schedule_factor(step, self.warmup_steps)
        return linear_schedule_factor(step, self.warmup_steps, self.length)


__all__ = [
    "SCHEDULES",
    "Schedule",
    "check_schedule_length",
    "constant_schedule_factor",
    "linear_schedule_factor",
]

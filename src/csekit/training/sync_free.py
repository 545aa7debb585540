"""Steps that never wait for the device (`run.sync_free`): skipping, counting and logging done on the device.

On a GPU, reading a step's value on the host (`.item()`, `.tolist()`, `bool(tensor)`) waits until the
device has finished all the work queued before it, so the host cannot queue the next step while this
one runs. The plain loop reads twice a step: the all-reduced loss (for the log, and to skip a NaN step)
and the gradient norm (to skip a non-finite gradient). A sync-free step instead

- decides on the device whether it is finite: the loss all-reduced over the processes (a NaN on any one
  makes the mean NaN) and the norm of the all-reduced gradients (the same on every process), so every
  process skips the same steps;
- hands that flag to torch's fused AdamW as `found_inf`, as `GradScaler` does: a flagged step changes no
  weight, no moment and no step count;
- takes the learning rate from the run's schedule (`csekit.training.schedule`: linear or constant) evaluated on the
  device at the count of steps taken, so that a skipped step does not advance the schedule (the plain loop does
  not step its scheduler then);
- sums the logged values and counts skipped steps (and the longest run of them) on the device.

The loop reads all of it in one copy (`read_on_host`) at its read points (log, evaluation, the run's end),
where it learns the true step count, writes the records and checks `train.max_bad_steps`. The weights
are those of the plain loop, bit for bit (tests/runs/test_sync_free.py). `SyncFreeSteps` is the loop's step runner
(`csekit.training.step_runner`: the trainer takes every step through one); `SyncFreeDevice` its device side.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor
from torch.optim.lr_scheduler import LambdaLR

from csekit.core.errors import CsekitError
from csekit.training.schedule import Schedule, linear_schedule_factor
from csekit.training.step_runner import StepLoop, read_on_host

__all__ = [
    "Reading",
    "SyncFreeDevice",
    "SyncFreeSteps",
    "linear_schedule_factor",
    "set_schedule_step",
    "use_sync_free",
]


def use_sync_free(setting: str, precision: str, optimizer: str, auto: bool) -> bool:
    """Whether the run's steps are sync-free: the recipe's `run.sync_free` for this precision and optimizer (`auto`:
    what `auto` means on this device, decided in `csekit.training.execution`).

    fp16 keeps the plain loop (its loss scaler reads the scale on the host each step), and so does the
    uncorrected AdamW (torch's fused AdamW is what takes `found_inf` and a learning rate on the device).
    """
    setting = setting.lower()
    supported = precision != "fp16" and optimizer == "adamw"
    if setting == "true" and not supported:
        needs = "train.precision fp32 or bf16" if precision == "fp16" else "train.optimizer adamw"
        raise CsekitError(f"recipe key run.sync_free: true needs {needs}; set it to auto or false")
    if setting == "auto":
        return supported and auto
    return setting == "true"


def set_schedule_step(scheduler: LambdaLR, step: int) -> None:
    """Put `scheduler` where stepping it `step` times from the start leaves it (its lrs in the optimizer too)."""
    scheduler.last_epoch = step
    scheduler._step_count = step + 1
    lrs = [base * schedule(step) for schedule, base in zip(scheduler.lr_lambdas, scheduler.base_lrs, strict=True)]
    for group, lr in zip(scheduler.optimizer.param_groups, lrs, strict=True):
        group["lr"] = lr
    scheduler._last_lr = lrs


@dataclass
class Reading:
    """What the device counted since the previous read."""

    steps_taken: int  # optimizer steps of the run so far (the true step)
    good_steps: int  # steps taken in this window
    skipped: int  # steps skipped in this window
    skipped_for_the_loss: int  # of those, the ones whose loss was not finite (the others: the gradient)
    bad_in_a_row: int  # skipped steps in a row at the read
    longest_bad_run: int  # the longest run of skipped steps in the window (with those before it)
    last_loss: float | None  # the loss of the window's last step taken
    sums: dict[str, float] = field(default_factory=dict)  # logged values summed over the steps taken

    @property
    def reason(self) -> str:
        if self.skipped_for_the_loss == self.skipped:
            return "loss"
        return "gradient" if self.skipped_for_the_loss == 0 else "loss and gradient"


class SyncFreeDevice:
    """The device side of sync-free steps: the learning rate, the skip decision and the window's sums and counts.

    `optimizer` is torch's fused AdamW (or accelerate's wrapper of it); `base_lrs` the schedule's base rates
    of its groups, `schedule` the run's (its shape, warm-up and length); `step` the run's step (on resume).
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        base_lrs: Sequence[float],
        schedule: Schedule,
        step: int,
        device: torch.device,
    ) -> None:
        self.optimizer = optimizer
        self.torch_optimizer: torch.optim.Optimizer = getattr(optimizer, "optimizer", optimizer)
        if not self.torch_optimizer.defaults.get("fused"):
            raise ValueError("sync-free steps need torch's fused AdamW (it takes found_inf and a tensor lr)")
        # float64 reproduces the host schedule's values exactly; CUDA's fused kernel reads a float32 lr.
        lr_dtype = torch.float32 if device.type == "cuda" else torch.float64
        self.base_lrs = torch.tensor(list(base_lrs), dtype=torch.float64, device=device)
        self.lr_dtype = lr_dtype
        self.schedule = schedule
        self.steps_taken = torch.tensor(float(step), dtype=torch.float64, device=device)
        self.bad_in_a_row = torch.zeros((), dtype=torch.float64, device=device)
        self.device = device
        self._new_window()

    def _new_window(self) -> None:
        # good steps, skipped steps, skipped for the loss, longest run of skipped steps
        self.counters = torch.zeros(4, dtype=torch.float64, device=self.device)
        self.sums: dict[tuple[str, ...], Tensor] = {}  # by the step's names (parts may differ between steps)
        self.last_loss: Tensor | None = None

    def step(self, names: Sequence[str], values: Tensor, grad_norm: Tensor) -> None:
        """AdamW's step unless the loss (`values[0]`, all-reduced) or the gradient norm is not finite; counted.

        `values` are the step's logged values (loss and parts, averaged over processes) in the order of `names`.
        """
        values = values.detach().double()
        loss_finite = torch.isfinite(values[0])
        good = loss_finite & torch.isfinite(torch.as_tensor(grad_norm, device=self.device))
        lrs = self.base_lrs * self.schedule.device_factor(self.steps_taken)
        with self._update_only_if(good, lrs.to(self.lr_dtype)):
            self.optimizer.step()
        taken = good.double()
        self.steps_taken += taken
        self.bad_in_a_row = (self.bad_in_a_row + 1.0) * (1.0 - taken)
        counted = torch.stack([taken, 1.0 - taken, (~loss_finite).double(), self.bad_in_a_row])
        self.counters = torch.cat([self.counters[:3] + counted[:3], torch.maximum(self.counters[3:], counted[3:])])
        key = tuple(names)
        masked = torch.where(good, values, 0.0)
        self.sums[key] = self.sums[key] + masked if key in self.sums else masked
        self.last_loss = values[0] if self.last_loss is None else torch.where(good, values[0], self.last_loss)

    @contextlib.contextmanager
    def _update_only_if(self, good: Tensor, lrs: Tensor) -> Iterator[None]:
        """During the block, the fused AdamW skips its update unless `good` and uses the device's `lrs`."""
        optimizer = self.torch_optimizer
        groups = optimizer.param_groups
        host_lrs = [group["lr"] for group in groups]
        for group, lr in zip(groups, lrs.unbind(), strict=True):
            group["lr"] = lr
        # The attributes GradScaler sets for optimizers that take them (torch.optim.Adam(W).step reads them).
        optimizer.grad_scale, optimizer.found_inf = None, (~good).float()  # type: ignore[attr-defined]
        try:
            yield
        finally:
            del optimizer.grad_scale, optimizer.found_inf  # type: ignore[attr-defined]
            for group, lr in zip(groups, host_lrs, strict=True):
                group["lr"] = lr

    def read(self) -> Reading:
        """Everything counted since the last read, in one copy to the host; the window starts again."""
        keys = list(self.sums)
        last = self.last_loss.reshape(1) if self.last_loss is not None else self.counters[:0]
        flat = torch.cat(
            [self.steps_taken.reshape(1), self.counters, self.bad_in_a_row.reshape(1), last, *self.sums.values()]
        )
        host = read_on_host(flat)
        steps_taken, good, skipped, for_loss, longest, in_a_row = (int(value) for value in host[:6])
        position = 6 + len(last)
        sums: dict[str, float] = {}
        for key in keys:
            for name, value in zip(key, host[position : position + len(key)], strict=True):
                sums[name] = sums.get(name, 0.0) + value
            position += len(key)
        reading = Reading(steps_taken, good, skipped, for_loss, in_a_row, longest, host[6] if len(last) else None, sums)
        self._new_window()  # a run of skipped steps goes on across reads in `bad_in_a_row`
        return reading


class SyncFreeSteps:
    """Sync-free steps as the loop takes them (`csekit.training.step_runner.StepRunner`): each step is taken as done
    until the next read, at a step where a log point, an evaluation or the run's end may be due, says otherwise."""

    def __init__(self, loop: StepLoop) -> None:
        self.loop = loop
        base_lrs = loop.scheduler.base_lrs
        self.on_device = SyncFreeDevice(loop.optimizer, base_lrs, loop.schedule, loop.state.step, loop.device)
        self.read_step = loop.state.step  # the step the latest read found

    def apply(self, names: Sequence[str], values: Tensor, grad_norm: Tensor) -> bool:
        """The device decides and counts a skip; the step counts as taken until the next read: True."""
        loop = self.loop
        self.on_device.step(names, values, grad_norm)
        loop.optimizer.zero_grad(set_to_none=True)
        loop.state.step += 1  # as if taken; the next read corrects it for skipped steps
        loop.progress.bar.update(1)
        return True

    def settle(self) -> bool:
        """At a step where a read may be due, read: the step count is corrected for skipped steps, and nothing is due
        unless some step was taken since the previous read."""
        if not self._read_due():
            return False
        before = self.read_step
        self.catch_up()
        return self.loop.state.step != before

    def _read_due(self) -> bool:
        """Whether a log record, an evaluation or the run's end may be due at this step."""
        loop = self.loop
        step, eval_every = loop.state.step, loop.config.eval_every
        return (
            step % loop.config.log_every == 0 or (eval_every > 0 and step % eval_every == 0) or step >= loop.total_steps
        )

    def catch_up(self) -> None:
        """Read what the steps since the last read counted: the true step, skips and logged sums.

        Skipped steps get one record a read; `train.max_bad_steps` is checked here, so a run of bad steps
        stops at the first read after it reaches the limit.
        """
        loop, state = self.loop, self.loop.state
        reading = self.on_device.read()
        loop.progress.bar.update(reading.steps_taken - state.step)
        state.step = self.read_step = reading.steps_taken
        set_schedule_step(loop.scheduler, state.step)
        loop.progress.add_sums(reading.sums, reading.good_steps, reading.last_loss)
        if reading.skipped:
            state.skipped_steps += reading.skipped
            loop.record_skips(reading.reason, skipped_since_last_read=reading.skipped)
        loop.stop_after_bad_steps(reading.longest_bad_run, reading.reason)

    def interrupt_check_due(self) -> bool:
        """Every step on one process; on several, at each log point (the question is an all-reduce read on the host)."""
        return self.loop.processes == 1 or self.loop.state.step % self.loop.config.log_every == 0

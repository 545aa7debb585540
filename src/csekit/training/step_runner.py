"""How the loop applies a step's gradients and learns its outcome: plain steps, read on the host every step.

Every step runs the same way in the trainer: forward and backward (`optimization.forward_backward`), one
all-reduce of the loss and its parts, then the run's `StepRunner`:

- `apply` takes the optimizer step, unless the loss or the gradient is not finite;
- `settle`, after a step, brings the host's step count up to date where a read is due, and says whether a log
  point, an evaluation or the run's end may be due now;
- `catch_up` reads what is still unread, before an interrupt's checkpoint and at the run's end;
- `interrupt_check_due` says whether to ask every process about Ctrl-C after this step.

`Execution.step_runner` chooses it once from `run.sync_free` (`csekit.training.execution`), so the trainer never
asks which one it has: `PlainSteps` here, or `SyncFreeSteps` (`csekit.training.sync_free`), which decides on the
device and reads at the log points only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor

from csekit.core.errors import CsekitError
from csekit.training.progress_log import ProgressLog
from csekit.training.recipe import TrainConfig
from csekit.training.run_folder import MetricsLog, TrainerState
from csekit.training.schedule import Schedule

__all__ = ["PlainSteps", "StepLoop", "StepRunner", "read_on_host"]


def read_on_host(tensor: Tensor) -> list[float]:
    """The training loop's one copy of step values from the device to the host (on a GPU: a wait).

    Every read of the loop's step values goes through here, so tests can count them.
    """
    return tensor.tolist()


@dataclass
class StepLoop:
    """What a step runner works with and updates: the loop's optimizer and schedule, position, progress and records."""

    optimizer: torch.optim.Optimizer
    scheduler: Any  # torch's LambdaLR, as accelerate wraps it
    schedule: Schedule
    state: TrainerState
    progress: ProgressLog
    metrics: MetricsLog
    config: TrainConfig
    total_steps: int
    processes: int
    device: torch.device
    best_dir: Path  # named when too many non-finite steps in a row stop the run

    def record_skips(self, reason: str, **extra: int) -> None:
        """The `non_finite_step` record of skipped steps (`state.skipped_steps` already counts them)."""
        state = self.state
        record = {
            "step": state.step,
            "event": "non_finite_step",
            "reason": reason,
            "skipped_steps": state.skipped_steps,
        }
        self.metrics.write({**record, **extra})

    def stop_after_bad_steps(self, in_a_row: int, reason: str) -> None:
        """Stop the run (one line) once `in_a_row` non-finite steps reach `train.max_bad_steps`."""
        if in_a_row >= self.config.max_bad_steps:
            raise CsekitError(
                f"{in_a_row} steps in a row had a non-finite {reason} (after step {self.state.step}); stopped. The "
                f"best model in {self.best_dir} is intact; try a lower train.lr"
            )


class StepRunner(Protocol):
    """The loop's one way to take a step and learn its outcome (see the module's docstring)."""

    def apply(self, names: Sequence[str], values: Tensor, grad_norm: Tensor) -> bool:
        """The optimizer step on the gradients of the backward just run; False when it is known to be skipped.

        `values` are the step's loss and parts (the loss first, named by `names`), averaged over the processes.
        """
        ...

    def settle(self) -> bool:
        """After a step `apply` took: whether the step count is known and a log point or evaluation may be due."""
        ...

    def catch_up(self) -> None:
        """Bring the step count, the records and the logged sums up to date (before a checkpoint, at the end)."""
        ...

    def interrupt_check_due(self) -> bool:
        """Whether to ask every process about Ctrl-C after this step."""
        ...


class PlainSteps:
    """Each step's loss and gradient norm read on the host: a non-finite one is skipped there, and counted."""

    def __init__(self, loop: StepLoop) -> None:
        self.loop = loop
        self.bad_in_a_row = 0

    def apply(self, names: Sequence[str], values: Tensor, grad_norm: Tensor) -> bool:
        loop = self.loop
        host = read_on_host(values)
        loss_finite = math.isfinite(host[0])
        if not (loss_finite and math.isfinite(read_on_host(torch.as_tensor(grad_norm).reshape(1))[0])):
            self._skip("loss" if not loss_finite else "gradient")
            return False
        loop.optimizer.step()
        loop.scheduler.step()
        loop.optimizer.zero_grad(set_to_none=True)
        self.bad_in_a_row = 0
        loop.state.step += 1
        loop.progress.bar.update(1)
        loop.progress.add_step(names, host)
        return True

    def _skip(self, reason: str) -> None:
        """Drop the step's gradients and record it; too many in a row stop the run."""
        self.loop.optimizer.zero_grad(set_to_none=True)
        self.loop.state.skipped_steps += 1
        self.bad_in_a_row += 1
        self.loop.record_skips(reason)
        self.loop.stop_after_bad_steps(self.bad_in_a_row, reason)

    def settle(self) -> bool:
        return True  # every step was read as it was taken

    def catch_up(self) -> None:
        """Nothing is left unread."""

    def interrupt_check_due(self) -> bool:
        return True

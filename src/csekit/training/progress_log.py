"""What a run shows while it trains: a progress bar on a terminal, plain lines in a log file, and the
logging window (the loss sums since the last metrics record, and the throughput over it).

The trainer adds each step's losses (or, sync-free, the sums a device read returns) and asks for a record
at each log point; the record goes to `metrics.jsonl` and the trackers, and its summary to the bar or a line.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from tqdm.auto import tqdm

from csekit.core.numbers import format_loss
from csekit.parts.hooks import StartsLater


class ProgressLog:
    """The bar (or plain lines when stderr is a file) and the window of losses since the last record."""

    def __init__(self, total_steps: int, first_step: int, visible: bool, metric: str) -> None:
        self.total_steps, self.metric = total_steps, metric
        self.plain_lines = visible and not sys.stderr.isatty()
        self.bar = tqdm(
            total=total_steps,
            initial=first_step,
            desc="training",
            unit="step",
            disable=not visible or self.plain_lines,
            dynamic_ncols=True,
        )
        self.last_loss: float | None = None
        self.last_score: float | None = None  # the latest dev score, shown in the progress bar
        self.score_step: int | None = None  # the step that score was measured at
        self.window: dict[str, float] = {}  # loss sums since the last log record
        self.window_steps, self.window_start = 0, time.perf_counter()
        self.run_started, self.run_first_step = time.perf_counter(), first_step  # for the time left

    def add_step(self, names: Sequence[str], values: Sequence[float]) -> None:
        """One good step's loss and parts (the loss first)."""
        self.last_loss = values[0]
        for name, value in zip(names, values, strict=True):
            self.window[name] = self.window.get(name, 0.0) + value
        self.window_steps += 1

    def add_sums(self, sums: Mapping[str, float], good_steps: int, last_loss: float | None) -> None:
        """The sums of `good_steps` steps, as a sync-free read returns them."""
        for name, total in sums.items():
            self.window[name] = self.window.get(name, 0.0) + total
        self.window_steps += good_steps
        if last_loss is not None:
            self.last_loss = last_loss

    def record(self, step: int, lr: float, batch_size: int) -> dict[str, Any]:
        """The metrics record at `step`: the mean loss and parts since the last one, the lr and the throughput."""
        elapsed = time.perf_counter() - self.window_start
        return {
            "step": step,
            **{name: total / self.window_steps for name, total in self.window.items()},
            "lr": lr,
            "sentences_per_second": self.window_steps * batch_size / max(elapsed, 1e-9),
        }

    def show(self, record: dict[str, Any]) -> None:
        """Show a record (the bar's postfix, or a plain line) and start the next window."""
        self.bar.set_postfix_str(self._postfix())
        if self.plain_lines:
            elapsed, steps = time.perf_counter() - self.run_started, record["step"] - self.run_first_step
            dev = self._dev_text()
            line = _progress_line(record, self.total_steps, dev, elapsed, steps)
            print(line, file=sys.stderr, flush=True)
        self.window, self.window_steps = {}, 0
        self.restart_window()

    def show_score(self, score: float | None, step: int) -> None:
        """The latest dev score of the selection metric, measured at `step`, shown from now on; the starting
        model's (step 0) gets a line of its own in a log file, since no step's line would show it."""
        self.last_score, self.score_step = score, step
        self.bar.set_postfix_str(self._postfix())
        if self.plain_lines and step == 0 and score is not None:
            shown = f"{self.metric} {100 * score:.2f}"
            print(f"step 0/{self.total_steps} {shown} (the starting model, before any step)", file=sys.stderr)

    def _dev_text(self) -> str:
        """`METRIC 79.20 @ step 25`: the latest dev score and the step it was measured at (empty before one)."""
        if self.last_score is None:
            return ""
        return f"{self.metric} {100 * self.last_score:.2f} @ step {self.score_step}"

    def _postfix(self) -> str:
        loss = f"loss={format_loss(self.last_loss)}" if self.last_loss is not None else ""
        return f"{loss} {self._dev_text()}".strip()

    def restart_window(self) -> None:
        """Start the window's clock again (after an evaluation, whose time is no training throughput)."""
        self.window_start = time.perf_counter()


def never_active_warnings(named_parts: list[tuple[str, object]], steps_per_epoch: int, total_steps: int) -> list[str]:
    """A warning for each part that starts later (`StartsLater`) than the run's last step: it would never train."""
    warnings = []
    for name, part in named_parts:
        if not isinstance(part, StartsLater):
            continue
        first = part.first_active_step(steps_per_epoch)
        if first >= total_steps:
            warnings.append(
                f"csekit: warning: {name} switches on after {first:,} steps ({steps_per_epoch:,} steps an epoch), "
                f"but this run has {total_steps:,}: it never trains; give train.max_steps above {first:,}"
            )
    return warnings


def _progress_line(record: dict[str, Any], total_steps: int, dev: str, elapsed: float, steps_run: int) -> str:
    """A plain progress line for logs written to a file: step, loss, `dev` (the latest dev score of the selection
    metric, named, with its step), throughput, the time this process has trained and the time left at its pace so
    far (`steps_run` steps in `elapsed` seconds, evaluations included)."""
    dev = f" {dev}" if dev else ""
    left = elapsed / steps_run * (total_steps - record["step"]) if steps_run > 0 else 0.0
    return (
        f"step {record['step']}/{total_steps} loss {format_loss(record['loss'])}{dev} "
        f"{record['sentences_per_second']:.1f} sent/s, {_clock(elapsed)} elapsed, {_clock(left)} left"
    )


def _clock(seconds: float) -> str:
    """`m:ss`, or `h:mm:ss` from an hour on (tqdm's way)."""
    minutes, second = divmod(round(seconds), 60)
    hours, minute = divmod(minutes, 60)
    return f"{hours}:{minute:02d}:{second:02d}" if hours else f"{minute}:{second:02d}"

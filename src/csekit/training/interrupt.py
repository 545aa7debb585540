"""Stopping a run cleanly: Ctrl-C or SIGTERM asks the loop to stop after the step it is taking.

The trainer checkpoints that step and raises `TrainingInterrupted`, whose `resume_command` is the command that
continues the run; the CLI prints it and exits with 128 + the signal's number.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM stopped the run after a step; the checkpoint holds that step, so `--resume` continues.

    A KeyboardInterrupt, so that code which catches `Exception` does not swallow the user's Ctrl-C.
    `signal_number` is the signal that asked to stop (the CLI exits with 128 + it: 130, or 143 for SIGTERM).
    """

    def __init__(self, step: int, output_dir: Path, signal_number: int = signal.SIGINT) -> None:
        super().__init__(f"interrupted at step {step}; the checkpoint in {output_dir} holds it")
        self.step = step
        self.output_dir = output_dir
        self.signal_number = int(signal_number)

    def resume_command(self, data_dir: str | Path | None = None) -> str:
        """The command that continues the run (from its saved recipe), with as many processes as it ran."""
        return resume_command(self.output_dir, running_processes(), data_dir)


def running_processes() -> int:
    """How many processes this run has: WORLD_SIZE, which `accelerate launch` and torchrun set (else one)."""
    value = os.environ.get("WORLD_SIZE", "1")
    return int(value) if value.isdigit() and int(value) >= 1 else 1


def resume_command(output_dir: str | Path, processes: int, data_dir: str | Path | None = None) -> str:
    """The command that continues the run in `output_dir` with `processes` processes: a run of several must be
    launched as it was (a resume in one process trained on with other batches); a shell comment names the launcher
    options csekit cannot know (the accelerate config file)."""
    command = ["train", "--output", str(output_dir), "--resume"]
    if data_dir is not None:
        command += ["--data-dir", str(data_dir)]
    if processes <= 1:
        return shlex.join(["csekit", *command])
    launch = ["accelerate", "launch", "--num_processes", str(processes), "-m", "csekit.cli", *command]
    return shlex.join(launch) + "  # with the --config_file the run was launched with"


def loader_workers_leave_stop_signals(worker_id: int) -> None:
    """A DataLoader worker's start (`worker_init_fn`): it ignores SIGINT and SIGTERM, the training process's to act on.

    A terminal's Ctrl-C and `timeout` signal the whole process group. PyTorch's workers die of a SIGTERM that
    does not come from their parent, and the training process's SIGCHLD handler then raises "DataLoader
    worker ... killed by signal" wherever it is, the checkpoint of the step included. Ignoring it, a worker
    goes on serving batches until the training process has checkpointed and shuts its loader down (it exits
    on its own if that process dies).
    """
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, signal.SIG_IGN)


@dataclass
class StopRequest:
    """Whether a signal asked the run to stop, and which (the loop reads it between steps)."""

    requested: bool = False
    signal_number: int = signal.SIGINT


@contextlib.contextmanager
def ctrl_c_stops_after_the_step() -> Iterator[StopRequest]:
    """While the loop runs, Ctrl-C (SIGINT) or SIGTERM asks it to stop after the step; a second stops at once.

    SIGTERM is what schedulers, `timeout`, Docker and systemd send before they kill: it is treated as
    Ctrl-C, so the work since the last checkpoint is saved. Stopping between steps keeps the checkpoint
    consistent (weights, optimizer, RNG and data position of one step). Signal handlers can only be set
    in the main thread; elsewhere the signals act as before (and the request is never set).
    """
    stop = StopRequest()
    previous: dict[int, Any] = {}

    def restore() -> None:
        for number, handler in previous.items():
            signal.signal(number, handler)

    def request_stop(signum: int, frame: Any) -> None:
        stop.requested, stop.signal_number = True, signum
        restore()

    try:
        for number in (signal.SIGINT, signal.SIGTERM):
            previous[number] = signal.signal(number, request_stop)
    except ValueError:  # not the main thread
        yield stop
        return
    try:
        yield stop
    finally:
        restore()

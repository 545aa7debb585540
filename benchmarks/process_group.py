"""A process run in its own process group and ended whole: SIGTERM to the group, then SIGKILL after a grace.

benchmarks/gpu_check.py runs each stage this way. A stage's children (pytest and the processes its tests start,
the decoder_memory stage's one-setting processes) stay in the stage's group, so ending the group at the stage's
limit, or after it exits, leaves nothing of it running on the GPU: killing the stage's process alone (as
`subprocess.run(timeout=...)` does) left its pytest or decoder child holding the device into the next stage.
Plain Python, no torch: the parent process imports it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

GRACE_SECONDS = 5.0
"""How long a group has between SIGTERM and SIGKILL (a stage's SIGTERM handler writes nothing; Python's default
ends it at once, but a process inside a CUDA call only sees the signal once that call returns)."""
POLL_SECONDS = 0.1


def start(command: list[str], **options: Any) -> subprocess.Popen:
    """`command` as the leader of a new session and process group (its group id is its pid)."""
    return subprocess.Popen(command, start_new_session=True, **options)


def live_members(group: int) -> list[int]:
    """The pids of `group`'s processes that still run (zombies, dead but not yet reaped, are not counted)."""
    proc = Path("/proc")
    if not proc.is_dir():  # not Linux: whether the group has any process at all
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return []
        return [group]
    members = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):  # ended while we read
            continue
        if int(fields[2]) == group and fields[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def signal_group(group: int, number: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # ended already
        os.killpg(group, number)


def wait_until_gone(group: int, seconds: float) -> bool:
    """Whether every process of `group` ended within `seconds`."""
    end = time.monotonic() + seconds
    while live_members(group):
        if time.monotonic() >= end:
            return False
        time.sleep(POLL_SECONDS)
    return True


def end_group(process: subprocess.Popen, grace: float = GRACE_SECONDS) -> None:
    """End `process`'s whole group: SIGTERM, up to `grace` seconds for it to go, then SIGKILL; the leader reaped."""
    group = process.pid
    if live_members(group):
        signal_group(group, signal.SIGTERM)
        if not wait_until_gone(group, grace):
            signal_group(group, signal.SIGKILL)
            wait_until_gone(group, grace)
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:  # the leader alone, in the kernel: SIGKILL it and wait for good
        process.kill()
        process.wait()


def supervise(
    process: subprocess.Popen,
    deadline: float,
    every: float,
    on_wait: Callable[[], None] = lambda: None,
    grace: float = GRACE_SECONDS,
) -> int | None:
    """Wait for `process` until `deadline` (time.time()), calling `on_wait` every `every` seconds; then end its
    group whatever happened (what the leader left behind goes too). Its exit code, or None: killed at the deadline."""
    code: int | None = None
    try:
        while True:
            try:
                code = process.wait(timeout=max(min(every, deadline - time.time()), POLL_SECONDS))
                break
            except subprocess.TimeoutExpired:
                if time.time() >= deadline:
                    break
                on_wait()
    finally:  # also when the supervisor itself is stopped (SystemExit from its SIGTERM handler, Ctrl-C)
        end_group(process, grace)
    return code

"""A pytest plugin that limits each test's seconds (`-p per_test_limit`, the limit in $PER_TEST_LIMIT_SECONDS).

The tests stage of benchmarks/gpu_check.py loads it so that one hung CUDA test cannot eat the stage's whole
share. pytest-timeout is on the GPU image but not in the project's environment (CI), so the stage brings this
instead and the CPU tests exercise the very code the GPU runs. At the limit SIGALRM fails the test in Python and
the run goes on with the next; a test stuck inside a C call, which never returns to Python, gets
faulthandler's traceback and the process's end `HARD_EXTRA_SECONDS` later (the stage then reports what it has).
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
from collections.abc import Iterator
from typing import Any

import pytest

VARIABLE = "PER_TEST_LIMIT_SECONDS"
HARD_EXTRA_SECONDS = 10.0


class OverTime(Exception):
    """A test ran past the per-test limit."""


def limit() -> float:
    return float(os.environ.get(VARIABLE, "0") or 0)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: Any, nextitem: Any) -> Iterator[None]:
    seconds = limit()
    if seconds <= 0 or not hasattr(signal, "SIGALRM"):
        yield
        return

    def over_time(number: int, frame: Any) -> None:
        raise OverTime(f"{item.nodeid} ran past the per-test limit of {seconds:g} s ({VARIABLE})")

    previous = signal.signal(signal.SIGALRM, over_time)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    faulthandler.dump_traceback_later(seconds + HARD_EXTRA_SECONDS, exit=True, file=sys.stderr)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        faulthandler.cancel_dump_traceback_later()
        signal.signal(signal.SIGALRM, previous)

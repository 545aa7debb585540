"""Progress of long loops: a tqdm bar on a terminal, plain lines when stderr is a file.

A tqdm bar redraws itself with carriage returns; in a log file (a batch job, `2> log`) that is one long
line of hundreds of redraws. Off a terminal the same loop prints one line at every tenth of the work.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TextIO, TypeVar

from tqdm.auto import tqdm

T = TypeVar("T")


def progress(
    items: Sequence[T], desc: str, unit: str, enabled: bool = True, stream: TextIO | None = None
) -> Iterator[T]:
    """Iterate over `items`, showing progress on `stream` (stderr) when `enabled`."""
    stream = stream if stream is not None else sys.stderr
    if not enabled:
        return iter(items)
    if stream.isatty():
        return iter(tqdm(items, desc=desc, unit=unit, leave=False, dynamic_ncols=True, file=stream))
    return _plain_lines(items, desc, unit, stream)


def _plain_lines(items: Sequence[T], desc: str, unit: str, stream: TextIO) -> Iterator[T]:
    """One line at each tenth of `items` (and at the end): `desc: done/total unit (seconds)`."""
    total, started, next_tenth = len(items), time.perf_counter(), 1
    for done, item in enumerate(items, start=1):
        yield item
        if done * 10 >= next_tenth * total:
            print(f"{desc}: {done}/{total} {unit} ({time.perf_counter() - started:.0f} s)", file=stream, flush=True)
            next_tenth = done * 10 // total + 1


@contextlib.contextmanager
def amount_progress(
    total: int, desc: str, unit: str, enabled: bool = True, stream: TextIO | None = None
) -> Iterator[Callable[[int], None]]:
    """Progress of work measured as an amount (the bytes of a file read so far): yields `advance(amount)`.

    A tqdm bar on a terminal; off one, a plain line at each tenth of `total` (`desc: 40% of 12,345 B (3 s)`).
    """
    stream = stream if stream is not None else sys.stderr
    if not enabled:
        yield lambda amount: None
        return
    if stream.isatty():
        with tqdm(total=total, desc=desc, unit=unit, unit_scale=True, leave=False, file=stream) as bar:
            yield bar.update
        return
    started, done, next_tenth = time.perf_counter(), 0, 1

    def advance(amount: int) -> None:
        nonlocal done, next_tenth
        done += amount
        if total > 0 and done * 10 >= next_tenth * total:
            seconds = time.perf_counter() - started
            print(f"{desc}: {100 * done // total}% of {total:,} {unit} ({seconds:.0f} s)", file=stream, flush=True)
            next_tenth = done * 10 // total + 1

    yield advance

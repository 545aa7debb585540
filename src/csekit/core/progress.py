"""Progress of long loops: a tqdm bar on a terminal, plain lines when stderr is a file.

A tqdm bar redraws itself with carriage returns; in a log file (a batch job, `2> log`) that is one long
line of hundreds of redraws. Off a terminal the same loop prints one line at every tenth of the work.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator, Sequence
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

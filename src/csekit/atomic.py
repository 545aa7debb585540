"""Atomic writes: a reader never sees a half-written file or model directory.

Files are written to a temporary sibling and renamed into place. A directory is written to a
temporary sibling, then swapped in with renames, so at every instant either the old or the new
complete directory exists under the target name or its `.old` sibling.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write `text` to `path` via a temporary file and an atomic rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def atomic_directory(target: str | Path) -> Iterator[Path]:
    """Yield a temporary directory; on success it replaces `target` as a whole.

    On an exception the temporary directory is removed and `target` is left untouched.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    swap_in(tmp, target)


def swap_in(source: Path, target: Path) -> None:
    """Replace directory `target` by the complete directory `source` with two renames.

    Between the renames only `target.old` exists; `recover_directory` finishes such a swap.
    """
    old = target.with_name(target.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        os.replace(target, old)
    os.replace(source, target)
    shutil.rmtree(old, ignore_errors=True)


def recover_directory(target: str | Path) -> None:
    """Finish a swap interrupted between its two renames: restore `target.old` if `target` is gone."""
    target = Path(target)
    old = target.with_name(target.name + ".old")
    if not target.exists() and old.exists():
        os.replace(old, target)

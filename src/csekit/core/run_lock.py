"""One run per output folder: `output/.lock`, held with `fcntl.flock` for the whole run.

The kernel releases a flock when its process ends, however it ends (SIGKILL included), so a lock
left behind by a dead run is stale by construction: the next run takes it over. The file holds the
holder's PID and host only for the error message. On systems without `fcntl` (Windows) runs are not
locked.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import time
from collections.abc import Iterator
from pathlib import Path

from csekit.core.bounded_read import read_bounded_bytes
from csekit.core.errors import CsekitError
from csekit.core.json_lines import json_row

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

LOCK_NAME = ".lock"
_NO_FOLLOW = getattr(os, "O_NOFOLLOW", 0)  # a run folder from someone else may hold a link to your files


def _holder(path: Path) -> str:
    try:
        info = json_row(read_bounded_bytes(path, 2**12))  # RowProblem is a ValueError
        return f"pid {int(info['pid'])} on {str(info['host'])[:100]}"
    except (OSError, ValueError, KeyError, TypeError, CsekitError):
        return "another process"


def _in_use_error(output: Path) -> CsekitError:
    return CsekitError(
        f"output folder {output} is in use by a running csekit train ({_holder(output / LOCK_NAME)}); "
        "wait for it to finish or choose another folder"
    )


def check_not_locked(output: Path) -> None:
    """Read-only check (nothing is created): refuse a folder whose lock another process holds."""
    path = output / LOCK_NAME
    if fcntl is None or not path.is_file():
        return
    try:
        fd = os.open(path, os.O_RDONLY | _NO_FOLLOW)
    except OSError:
        return  # a symbolic link: hold_run_lock says so
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise _in_use_error(output) from None
    finally:
        os.close(fd)  # closing releases the lock taken for the test


@contextlib.contextmanager
def hold_run_lock(output: Path) -> Iterator[None]:
    """Hold `output/.lock` until the block ends; a lock held by a live process is a CsekitError.

    A stale file (its process has died, so no flock is held) is taken over. The file is removed on
    release; a run that opened the old file just before is caught by comparing inodes after locking.
    """
    if fcntl is None:  # pragma: no cover - Windows
        yield
        return
    path = output / LOCK_NAME
    while True:
        try:  # O_NONBLOCK: opening a FIFO placed there must not wait for a reader
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK | _NO_FOLLOW, 0o644)
        except OSError as error:  # ELOOP: a symbolic link, which could point at any file of the user's
            raise CsekitError(
                f"{path} cannot be opened as a lock file ({error.strerror}); csekit does not follow a "
                "symbolic link there: remove it"
            ) from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO, a device: not ours to lock, write or delete
            os.close(fd)
            raise CsekitError(f"{path} is not a regular file, so it cannot be a run's lock file: remove it")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise _in_use_error(output) from None
        try:
            same_file = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            same_file = False
        if same_file:
            break
        os.close(fd)  # the holder removed the file between our open and flock: lock the new one
    try:
        record = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(record).encode("utf-8"))
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        os.close(fd)

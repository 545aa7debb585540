"""One writer per result: `output/.lock` for a training run, `.NAME.lock` beside what another command writes,
held with `fcntl.flock` for the whole command.

`train` holds its folder's lock (the Trainer); every other command that writes a result (a JSON report,
embeddings, augment's `.jsonl`, bench's folder, downloaded data) holds its result's lock through
`locks_output`, so two commands writing one result are refused instead of corrupting it (two `augment`
runs appended to one file); `tests/invariants/architecture/test_architecture_files.py` fails for a writing command
without it.

The kernel releases a flock when its process ends, however it ends (SIGKILL included), so a lock
left behind by a dead run is stale by construction: the next run takes it over. The file holds the
holder's PID and host only for the error message. On systems without `fcntl` (Windows) runs are not
locked.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import socket
import stat
import time
from collections.abc import Callable, Iterator
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


def _holder(path: Path, command: str) -> tuple[str, str]:
    """(the holder's command, "pid N on HOST") from the lock file, as far as it can be read (else `command`)."""
    try:
        info = json_row(read_bounded_bytes(path, 2**12))  # RowProblem is a ValueError
        holder = f"pid {int(info['pid'])} on {str(info['host'])[:100]}"
    except (OSError, ValueError, KeyError, TypeError, CsekitError):
        return command, "another process"
    named = info.get("command")
    return (named if isinstance(named, str) and named.replace("-", "").isalpha() else command), holder


def _in_use_error(output: Path, lock: Path, command: str, what: str = "output folder") -> CsekitError:
    command, holder = _holder(lock, command)
    return CsekitError(
        f"{what} {output} is in use by a running csekit {command} ({holder}); wait for it to finish or choose "
        "another one"
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
        raise _in_use_error(output, path, "train") from None
    finally:
        os.close(fd)  # closing releases the lock taken for the test


@contextlib.contextmanager
def hold_run_lock(output: Path, command: str = "train", path: Path | None = None) -> Iterator[None]:
    """Hold `output/.lock` (or the lock file `path` of a result `output`) until the block ends; a lock held by a
    live process is a CsekitError naming its `command`.

    A stale file (its process has died, so no flock is held) is taken over. The file is removed on
    release; a run that opened the old file just before is caught by comparing inodes after locking.
    """
    if fcntl is None:  # pragma: no cover - Windows
        yield
        return
    what = "output folder" if path is None else "output"
    path = output / LOCK_NAME if path is None else path
    while True:
        try:  # O_NONBLOCK: opening a FIFO placed there must not wait for a reader
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK | _NO_FOLLOW, 0o644)
        except OSError as error:  # ELOOP: a symbolic link, which could point at any file of the user's
            if error.errno != errno.ELOOP:  # a read-only folder, a full disk
                raise CsekitError(f"{path}: cannot create the lock file ({error.strerror})") from None
            raise CsekitError(
                f"{path} cannot be opened as a lock file ({error.strerror}); csekit does not follow a "
                "symbolic link there: remove it"
            ) from None
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):  # a FIFO, a device: not ours to lock, write or delete
            os.close(fd)
            raise CsekitError(f"{path} is not a regular file, so it cannot be a run's lock file: remove it")
        if info.st_nlink > 1:  # a hard link: the same file has another name, perhaps outside the folder
            os.close(fd)
            raise CsekitError(
                f"{path} has {info.st_nlink - 1} other name(s) (a hard link), so writing it would change a file "
                "elsewhere; csekit writes only a lock file of its own there: remove it"
            )
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise _in_use_error(output, path, command, what) from None
        try:
            same_file = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            same_file = False
        if same_file:
            break
        os.close(fd)  # the holder removed the file between our open and flock: lock the new one
    try:
        record = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time(), "command": command}
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(record).encode("utf-8"))
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        os.close(fd)


def result_lock(output: Path) -> Path:
    """The lock file of a command's result (a file or a folder): `.NAME.lock` beside it (`.`, `..` resolved to the
    folder they name; the root folder, which has no name, locks `/.lock`)."""
    output = Path(os.path.abspath(output))
    return output.with_name(f".{output.name}.lock") if output.name else output / LOCK_NAME


@contextlib.contextmanager
def hold_result_lock(output: Path, command: str) -> Iterator[None]:
    """Hold the lock of the result `output` while `command` writes it; folders made for the lock file (the result's
    missing parents) are removed again if they are still empty."""
    lock = result_lock(output)
    made = [folder for folder in lock.parents if not folder.exists()]
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:  # a file where a folder must be, a read-only folder
        raise CsekitError(f"output {output}: cannot create its folder ({error.strerror})") from None
    try:
        with hold_run_lock(output, command, lock):
            yield
    finally:
        for folder in made:  # deepest first
            with contextlib.suppress(OSError):
                folder.rmdir()


def locks_output(parameter: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """A CLI command that writes its result at its `parameter` (a file or folder path) holds the result's lock
    (`hold_result_lock`) for as long as it runs; without the parameter (evaluate without --output) no lock."""

    def decorate(command: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(command)
        def locked(*args: object, **kwargs: object) -> None:
            output = kwargs.get(parameter)
            if output is None:
                return command(*args, **kwargs)
            with hold_result_lock(Path(str(output)), command.__name__.replace("_", "-")):
                return command(*args, **kwargs)

        return locked

    return decorate

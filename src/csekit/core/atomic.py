"""Writing inside a folder csekit owns (a run, model, output or data folder): the one way to do it.

Every file csekit creates, appends to, replaces or renames in such a folder goes through this module
(`tests/test_architecture.py` finds any other write in `src/`). The folder may be shared, and what is in
it may have been placed by someone else, so:

* a file is opened relative to its parent folder with no-follow semantics (`O_NOFOLLOW`, `O_NONBLOCK`,
  then `fstat`): a link at the target, or a FIFO, device or folder, is refused in one line (a
  `CsekitError` saying to remove it), never written through;
* whole files are written to a temporary sibling created exclusively (`O_CREAT | O_EXCL`: a link at that
  name is never opened) and renamed over the target, so a reader never sees half a file; a link or
  anything but a regular file at the target is refused, not replaced;
* a directory is written to a temporary sibling (an exclusive `mkdir`), then swapped in with renames, so
  at every instant either the old or the new complete directory exists under the target name or its
  `.old` sibling; a link or a file at the target or at `.old` is refused, and a link at `.old` is never
  adopted as the model;
* a third-party saver that writes to a file name (safetensors) gets a temporary name this module created
  (`write_by_name`); one that writes to a handle (torch, numpy, matplotlib) gets the handle (`write_file`);
  one that writes a whole folder (transformers' `save_pretrained`) writes into `atomic_directory`'s fresh
  staging folder.

What lands under the target name has the modes the user's umask gives a plain `mkdir` or `open`
(0755 and 0644 under umask 022). `tempfile`'s private 0700/0600 modes would otherwise leak into
every model folder, and so would the 0600 of files some writers (safetensors) create.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO, TextIO

from csekit.core.bounded_read import read_bounded_bytes
from csekit.core.errors import CsekitError

STAGING_SUFFIX = ".tmp"
"""Staging names are `.NAME.<random>.tmp` (and the trainer's `.checkpoint.tmp`): hidden, ending in .tmp."""
_ATTEMPTS = 100
_NO_FOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NON_BLOCK = getattr(os, "O_NONBLOCK", 0)
_CLOSE_ON_EXEC = getattr(os, "O_CLOEXEC", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)


def _link_error(path: Path) -> CsekitError:
    return CsekitError(
        f"{path} is a symbolic link; csekit does not follow links where it writes (it could point at any of "
        "your files): remove it"
    )


def _special_error(path: Path, mode: int) -> CsekitError:
    kind = "a folder" if stat.S_ISDIR(mode) else "not a regular file (a FIFO, device or socket)"
    return CsekitError(f"{path} is {kind}, where csekit writes a file: remove it")


def refuse_unsafe_file(path: str | Path) -> None:
    """Refuse (CsekitError) a link, or anything but a regular file, at a name csekit is about to write."""
    path = Path(path)
    try:
        info = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):  # nothing there (a parent that is a file fails later)
        return
    if stat.S_ISLNK(info.st_mode):
        raise _link_error(path)
    if not stat.S_ISREG(info.st_mode):
        raise _special_error(path, info.st_mode)


def refuse_unsafe_folder(path: str | Path) -> bool:
    """Whether a real folder is at `path` (False: nothing); a link or a file there is a CsekitError."""
    path = Path(path)
    try:
        info = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    if stat.S_ISLNK(info.st_mode):
        raise _link_error(path)
    if not stat.S_ISDIR(info.st_mode):
        raise CsekitError(f"{path} is not a folder, where csekit keeps a folder: remove it")
    return True


def _open_in_folder(path: Path, flags: int, mode: int = 0o666) -> int:
    """A descriptor of the regular file `path`, opened relative to its parent folder without following a link.

    `O_NONBLOCK` keeps a FIFO from blocking the open; the `fstat` after it refuses a FIFO or device.
    """
    folder_fd = os.open(path.parent, os.O_RDONLY | _DIRECTORY | _CLOSE_ON_EXEC)
    try:
        fd = os.open(path.name, flags | _NO_FOLLOW | _NON_BLOCK | _CLOSE_ON_EXEC, mode, dir_fd=folder_fd)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise _link_error(path) from None
        if error.errno in (errno.ENXIO, errno.EISDIR):  # a FIFO without a reader; a folder
            raise _special_error(path, os.lstat(path).st_mode) from None
        raise
    finally:
        os.close(folder_fd)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise _special_error(path, info.st_mode)
    return fd


@contextlib.contextmanager
def open_for_append(path: str | Path) -> Iterator[TextIO]:
    """`path` opened to append UTF-8 text (created if missing); a link or a special file there is refused."""
    path = Path(path)
    fd = _open_in_folder(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    with os.fdopen(fd, "a", encoding="utf-8", newline="") as handle:
        yield handle


def open_bytes_for_append(path: str | Path) -> BinaryIO:
    """`path` opened to append bytes (created if missing; a download's staging file), never through a link or
    into a special file (see `open_for_append`); the caller closes it."""
    return os.fdopen(_open_in_folder(Path(path), os.O_WRONLY | os.O_APPEND | os.O_CREAT), "ab")


def append_text(path: str | Path, text: str) -> None:
    """Append `text` to `path` (created if missing), never through a link (see `open_for_append`)."""
    with open_for_append(path) as handle:
        handle.write(text)


def truncate_file(path: str | Path, size: int) -> None:
    """Cut the regular file `path` to `size` bytes (a link or a special file there is refused)."""
    fd = _open_in_folder(Path(path), os.O_WRONLY)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)


def check_writable(folder: str | Path, process: int = 0) -> None:
    """Create and remove a probe file in `folder`: OSError when the folder cannot be written."""
    probe = Path(folder) / f".csekit-write-test-{process}"
    os.close(_open_in_folder(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL))
    os.unlink(probe)


def current_umask() -> int:
    """The process's umask, read without changing it where the OS allows (Linux: /proc/self/status)."""
    with contextlib.suppress(OSError, ValueError, CsekitError):
        for line in read_bounded_bytes("/proc/self/status", 2**16).decode("ascii").split("\n"):
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)  # elsewhere the only way to read it is to set it; restored at once
    os.umask(mask)
    return mask


def apply_umask(root: Path) -> None:
    """Give `root` and everything below it the modes a plain mkdir/open would under the current umask.

    Folders get 0777 & ~umask, files 0666 & ~umask (0777 & ~umask if the owner may execute them).
    """
    mask = current_umask()
    folder_mode, file_mode, program_mode = 0o777 & ~mask, 0o666 & ~mask, 0o777 & ~mask
    os.chmod(root, folder_mode)
    for folder, subfolders, files in os.walk(root):
        for name in subfolders:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                os.chmod(path, folder_mode)
        for name in files:
            path = os.path.join(folder, name)
            info = os.lstat(path)
            if stat.S_ISREG(info.st_mode):
                os.chmod(path, program_mode if info.st_mode & stat.S_IXUSR else file_mode)


def _staging_name(target: Path) -> Path:
    return target.with_name(f".{target.name}.{secrets.token_hex(4)}{STAGING_SUFFIX}")


def _staging_file(target: Path) -> tuple[Path, int]:
    """A fresh temporary sibling of `target` and its descriptor (exclusive create: a link there is never opened)."""
    refuse_unsafe_file(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(_ATTEMPTS):
        tmp = _staging_name(target)
        try:  # the kernel applies the umask, as for open(path, "w")
            return tmp, _open_in_folder(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name beside {target}")


def _rename_into_place(tmp: Path, target: Path) -> None:
    """Rename the finished temporary file over `target`, checked again just before (a link may have appeared)."""
    refuse_unsafe_file(target)
    os.replace(tmp, target)


def write_file(path: str | Path, write: Callable[[BinaryIO], object]) -> None:
    """Replace `path` as a whole with what `write(handle)` writes: a temporary sibling, fsync, an atomic rename.

    For savers that take a handle: `write_file(p, lambda handle: torch.save(state, handle))`. On an
    exception the temporary file is removed and `path` is untouched.
    """
    path = Path(path)
    tmp, fd = _staging_file(path)
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        _rename_into_place(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_by_name(path: str | Path, write: Callable[[str], object]) -> None:
    """Replace `path` with the file `write(name)` writes under a temporary name this module created.

    For savers that only take a file name (safetensors' `save_file`); the name is a fresh regular file,
    and it must still be one (not a link) when it is renamed over `path`.
    """
    path = Path(path)
    tmp, fd = _staging_file(path)
    os.close(fd)
    try:
        write(str(tmp))
        refuse_unsafe_file(tmp)
        _rename_into_place(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write `text` (UTF-8) to `path` via a temporary file and an atomic rename (see `write_file`)."""
    data = text.encode("utf-8")
    write_file(path, lambda handle: handle.write(data))


def move_file(source: str | Path, target: str | Path) -> None:
    """Rename the regular file `source` (csekit's own) to `target`; a link or special file at `target` is refused."""
    refuse_unsafe_file(source)
    _rename_into_place(Path(source), Path(target))


@contextlib.contextmanager
def atomic_directory(target: str | Path) -> Iterator[Path]:
    """Yield a temporary directory; on success it replaces `target` as a whole.

    On an exception the temporary directory is removed and `target` is left untouched.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(_ATTEMPTS):
        tmp = _staging_name(target)
        try:
            tmp.mkdir()
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(f"no free temporary name beside {target}")
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    swap_in(tmp, target)


def swap_in(source: Path, target: Path) -> None:
    """Replace directory `target` by the complete directory `source` with two renames.

    Between the renames only `target.old` exists; `recover_directory` finishes such a swap.
    `source`'s modes are first set to what the umask gives (see `apply_umask`). A link or a file at
    `target` or `target.old` is refused (CsekitError), never renamed, emptied or followed.
    """
    old = target.with_name(target.name + ".old")
    has_old, has_target = refuse_unsafe_folder(old), refuse_unsafe_folder(target)
    apply_umask(source)
    if has_old:
        shutil.rmtree(old)
    if has_target:
        os.replace(target, old)
    os.replace(source, target)
    shutil.rmtree(old, ignore_errors=True)


def recover_directory(target: str | Path) -> None:
    """Finish a swap interrupted between its two renames: restore `target.old` if `target` is gone.

    Only a real folder is restored: a link left at `target.old` is refused, never adopted as the model.
    """
    target = Path(target)
    old = target.with_name(target.name + ".old")
    if not os.path.lexists(target) and refuse_unsafe_folder(old):
        os.replace(old, target)


def fresh_folder(path: str | Path) -> Path:
    """An empty folder at `path`, a fixed staging name (what a killed run left there is removed first).

    A link or a file at `path` is refused (CsekitError), never followed into or emptied.
    """
    path = Path(path)
    if refuse_unsafe_folder(path):
        shutil.rmtree(path)
    path.mkdir()
    return path


def remove_staging_leftovers(folder: str | Path) -> list[str]:
    """Remove the staging folders and files (`.NAME.*.tmp`) a killed run left in `folder`; their names.

    They are never read (a complete write is renamed away from its staging name), so they only take
    disk space: a model folder or checkpoint each. Call only while no other process writes to `folder`.
    """
    removed = []
    for entry in sorted(Path(folder).iterdir()):
        if not (entry.name.startswith(".") and entry.name.endswith(STAGING_SUFFIX)):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        removed.append(entry.name)
    return removed


def commit_staged_file(staged: str | Path, target: str | Path) -> None:
    """Move a complete staged file (written and checked beside `target`) into place with one atomic rename.

    For files written in pieces over time, such as a resumable download, which `atomic_write_text` cannot
    stage: the data is flushed to disk first, so a crash leaves either no `target` or the complete one.
    """
    staged, target = Path(staged), Path(target)
    fd = os.open(staged, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(staged, target)

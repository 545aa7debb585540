"""Writing inside a folder csekit owns (a run, model, output or data folder): the one way to do it.

Every file csekit creates, appends to, replaces or renames in such a folder goes through this module.
`tests/invariants/architecture/test_architecture_files.py` (`test_every_write_goes_through_core_atomic`) finds any
other write in `src/`; its allow-list names the exceptions: the run lock's file (`core/run_lock.py` opens it
no-follow and non-blocking itself), `download-data` unpacking an archive in its own temporary folder, and the
library writers below, which write only into a folder held here. The folder may be shared, and what is in it may
have been placed by someone else, so:

* a file is opened relative to its parent folder with no-follow semantics (`O_NOFOLLOW`, `O_NONBLOCK`,
  then `fstat`): a link at the name (symbolic, or a hard link: a file with another name), or a FIFO, device or
  folder, is refused in one line (a `CsekitError` saying to remove it), never written through; that is how
  files are appended to (`open_for_append`, `append_text`, `open_bytes_for_append`) and cut (`truncate_file`);
* whole files are written to a temporary sibling created exclusively (`O_CREAT | O_EXCL`: a link at that
  name is never opened), flushed to disk and renamed over the target (`write_file`, `write_by_name`,
  `atomic_write_text`; `move_file` and `commit_staged_file` rename a file csekit wrote itself), so a reader
  never sees half a file; a link or anything but a regular file at the target is refused, not replaced;
* a directory is written to a temporary sibling (`staging_folder`: an exclusive `mkdir` of a random name, or
  the trainer's fixed `.checkpoint.tmp` once a leftover csekit marked is removed; 0700, marked with
  `STAGING_MARKER`) that csekit holds open (`HeldFolder`). On Linux every writer writes through the
  descriptor (`/proc/self/fd/N`), so a link put at its name afterwards is never written through; elsewhere
  writers use the name. Either way the name is checked against the held folder (device and inode) before
  the folder is renamed, and modes are changed on descriptors only. `swap_in` puts it in place with
  renames, so at every instant either the old or the new complete directory exists under the target name
  or its `.old` sibling (`recover_directory` finishes a swap cut between the renames); a link or a file at
  the target or at `.old` is refused, and a link at `.old` is never adopted as the model;
* a third-party saver that writes to a file name (safetensors) gets a temporary name this module created
  (`write_by_name`); one that writes to a handle (torch, numpy, matplotlib) gets the handle (`write_file`);
  one that writes a whole folder (transformers' `save_pretrained`) writes into `atomic_directory`'s held
  staging folder; one that writes into a folder over a whole run (a tracker) into a `hold_folder` (no link
  anywhere inside it).

What lands under the target name has the modes the user's umask gives a plain `mkdir` or `open`
(0755 and 0644 under umask 022): a staging folder's private 0700 and the 0600 of files some savers create
(safetensors) are replaced when the file or folder is put in place (`write_by_name`, `swap_in`).
`remove_staging_leftovers` removes what a killed run left staged, and only what csekit can tell it made.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import shutil
import stat
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import BinaryIO, TextIO

from csekit.core.bounded_read import read_bounded_bytes
from csekit.core.errors import CsekitError

STAGING_SUFFIX = ".tmp"
"""Staging names are `.NAME.<random>.tmp` (and the trainer's `.checkpoint.tmp`): hidden, ending in .tmp."""
STAGING_MARKER = ".csekit-staging"
"""The empty file inside every staging folder csekit makes: only a hidden *.tmp folder holding it is removed as a
killed run's leftover (any other is someone else's)."""
_STAGED_FILE = re.compile(r"\.(?P<target>.+)\.[0-9a-f]{8}" + re.escape(STAGING_SUFFIX))
_PROC_FD = Path("/proc/self/fd")
_ATTEMPTS = 100
_NO_FOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NON_BLOCK = getattr(os, "O_NONBLOCK", 0)
_CLOSE_ON_EXEC = getattr(os, "O_CLOEXEC", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_O_CREATE_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL


def _link_error(path: Path) -> CsekitError:
    return CsekitError(
        f"{path} is a symbolic link; csekit does not follow links where it writes (it could point at any of "
        "your files): remove it"
    )


def _hard_link_error(path: Path, links: int) -> CsekitError:
    return CsekitError(
        f"{path} has {links - 1} other name(s) (a hard link), so writing it would change a file elsewhere; "
        "csekit does not write through it: remove it"
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
    if info.st_nlink > 1:  # a hard link: appending, cutting or changing its mode would change a file elsewhere
        os.close(fd)
        raise _hard_link_error(path, info.st_nlink)
    return fd


@contextlib.contextmanager
def open_for_append(path: str | Path) -> Iterator[TextIO]:
    """`path` opened to append UTF-8 text (created if missing); a link or a special file there is refused."""
    path = Path(path)
    fd = _open_in_folder(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    with os.fdopen(fd, "a", encoding="utf-8", errors="backslashreplace", newline="") as handle:
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
    """Create and remove a probe file in `folder`: OSError when the folder cannot be written.

    The probe's name is fresh each time (random, created exclusively, another drawn on a clash): a file, folder or
    link someone left at a fixed name made a writable folder "not writable" (FileExistsError's reason).
    """
    for _ in range(_ATTEMPTS):
        probe = Path(folder) / f".csekit-write-test-{process}-{secrets.token_hex(8)}"
        try:
            fd = _open_in_folder(probe, _O_CREATE_NEW)
        except FileExistsError:
            continue
        os.close(fd)
        os.unlink(probe)
        return
    raise FileExistsError(f"no free probe name in {folder}")


def current_umask() -> int:
    """The process's umask, read without changing it where the OS allows (Linux: /proc/self/status)."""
    with contextlib.suppress(OSError, ValueError, CsekitError):
        for line in read_bounded_bytes("/proc/self/status", 2**16).decode("ascii").split("\n"):
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)  # elsewhere the only way to read it is to set it; restored at once
    os.umask(mask)
    return mask


def _give_umask_modes(folder_fd: int) -> None:
    """Give the held folder and everything below it the modes a plain mkdir/open would under the current umask.

    Folders get 0777 & ~umask, files 0666 & ~umask (0777 & ~umask if the owner may execute them). Every
    change is made on a descriptor (`fchmod`): a folder is walked by `os.fwalk` from the held descriptor (a
    link is never descended), a file is opened relative to its folder with `O_NOFOLLOW`, so a link put
    anywhere inside never carries a mode change to its target.
    """
    mask = current_umask()
    folder_mode, file_mode, program_mode = 0o777 & ~mask, 0o666 & ~mask, 0o777 & ~mask
    for _, _, files, fd in os.fwalk(".", dir_fd=folder_fd):
        os.fchmod(fd, folder_mode)
        for name in files:
            if not stat.S_ISREG(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                continue  # a link, FIFO or device: not csekit's, left as it is
            try:
                file_fd = os.open(name, os.O_RDONLY | _NO_FOLLOW | _NON_BLOCK | _CLOSE_ON_EXEC, dir_fd=fd)
            except OSError:  # replaced by a link since (ELOOP), or not readable: never followed
                continue
            try:
                info = os.fstat(file_fd)
                if stat.S_ISREG(info.st_mode):
                    os.fchmod(file_fd, program_mode if info.st_mode & stat.S_IXUSR else file_mode)
            finally:
                os.close(file_fd)


def _give_file_umask_mode(path: Path) -> None:
    """Give the regular file `path` what a plain open gives under the umask (a link or special file is refused)."""
    fd = _open_in_folder(path, os.O_RDONLY)
    try:
        os.fchmod(fd, 0o666 & ~current_umask())
    finally:
        os.close(fd)


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
    and it must still be one (not a link) when it is renamed over `path`. A saver that makes its own file
    there (safetensors: 0600, whatever the umask) leaves the mode a plain open gives under the umask.
    """
    path = Path(path)
    tmp, fd = _staging_file(path)
    os.close(fd)
    try:
        write(str(tmp))
        _give_file_umask_mode(tmp)
        _rename_into_place(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write `text` (UTF-8) to `path` via a temporary file and an atomic rename (see `write_file`).

    A path whose bytes are not UTF-8 (Python holds them as surrogates) is written as the escape `\\udcff`, readable
    and valid UTF-8: a model card naming such a corpus was a traceback at the first save after training.
    """
    data = text.encode("utf-8", "backslashreplace")
    write_file(path, lambda handle: handle.write(data))


def move_file(source: str | Path, target: str | Path) -> None:
    """Rename the regular file `source` (csekit's own) to `target`; a link or special file at `target` is refused."""
    refuse_unsafe_file(source)
    _rename_into_place(Path(source), Path(target))


class HeldFolder:
    """A folder csekit created (or checked) and holds open by a descriptor while it writes into it.

    `path` is where writers write, csekit's own and a library's (`save_pretrained`, a tracker): on Linux
    `/proc/self/fd/N`, which the kernel resolves to the held folder itself, so a link or another folder put
    at its name afterwards is never written through. Before the folder is renamed or removed by name,
    `check_in_place` compares what is at the name with the held folder (device and inode).
    """

    def __init__(self, name: Path) -> None:
        self.name = name
        try:  # O_NOFOLLOW: a link at the name is refused, never opened
            self.fd = os.open(name, os.O_RDONLY | _DIRECTORY | _NO_FOLLOW | _CLOSE_ON_EXEC)
        except OSError as error:
            if error.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(name):
                raise _link_error(name) from None
            raise
        self.identity = os.fstat(self.fd)
        by_descriptor = _PROC_FD / str(self.fd)
        try:
            held = os.path.samestat(os.stat(by_descriptor), self.identity)
        except OSError:
            held = False
        self.path = by_descriptor if held else name  # elsewhere only the checks by name remain

    def check_in_place(self) -> None:
        """Refuse (CsekitError) to go on when the name no longer leads to the held folder."""
        try:
            same = os.path.samestat(os.lstat(self.name), self.identity)
        except FileNotFoundError:
            same = False
        if not same:
            raise CsekitError(
                f"{self.name} was replaced (by a link or another folder) while csekit wrote into it; csekit does "
                "not write, move or delete through it: remove it"
            )

    def remove(self) -> None:
        """Delete the folder if it is still the held one at its name (a failed write's staging folder)."""
        with contextlib.suppress(CsekitError):
            self.check_in_place()
            shutil.rmtree(self.name, ignore_errors=True)

    def close(self) -> None:
        os.close(self.fd)


def hold_folder(path: str | Path, entries: int = 10_000) -> HeldFolder:
    """The folder at `path` (created if missing), held open, with no link (symbolic or hard) anywhere inside it.

    For a folder a library writes into by itself over a run (a tracker's logs): a link there, or at any level
    below (in a run folder from someone else), is refused in one line, never written through; at most
    `entries` names are looked at.
    """
    path = Path(path)
    if not refuse_unsafe_folder(path):
        path.mkdir(parents=True, exist_ok=True)
    held = HeldFolder(path)
    seen = 0
    try:
        for root, folders, files, fd in os.fwalk(".", dir_fd=held.fd):
            for name in (*folders, *files):
                seen += 1
                if seen > entries:
                    raise CsekitError(f"{path} holds more than {entries} files and folders; move them away")
                info = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if stat.S_ISLNK(info.st_mode):
                    raise _link_error(path / root / name)
                if stat.S_ISREG(info.st_mode) and info.st_nlink > 1:  # a library may append to a file it finds
                    raise _hard_link_error(path / root / name, info.st_nlink)
    except BaseException:
        held.close()
        raise
    return held


def staging_folder(target: Path, name: str | None = None) -> HeldFolder:
    """A new folder beside `target` to stage its next version in, held open, marked as csekit's.

    The name is `.TARGET.<random>.tmp` (an exclusive mkdir), or the fixed `name` (the trainer's
    `.checkpoint.tmp`, which every process finds): a staging folder a killed run left there is removed first,
    anything else there is refused. The folder is 0700 while it is written (`swap_in` gives it the umask's
    modes) and holds `STAGING_MARKER`, the proof `remove_staging_leftovers` asks for.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(_ATTEMPTS):
        path = target.with_name(name) if name else _staging_name(target)
        if name is not None and os.path.lexists(path):
            if not is_staging_folder(path):
                raise CsekitError(f"{path} is in the way and csekit did not make it (no {STAGING_MARKER}): move it")
            shutil.rmtree(path)
        try:
            path.mkdir(mode=0o700)
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(f"no free temporary name beside {target}")
    held = HeldFolder(path)
    try:
        if getattr(os, "geteuid", lambda: held.identity.st_uid)() != held.identity.st_uid or os.listdir(held.fd):
            raise CsekitError(f"{path} was replaced by someone else's folder just after csekit made it: remove it")
        marker = _O_CREATE_NEW | _NO_FOLLOW | _CLOSE_ON_EXEC
        os.close(os.open(STAGING_MARKER, marker, 0o600, dir_fd=held.fd))
    except BaseException:
        held.close()
        raise
    return held


@contextlib.contextmanager
def atomic_directory(target: str | Path) -> Iterator[Path]:
    """Yield the held staging folder's path (see `HeldFolder`); on success it replaces `target` as a whole.

    On an exception the staging folder is removed and `target` is left untouched.
    """
    target = Path(target)
    held = staging_folder(target)
    try:
        try:
            yield held.path
        except BaseException:
            held.remove()
            raise
        swap_in(held, target)
    finally:
        held.close()


def swap_in(source: Path | HeldFolder, target: Path) -> None:
    """Replace directory `target` by the complete directory `source` with two renames.

    Between the renames only `target.old` exists; `recover_directory` finishes such a swap. `source`'s
    modes are first set to what the umask gives (through its descriptor, never through a link), and
    `source` must still be the folder csekit holds (a link put at its name is refused, not renamed in).
    A link or a file at `target` or `target.old` is refused (CsekitError), never renamed, emptied or followed.
    """
    held = source if isinstance(source, HeldFolder) else HeldFolder(source)
    try:
        old = target.with_name(target.name + ".old")
        has_old, has_target = refuse_unsafe_folder(old), refuse_unsafe_folder(target)
        _give_umask_modes(held.fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(STAGING_MARKER, dir_fd=held.fd)
        held.check_in_place()
        if has_old:
            shutil.rmtree(old)
        if has_target:
            os.replace(target, old)
        try:
            held.check_in_place()
        except CsekitError:
            if has_target:
                os.replace(old, target)
            raise
        os.replace(held.name, target)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        if held is not source:
            held.close()


def recover_directory(target: str | Path) -> None:
    """Finish a swap interrupted between its two renames: restore `target.old` if `target` is gone.

    Only a real folder is restored: a link left at `target.old` is refused, never adopted as the model.
    """
    target = Path(target)
    old = target.with_name(target.name + ".old")
    if not os.path.lexists(target) and refuse_unsafe_folder(old):
        os.replace(old, target)


def is_staging_folder(path: Path) -> bool:
    """A real folder holding `STAGING_MARKER` as a regular file: one csekit made to stage a write."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode) and stat.S_ISREG(os.lstat(path / STAGING_MARKER).st_mode)
    except OSError:
        return False


def _is_staging_file(path: Path, targets: Collection[str]) -> bool:
    """A regular file named `.TARGET.<8 hex>.tmp` for one of the files csekit writes in its folder (`targets`)."""
    match = _STAGED_FILE.fullmatch(path.name)
    try:
        return match is not None and match["target"] in targets and stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def remove_staging_leftovers(folder: str | Path, targets: Collection[str] = ()) -> list[str]:
    """Remove the staging folders and files a killed run left in `folder`; their names.

    Only what csekit can tell it made: a hidden `*.tmp` folder holding `STAGING_MARKER`, and a staging file
    `.TARGET.<8 hex>.tmp` of a file csekit writes there (`targets`). Any other hidden `*.tmp` is someone's
    and stays. They are never read (a complete write is renamed away from its staging name), so they only
    take disk space. Call only while no other process writes to `folder`.
    """
    removed = []
    for entry in sorted(Path(folder).iterdir()):
        if not (entry.name.startswith(".") and entry.name.endswith(STAGING_SUFFIX)):
            continue
        if is_staging_folder(entry):
            shutil.rmtree(entry, ignore_errors=True)
        elif _is_staging_file(entry, targets):
            entry.unlink(missing_ok=True)
        else:
            continue
        removed.append(entry.name)
    return removed


def commit_staged_file(staged: str | Path, target: str | Path) -> None:
    """Move a complete staged file (written and checked beside `target`) into place with one atomic rename.

    For files written in pieces over time, such as a resumable download, which `atomic_write_text` cannot
    stage: the data is flushed to disk first, so a crash leaves either no `target` or the complete one. The
    staged file is opened as every file here (no link, no FIFO), and a link at `target` is refused, not replaced.
    """
    staged, target = Path(staged), Path(target)
    fd = _open_in_folder(staged, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    _rename_into_place(staged, target)

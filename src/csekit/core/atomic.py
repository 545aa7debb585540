"""Atomic writes: a reader never sees a half-written file or model directory.

Files are written to a temporary sibling and renamed into place. A directory is written to a
temporary sibling, then swapped in with renames, so at every instant either the old or the new
complete directory exists under the target name or its `.old` sibling.

What lands under the target name has the modes the user's umask gives a plain `mkdir` or `open`
(0755 and 0644 under umask 022). `tempfile`'s private 0700/0600 modes would otherwise leak into
every model folder, and so would the 0600 of files some writers (safetensors) create.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

STAGING_SUFFIX = ".tmp"
"""Staging names are `.NAME.<random>.tmp` (and the trainer's `.checkpoint.tmp`): hidden, ending in .tmp."""
_ATTEMPTS = 100


def current_umask() -> int:
    """The process's umask, read without changing it where the OS allows (Linux: /proc/self/status)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text(encoding="ascii").split("\n"):
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


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write `text` to `path` via a temporary file and an atomic rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    for _ in range(_ATTEMPTS):
        tmp = _staging_name(path)
        try:
            fd = os.open(tmp, flags, 0o666)  # the kernel applies the umask, as for open(path, "w")
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(f"no free temporary name beside {path}")
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
    `source`'s modes are first set to what the umask gives (see `apply_umask`).
    """
    apply_umask(source)
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

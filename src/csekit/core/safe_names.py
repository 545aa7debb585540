"""Names read from a file that become part of a path: the one place they are joined to their folder.

A bench suite's recipe names become run folders under `--output`; a model folder's `modules.json` and
`csekit.json` name the folders of its modules. Any of those files may come from someone else, so a name
is refused (a `CsekitError`) when it could lead outside its folder: a separator where one component is
expected, `..`, an absolute path, a NUL, or an existing link that resolves outside the folder.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath
from typing import Any

from csekit.core.errors import CsekitError

NAME_MAX = 255
"""The longest file or folder name, in bytes, that common file systems hold (ext4, XFS, APFS, NTFS)."""
_SEPARATORS = {"/", "\\", os.sep, *([os.altsep] if os.altsep else [])}


def child_path(folder: str | Path, name: Any, what: str, nested: bool = False) -> Path:
    """`folder / name` for a `name` read from a file (`what` says where, for the error); never outside `folder`.

    `name` must be one path component (no separator), unless `nested`: then a relative path of components
    separated by `/` (`1_Pooling`, `2_Dense/sub`; `""` is `folder` itself). Either way `.`-only or `..`
    components, absolute paths, backslashes and NULs are refused, and so is a path whose existing part is a
    link leading outside `folder` (a link that stays inside is followed, as the reader would).
    """
    folder = Path(folder)
    check_name(name, what, nested, folder)
    target = folder.joinpath(*PurePosixPath(name).parts) if name else folder
    if target != folder and os.path.lexists(target):
        inside = Path(os.path.realpath(target)).is_relative_to(os.path.realpath(folder))
        if not inside:
            raise CsekitError(f"{what}: {name!r} leads outside {folder} (a link); csekit does not follow it")
    return target


def check_name(name: Any, what: str, nested: bool = False, folder: str | Path = "its folder") -> None:
    """Refuse (CsekitError) a `name` that could lead outside any folder it is joined to (see `child_path`).

    For checking a name when it is read (a suite file's line), before the folder exists.
    """
    if not isinstance(name, str):
        raise CsekitError(f"{what}: a name must be a string, found {type(name).__name__}")
    longest = max((len(part.encode("utf-8", "surrogatepass")) for part in name.split("/")), default=0)
    if longest > NAME_MAX:  # the OS refuses it (ENAMETOOLONG), in an OSError wherever the path is first looked at
        raise CsekitError(f"{what}: {name[:40]!r}... has a name of {longest} bytes; a file name holds {NAME_MAX}")
    problem = _name_problem(name, nested)
    if problem is not None:
        raise CsekitError(f"{what}: {name!r} leads outside {folder} (it {problem}); it must name something inside")


def _name_problem(name: str, nested: bool) -> str | None:
    if "\x00" in name:
        return "holds a NUL character"
    if not name:
        return None if nested else "is empty"
    if name.startswith(("/", "\\")) or os.path.isabs(name) or (len(name) > 1 and name[1] == ":"):
        return "is an absolute path"
    if "\\" in name or (os.altsep and os.altsep in name and os.altsep != "/"):
        return "holds a backslash"
    if not nested and any(sep in name for sep in _SEPARATORS):
        return "holds a path separator"
    parts = name.split("/")
    if any(part in ("", ".", "..") for part in parts):
        return "holds an empty, '.' or '..' component"
    return None


def check_label(text: str, what: str, table_cell: bool = True) -> None:
    """Refuse (CsekitError) a name read from a file that a report writes as it is (results.md, results.csv): a line
    break, a control or format character, or (`table_cell`) a `|`, would add a row to a Markdown table or split
    its cells."""
    bad = next((char for char in text if not char.isprintable() or (table_cell and char == "|")), None)
    if bad is not None:
        place = "a Markdown table cell" if table_cell else "a line of the report"
        raise CsekitError(f"{what}: {text!r} holds {bad!r}, which cannot stand in {place}; use printable characters")

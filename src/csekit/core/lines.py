"""Lines of a user's text file: only `\\n` (or `\\r\\n`) ends a line.

`str.splitlines` also ends lines at U+2028, U+0085, form feed, vertical tab and more, and text mode
(`open(path)`, `Path.read_text`) turns a lone `\\r` into a line end; a sentence holding one of those
would silently become two rows.
"""

from __future__ import annotations

from pathlib import Path

from csekit.core.bounded_read import TEXT_FILE_LIMIT, read_bounded_bytes


def read_lines(path: str | Path, limit: int = TEXT_FILE_LIMIT) -> list[str]:
    """The UTF-8 lines of a regular file of at most `limit` bytes (see `split_lines`); raises OSError or
    UnicodeDecodeError for the caller (a FIFO, a device, a folder or a larger file is a CsekitError)."""
    return split_lines(read_bounded_bytes(path, limit).decode("utf-8"))


def split_lines(text: str) -> list[str]:
    """The lines of `text` without their `\\n` or `\\r\\n`; no last empty line for a final newline."""
    if not text:
        return []
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]

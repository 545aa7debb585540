"""Reading SentEval's data files: whole-file decoding and Python's universal-newline lines.

I/O and decoding problems become one-line `CsekitError`s naming the file (and the line of a bad byte).
"""

from __future__ import annotations

from pathlib import Path

from csekit.core.bounded_read import TEXT_FILE_LIMIT, read_bounded_bytes
from csekit.core.errors import CsekitError, at


def read_text(path: Path, encoding: str = "utf-8") -> str:
    """Decode a whole file as SentEval does (`io.open(..., encoding=...).read()`)."""
    try:
        data = read_bounded_bytes(path, TEXT_FILE_LIMIT)
    except FileNotFoundError:
        raise CsekitError(f"{path}: file not found") from None
    except OSError as exc:
        raise CsekitError(f"{path}: cannot read ({exc.strerror})") from None
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise CsekitError(f"{at(path, line)}: not valid {encoding.upper()}") from None


def universal_lines(text: str) -> list[str]:
    """Lines as `for line in open(path)` yields them (universal newlines), without the newline."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    if lines[-1] == "":
        lines.pop()
    return lines

"""Lines of a user's text file: only `\\n` (or `\\r\\n`) ends a line.

`str.splitlines` also ends lines at U+2028, U+0085, form feed, vertical tab and more, and text-mode
file iteration at a lone `\\r`; a sentence holding one of those would silently become two rows.
"""

from __future__ import annotations


def split_lines(text: str) -> list[str]:
    """The lines of `text` without their `\\n` or `\\r\\n`; no last empty line for a final newline."""
    if not text:
        return []
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]

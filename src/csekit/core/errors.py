"""User-facing errors.

A `CsekitError` is a mistake in the user's input (a file, a flag, a recipe key). The CLI prints its
message as one line and exits non-zero; it never shows a traceback. Messages name the file, line or
key at fault, and say what to do.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable
from pathlib import Path


class CsekitError(Exception):
    """An error caused by user input, reported as one line without a traceback.

    The message is one line by construction: a value quoted in it (a `--set` text, a name or a line from a file
    csekit did not write) may hold a line break or a control character, which is written as its escape (`\\n`).
    """

    def __init__(self, message: object = "") -> None:
        super().__init__(one_line(_raised_message(str(message))))


_LINE_BREAKS = {chr(code) for code in (*range(0x20), 0x7F, 0x85, 0x2028, 0x2029)} - {"\t"}
"""Characters that end a line (`str.splitlines`) or drive a terminal: the C0 controls but the tab, DEL, NEL and
the Unicode line and paragraph separators."""


def one_line(text: str) -> str:
    """`text` with each character of `_LINE_BREAKS` written as its escape: one line on any terminal."""
    return "".join(ascii(char)[1:-1] if char in _LINE_BREAKS else char for char in text)


def _raised_message(text: str) -> str:
    """The original message of a CsekitError a DataLoader worker raised (see `message_line`), else `text`."""
    lines = [line for line in text.split("\n") if line.strip()]
    prefix = f"{CsekitError.__module__}.{CsekitError.__qualname__}: "
    if len(lines) > 1 and lines[0].startswith("Caught ") and lines[-1].startswith(prefix):
        return lines[-1].removeprefix(prefix)
    return text


MESSAGE_LIMIT = 2000
"""The most characters of an error message printed: the start names the file, line or key."""


def message_line(error: CsekitError) -> str:
    """The error's one-line message, also when a DataLoader worker raised it.

    PyTorch re-raises a worker's exception as the same type with "Caught X in DataLoader worker
    process N." and the worker's whole traceback as its message; the original message is the
    traceback's last line.
    """
    text = one_line(_raised_message(str(error)))  # a subclass may set its message otherwise
    if len(text) > MESSAGE_LIMIT:  # a library's message may quote a whole value from a file or a flag
        text = f"{text[:MESSAGE_LIMIT]}... ({len(text) - MESSAGE_LIMIT:,} more characters not shown)"
    return text


def at(path: str | Path, line: int | None = None) -> str:
    """Format a location as `path:line` (or just `path`) for error messages."""
    return f"{path}:{line}" if line is not None else str(path)


def absolute(path: str | Path) -> str:
    """The full path a relative `path` means from the current folder (`..` folded, links kept), for a message that
    says a path does not exist: a relative one would not say where it was looked for."""
    return os.path.abspath(os.path.expanduser(path))


def did_you_mean(word: str, choices: Iterable[str], prefix: str = "") -> str:
    """Return ' (did you mean "x"?)' for the closest choice, or '' when nothing is close.

    Case is ignored when comparing (`CLS` is close to `cls`), and the choice is given as it is spelled.
    """
    by_lower = {choice.lower(): choice for choice in choices}
    close = difflib.get_close_matches(word.lower(), list(by_lower), n=1, cutoff=0.6)
    return f' (did you mean "{prefix}{by_lower[close[0]]}"?)' if close else ""

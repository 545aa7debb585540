"""Saving: every failure of a save is one line that names the folder and says what is intact.

A full disk or a file-size limit (`ulimit -f`) reaches csekit as different exceptions depending on
the writer: `OSError` from Python's own writes and from numpy ("10000 requested and 109 written"),
`RuntimeError` from torch.save's zip writer ("unexpected pos 576 vs 534"), `SafetensorError` from
safetensors ("I/O error: File too large"). Every save path runs inside `guarded_save`, which turns
each of them into one `SaveFailed` line naming what was written, the folder and what is intact. The
atomic writes (`core/atomic.py`) are what make that last statement true: a failed write leaves the
previous version under the target name. `tests/invariants/architecture/test_architecture.py` finds every save call
in `src/` that no guard encloses.

Guards nest: the innermost one names the file or folder that failed and the writer's reason, the
outermost one says what is intact (the trainer knows its last good checkpoint; `SentenceEncoder.save`
alone only knows that the previous folder is kept).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

from safetensors import SafetensorError

from csekit.core.errors import CsekitError

SAVE_ERRORS: tuple[type[BaseException], ...] = (OSError, RuntimeError, SafetensorError)
"""What a failed write raises: Python and numpy (OSError), torch.save (RuntimeError), safetensors."""


class SaveFailed(CsekitError):
    """A save did not complete: what, where and why (kept when an outer guard says what is intact)."""

    def __init__(self, what: str, folder: str | Path, reason: str, intact: str) -> None:
        super().__init__(f"cannot write {what} in {folder} ({reason}); {intact}")
        self.what, self.folder, self.reason = what, folder, reason


def failure_reason(error: BaseException) -> str:
    """The writer's reason in a few words: the OS's text ("No space left on device", "File too large") for an
    OSError that has one; else the message's first line, which for torch and numpy does not say why."""
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    text = str(error).strip().splitlines()
    first = (text[0] if text else type(error).__name__)[:200]
    return f"{type(error).__name__}: {first}; a full disk or a file-size limit?"


@contextlib.contextmanager
def guarded_save(what: str, folder: str | Path, intact: str | Callable[[], str]) -> Iterator[None]:
    """Any failure of the writes in the block is one `SaveFailed` line: `cannot write WHAT in FOLDER (...); INTACT`.

    `intact` says what the user still has (the last good checkpoint, the previous file) and what to do; a
    function is asked at the time of the failure (a long run's last good checkpoint changes). Errors that
    are already one line (a `CsekitError` other than a save failure) pass through unchanged.
    """
    try:
        yield
    except SaveFailed as error:
        raise SaveFailed(error.what, error.folder, error.reason, _text(intact)) from None
    except CsekitError:
        raise
    except SAVE_ERRORS as error:
        raise SaveFailed(what, folder, failure_reason(error), _text(intact)) from None


def _text(intact: str | Callable[[], str]) -> str:
    return intact if isinstance(intact, str) else intact()


@contextlib.contextmanager
def saves_keep(intact: str | Callable[[], str]) -> Iterator[None]:
    """Around a long task whose saves are each guarded (a training loop): a save failure in it says `intact`.

    Only `SaveFailed` is reworded; any other error passes through as it is (a RuntimeError of a forward
    pass is not a full disk).
    """
    try:
        yield
    except SaveFailed as error:
        raise SaveFailed(error.what, error.folder, error.reason, _text(intact)) from None

"""`csekit encode`'s input and its rows: the sentence file read and checked before the model loads, and unit-length
rows for `--normalize` (a dot product of two of them is their cosine, what vector stores and FAISS's inner-product
indexes expect)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from csekit.core.bounded_read import TEXT_FILE_LIMIT, read_bounded_bytes
from csekit.core.errors import CsekitError, absolute
from csekit.core.lines import split_lines

if TYPE_CHECKING:
    import numpy as np

EMBEDDING_FORMATS = (".npy", ".txt", ".tsv")
"""What `csekit encode --output` writes, by the file's suffix."""


def check_embedding_format(output: Path) -> None:
    """Refuse an --output suffix that names no format, before the model loads."""
    if output.suffix.lower() not in EMBEDDING_FORMATS:
        raise CsekitError(f"--output {output}: write .npy (a float32 matrix) or .txt/.tsv (tab-separated text)")


def read_sentences(path: Path) -> list[str]:
    """The lines of `path`, one sentence each; a missing, unreadable or non-UTF-8 file is one line."""
    try:
        data = read_bounded_bytes(path, TEXT_FILE_LIMIT)
    except FileNotFoundError:
        raise CsekitError(f"input {absolute(path)} does not exist") from None
    except OSError as error:
        raise CsekitError(f"input {path}: cannot read it ({error.strerror})") from None
    try:
        return split_lines(data.decode("utf-8"))
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise CsekitError(f"{path}:{line}: not valid UTF-8") from None


def unit_length(rows: np.ndarray) -> np.ndarray:
    """Each row divided by its Euclidean length (float32); a zero row stays zero (it has no direction)."""
    import numpy as np

    rows = np.asarray(rows, dtype=np.float32).copy()
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    np.divide(rows, norms, out=rows, where=norms > 0)
    return rows

"""A user's own scored sentence pairs (`csekit evaluate --pairs FILE`): read a TSV, CSV or JSON-lines file and
score it as SentEval scores STS-B (Spearman and Pearson of the cosine similarity against the gold scores).

The file is untrusted: read line by line through `core/bounded_read.py` (at most `PAIRS_LINE_LIMIT` bytes a
line), JSON rows through `core/json_lines.py`. A file that cannot be scored (no header naming the columns, a
row with too few fields, a score that is not a number, no pairs at all, a line too long) is one `CsekitError`
naming the file and line, and the likely cause where the file's shape shows it: a file separated by `;` (its
header is one column), an unquoted comma in a CSV row (more fields than the header), the first pair of a file
without a header read as its header (a number among the names), a header read as a pair (--pairs-columns gives
numbers, and the first line's score is no number). A row that is merely incomplete (an empty sentence, an empty
score) is skipped and reported with its reason, so a few holes in a large file do not stop the evaluation.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from csekit.core.errors import CsekitError, at
from csekit.core.json_lines import RowProblem, json_row, numbered_lines

PAIRS_LINE_LIMIT = 2**20
"""The longest line of a pairs file read (1 MiB; a pair of sentences is a few hundred bytes)."""
DEFAULT_COLUMNS = ("sentence1", "sentence2", "score")
JSON_SUFFIXES = (".jsonl", ".json", ".ndjson")
DELIMITERS = {".tsv": "\t", ".csv": ","}

Encoder = Callable[[list[str]], np.ndarray]


@dataclass(frozen=True)
class Skipped:
    """A line of a pairs file left out of the score, and why."""

    line: int
    reason: str


@dataclass(frozen=True)
class PairsFile:
    """The scored pairs of one file (sentences whitespace-normalised as SentEval does) and the lines skipped."""

    path: Path
    sentences1: list[str]
    sentences2: list[str]
    scores: list[float]
    skipped: list[Skipped]


def parse_columns(text: str | None, what: str = "--pairs-columns") -> tuple[str, str, str] | tuple[int, int, int]:
    """`--pairs-columns`: three column names (`query,passage,label`) or three 1-based column numbers for a file
    without a header (`1,2,3`); None is the default names. `what` names the option in errors (a recipe's or a
    suite's `columns:` are read by this same rule)."""
    if text is None:
        return DEFAULT_COLUMNS
    parts = [part.strip() for part in text.split(",")]
    if len(parts) != 3 or not all(parts):
        raise CsekitError(f'{what} "{text}": give three columns, sentence1,sentence2,score (names or numbers)')
    if all(part.isdigit() for part in parts):
        numbers = tuple(int(part) for part in parts)
        if min(numbers) < 1 or len(set(numbers)) != 3:
            raise CsekitError(f'{what} "{text}": column numbers start at 1 and differ')
        return numbers  # type: ignore[return-value]
    if len(set(parts)) != 3:
        raise CsekitError(f'{what} "{text}": name three different columns')
    return parts[0], parts[1], parts[2]


def read_pairs(path: Path, columns: tuple[str, str, str] | tuple[int, int, int] = DEFAULT_COLUMNS) -> PairsFile:
    """The pairs of `path`, a `.tsv`, `.csv` or JSON-lines (`.jsonl`) file; see the module's docstring."""
    suffix = path.suffix.lower()
    if suffix not in (*JSON_SUFFIXES, *DELIMITERS):
        raise CsekitError(f"pairs file {path}: name it .tsv, .csv or .jsonl (its suffix says how it is read)")
    if suffix in JSON_SUFFIXES and isinstance(columns[0], int):
        raise CsekitError(
            f"pairs file {path}: a JSON-lines file names its fields; give the columns (--pairs-columns, columns:) "
            "as names"
        )
    reader = _PairsReader(path, columns, DELIMITERS.get(suffix))
    for number, line in numbered_lines(path, "pairs file", PAIRS_LINE_LIMIT):
        reader.add(number, line)
    return reader.result()


class _PairsReader:
    """The rows of one pairs file, line by line: the header (delimited files), then each pair."""

    def __init__(self, path: Path, columns: tuple[str, str, str] | tuple[int, int, int], delimiter: str | None):
        self.path, self.columns, self.delimiter = path, columns, delimiter
        self.positions: tuple[int, ...] | None = None
        self.numbered = delimiter is not None and isinstance(columns[0], int)
        if self.numbered:
            self.positions = tuple(int(column) - 1 for column in columns)  # no header: the columns by number
        self.header_width: int | None = None  # the header's fields: a row with more has a stray separator
        self.first_line: int | None = None  # the first line that is not blank (a header, or a pair without one)
        self.sentences1: list[str] = []
        self.sentences2: list[str] = []
        self.scores: list[float] = []
        self.skipped: list[Skipped] = []

    def add(self, number: int, raw: bytes) -> None:
        where = at(self.path, number)
        try:
            text = raw.decode("utf-8").rstrip("\r\n")
            if number == 1:
                text = text.removeprefix("\ufeff")  # the byte-order mark spreadsheets write before a CSV's header
        except UnicodeDecodeError:
            raise CsekitError(f"{where}: not valid UTF-8") from None
        if not text.strip():
            return
        self.first_line = self.first_line or number
        if self.delimiter is None:
            values = self._json_values(text, where)
        elif self.positions is None:
            self._header(self._fields(text, where), where)
            return
        else:
            fields = self._fields(text, where)
            if len(fields) <= max(self.positions):
                raise CsekitError(
                    f"{where}: {len(fields)} fields, but the pairs are read from column {max(self.positions) + 1}"
                )
            self._check_width(fields, where)
            values = tuple(fields[position] for position in self.positions)
        self._pair(number, where, values)

    def _fields(self, text: str, where: str) -> list[str]:
        if self.delimiter == "\t":
            return text.split("\t")
        try:
            return next(csv.reader([text], strict=True))
        except csv.Error as error:
            raise CsekitError(f"{where}: not a CSV row ({error}; a quoted field cannot span lines)") from None

    def _header(self, fields: list[str], where: str) -> None:
        names = [field.strip() for field in fields]
        missing = [name for name in self.columns if name not in names]
        if missing:
            cause = _header_cause(names, self.delimiter or "")
            if cause is not None:
                raise CsekitError(f"{where}: {cause}")
            raise CsekitError(
                f"{where}: the header names {', '.join(names)}, not {', '.join(map(str, missing))}; a pairs file's "
                f"header names {', '.join(map(str, self.columns))} "
                "(or give the columns: --pairs-columns, or columns: in a task's mapping)"
            )
        self.positions = tuple(names.index(str(name)) for name in self.columns)
        self.header_width = len(names)

    def _check_width(self, fields: list[str], where: str) -> None:
        """A row with more (non-empty) fields than the header has a separator inside a sentence: every later column
        would be read shifted, a sentence as the score."""
        width = self.header_width
        if width is None or len(fields) <= width or not any(field.strip() for field in fields[width:]):
            return
        if self.delimiter == ",":
            cause = 'an unquoted comma in a sentence? quote a field that holds one: "a man, a plan"'
        else:
            cause = "a tab inside a sentence? replace it with a space"
        raise CsekitError(f"{where}: {len(fields)} fields, but the header names {width}: {cause}")

    def _json_values(self, text: str, where: str) -> tuple[Any, Any, Any]:
        first, second, score = (str(name) for name in self.columns)
        try:
            row = json_row(text, {first: str, second: str}, {score: (int, float, str, type(None))})
        except RowProblem as problem:
            raise CsekitError(f"{where}: {problem}") from None
        return row[first], row[second], row.get(score)

    def _pair(self, number: int, where: str, values: tuple[Any, Any, Any]) -> None:
        first, second, score = values
        sentence1, sentence2 = " ".join(first.split()), " ".join(second.split())
        if not sentence1 or not sentence2:
            self.skipped.append(Skipped(number, f"an empty {'sentence1' if not sentence1 else 'sentence2'}"))
            return
        if score is None or (isinstance(score, str) and not score.strip()):
            self.skipped.append(Skipped(number, "no score"))
            return
        if self.numbered and number == self.first_line and not _is_number(score):
            names = tuple(str(value).strip()[:40] for value in values)
            fix = "leave --pairs-columns out" if names == DEFAULT_COLUMNS else f"give --pairs-columns {','.join(names)}"
            raise CsekitError(
                f'{where}: the score (column {self.columns[2]}) "{str(score)[:80]}" is not a number: this first line '
                f"looks like a header, read as a pair because --pairs-columns gives column numbers; {fix}"
            )
        value = _score(score, where, str(self.columns[2]))
        self.sentences1.append(sentence1)
        self.sentences2.append(sentence2)
        self.scores.append(value)

    def result(self) -> PairsFile:
        if len(self.scores) < 2:
            found = "no scored pairs" if not self.scores else "one scored pair"
            skipped = f" ({len(self.skipped)} lines skipped)" if self.skipped else ""
            raise CsekitError(f"pairs file {self.path}: {found}{skipped}; a correlation needs at least two")
        return PairsFile(self.path, self.sentences1, self.sentences2, self.scores, self.skipped)


SEPARATORS = {",": "comma", ";": "semicolon", "\t": "tab", "|": "vertical bar"}
"""Separators a pairs file could be written with, by name."""
SUFFIX_OF = {",": ".csv", "\t": ".tsv"}


def _header_cause(names: list[str], delimiter: str) -> str | None:
    """Why a header does not name the columns, when its shape says: one column holding another separator (a
    `;`-separated CSV, as spreadsheets write where the decimal mark is a comma), or a number among its names (the
    first pair of a file without a header)."""
    found = [mark for mark in SEPARATORS if mark != delimiter and mark in names[0]] if len(names) == 1 else []
    if found:
        mark, own = found[0], SEPARATORS[delimiter]
        fix = (
            f"name it {SUFFIX_OF[mark]}" if mark in SUFFIX_OF else f"save it {own}-separated, or tab-separated as .tsv"
        )
        return (
            f'the header "{names[0][:80]}" is one column holding {mark!r}: the file looks '
            f"{SEPARATORS[mark]}-separated, and a {SUFFIX_OF[delimiter]} file is read {own}-separated; {fix}"
        )
    numbers = [name for name in names if _is_number(name)]
    if numbers:
        return (
            f'this first line looks like a pair, not a header ("{numbers[0][:40]}" is a number): a file without a '
            "header needs --pairs-columns with column numbers (e.g. 1,2,3)"
        )
    return None


def _is_number(value: Any) -> bool:
    """Whether a score field reads as a finite number."""
    try:
        return math.isfinite(float(value.strip() if isinstance(value, str) else value))
    except (TypeError, ValueError, OverflowError):  # an integer of 400 digits overflows a float
        return False


def _score(value: Any, where: str, column: str) -> float:
    """A gold score: a finite number of any range, or one line saying what the value is instead."""
    try:
        number = float(value.strip() if isinstance(value, str) else value)
    except ValueError:
        raise CsekitError(f'{where}: the score ({column}) "{str(value)[:80]}" is not a number') from None
    except OverflowError:  # an integer of 400 digits
        raise CsekitError(f'{where}: the score ({column}) "{str(value)[:80]}" is not a finite number') from None
    if not math.isfinite(number):
        raise CsekitError(f'{where}: the score ({column}) "{value}" is not a finite number')
    return number


def cosines(encode: Encoder, pairs: PairsFile) -> np.ndarray:
    """The cosine similarity of each pair (encoded in one call, each distinct sentence once); NaN becomes 0 as in
    SentEval."""
    index = {sentence: row for row, sentence in enumerate(dict.fromkeys([*pairs.sentences1, *pairs.sentences2]))}
    emb = np.nan_to_num(np.asarray(encode(list(index)), dtype=np.float32))
    u = emb[[index[s] for s in pairs.sentences1]]
    v = emb[[index[s] for s in pairs.sentences2]]
    with np.errstate(divide="ignore", invalid="ignore"):
        cos = np.einsum("ij,ij->i", u, v) / (np.linalg.norm(u, axis=1) * np.linalg.norm(v, axis=1))
    return np.nan_to_num(cos)


def score_pairs(encode: Encoder, pairs: PairsFile) -> dict[str, float]:
    """Spearman and Pearson (fractions; x 100 when printed) of the cosines against the gold scores, as SentEval's
    STS-B, the number of pairs scored and of lines skipped."""
    from scipy.stats import pearsonr, spearmanr  # a second of imports: not for reading (and refusing) a file

    sims, gold = cosines(encode, pairs).astype(np.float64), np.asarray(pairs.scores, dtype=np.float64)
    return {
        "spearman": float(spearmanr(sims, gold)[0]),
        "pearson": float(pearsonr(sims, gold)[0]) if np.ptp(sims) > 0 and np.ptp(gold) > 0 else math.nan,
        "pairs": len(pairs.scores),
        "skipped": len(pairs.skipped),
    }


def skipped_lines(pairs: Sequence[Skipped], limit: int = 100) -> list[dict[str, Any]]:
    """The first `limit` skipped lines as JSON rows (line, reason) for a report."""
    return [{"line": skip.line, "reason": skip.reason} for skip in pairs[:limit]]

"""JSON-lines files from elsewhere: one JSON object a line, its fields' types checked, errors naming file and line.

A `.jsonl` corpus, `csekit augment`'s output read back on a restart, a `--paraphrases` file, a probe set and a
run's `metrics.jsonl` are each a JSON object per line. Anyone may have written them, so a row may be a list, a
string, a number, an object whose fields have other types, or brackets nested 100,000 deep (Python's JSON
parser then raises RecursionError). Every such row is parsed here
(`tests/invariants/architecture/test_architecture_inputs.py` finds any other `json.loads` in `src/`): a row is a
JSON object whose named fields have the named types, or it is one line saying what it is instead.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from csekit.core.bounded_read import RepeatedKey, bounded_lines, decode_json, open_regular
from csekit.core.errors import CsekitError, absolute, at

JSON_LINE_LIMIT = 2**20
"""The longest line of a JSON-lines file read (1 MiB; a row of sentences is a few hundred bytes)."""

FieldTypes = Mapping[str, type | tuple[type, ...]]
"""Field name -> the Python type(s) its JSON value must have (`type(None)` for null)."""

NO_FIELDS: FieldTypes = MappingProxyType({})

_KINDS = {dict: "an object", list: "a list", str: "a string", bool: "true or false", int: "an integer",
          float: "a number", type(None): "null"}  # fmt: skip


class RowProblem(ValueError):
    """What is wrong with one JSON-lines row (without its file and line: the caller knows them)."""


def _kind(value: Any) -> str:
    return _KINDS.get(type(value), type(value).__name__)


def _fits(value: Any, types: type | tuple[type, ...]) -> bool:
    """isinstance, except that true/false is not a number (JSON's `true` is not the integer 1)."""
    allowed = types if isinstance(types, tuple) else (types,)
    return bool in allowed if isinstance(value, bool) else isinstance(value, allowed)


def _names(types: type | tuple[type, ...]) -> str:
    return " or ".join(_KINDS.get(kind, kind.__name__) for kind in (types if isinstance(types, tuple) else (types,)))


def json_row(line: str | bytes, required: FieldTypes = NO_FIELDS, optional: FieldTypes = NO_FIELDS) -> dict[str, Any]:
    """The JSON object of one line: `required` fields present with their types, `optional` ones (when present)
    with theirs; anything else is a RowProblem saying what the row is instead."""
    try:
        row = decode_json(line.decode("utf-8") if isinstance(line, bytes) else line)
    except RepeatedKey as error:
        raise RowProblem(str(error)) from None
    except json.JSONDecodeError as error:
        raise RowProblem(f"not valid JSON ({error.msg})") from None
    except UnicodeDecodeError:
        raise RowProblem("not valid UTF-8") from None
    except RecursionError:
        raise RowProblem("JSON nested too deeply") from None
    except ValueError as error:  # an integer past Python's 4,300 digits (json.loads converts it whole)
        raise RowProblem(f"a number too long to read ({str(error)[:60]})") from None
    if not isinstance(row, dict):
        raise RowProblem(f"not a JSON object ({{...}}) but {_kind(row)}")
    for name, types in required.items():
        if name not in row:
            raise RowProblem(f'missing field "{name}" ({_names(types)})')
    for name, types in (*required.items(), *optional.items()):
        if name in row and not _fits(row[name], types):
            raise RowProblem(f'field "{name}" is {_kind(row[name])}, not {_names(types)}')
    return row


def parse_json_row(
    line: str | bytes,
    where: str,
    required: FieldTypes = NO_FIELDS,
    optional: FieldTypes = NO_FIELDS,
) -> dict[str, Any]:
    """`json_row`, a problem a CsekitError starting with `where` (FILE:LINE)."""
    try:
        return json_row(line, required, optional)
    except RowProblem as problem:
        raise CsekitError(f"{where}: {problem}") from None


def json_rows(
    path: str | Path,
    what: str,
    required: FieldTypes = NO_FIELDS,
    optional: FieldTypes = NO_FIELDS,
    limit: int = JSON_LINE_LIMIT,
) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, row) of each non-blank line of the JSON-lines file `path`, streamed and bounded (`limit`
    bytes a line); a missing, unreadable or special file, a longer line or a bad row is a CsekitError naming
    the file (and line) and `what` it is."""
    for number, line in numbered_lines(path, what, limit):
        if line.strip():
            yield number, parse_json_row(line, at(path, number), required, optional)


def numbered_lines(path: Path, what: str, limit: int) -> Iterator[tuple[int, bytes]]:
    """(line number, line) of the file `path` of rows of `what`, streamed and bounded (`limit` bytes a line); a
    missing, unreadable or special file or a longer line is a CsekitError naming the file (and line)."""
    try:
        handle = open_regular(path)
    except FileNotFoundError:
        raise CsekitError(f"{what} {absolute(path)} does not exist") from None
    except OSError as error:
        raise CsekitError(f"{what} {path}: cannot read it ({error.strerror or error})") from None
    with handle:
        for number, (line, size) in enumerate(bounded_lines(handle, limit), start=1):
            if line is None:
                raise CsekitError(f"{at(path, number)}: a line of {size:,} bytes, more than a {what} row can be")
            yield number, line

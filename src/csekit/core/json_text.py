"""JSON that every JSON reader accepts: a score that is not a number (a Spearman correlation of constant
embeddings is NaN) is written as `null`, never as the bare `NaN` that Python's json module writes by default."""

from __future__ import annotations

import json
import math
from typing import Any


def finite_or_null(value: Any) -> Any:
    """`value` with every non-finite float (NaN, +-inf) inside dicts, lists and tuples replaced by None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: finite_or_null(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite_or_null(item) for item in value]
    return value


def json_text(value: Any, **options: Any) -> str:
    """`json.dumps` of `value` with non-finite floats as null (standard JSON, `allow_nan=False` holds)."""
    return json.dumps(finite_or_null(value), allow_nan=False, **options)

"""Text written into a report's table (results.md, results.csv, a model card, a printed score table): the one place
it is escaped.

A name in a report may come from a file csekit did not write (a suite's recipe names, a task named after a user's
file, a run folder's results.json): a line break, a `|` or a control character in it would add a row to a
Markdown table or split its cells, and a CSV cell starting with `=`, `+`, `-` or `@` is run as a formula by a
spreadsheet. Every table row goes through `markdown_row`, and every text cell of a CSV row through `csv_text`
(`tests/invariants/test_report_cells.py` checks the source for rows built by hand).
"""

from __future__ import annotations

from collections.abc import Iterable

_MARKDOWN_SPECIAL = {"\\": "\\\\", "|": "\\|"}
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r", "\n")


def _visible(char: str) -> str:
    """A printable character as it is; any other (a line break, a control or format character) as its escape."""
    return char if char.isprintable() else ascii(char)[1:-1]


def markdown_cell(value: object) -> str:
    """`value` as the text of one Markdown table cell: `\\` and `|` backslash-escaped (GitHub's tables read them as
    the characters themselves), and line breaks and other unprintable characters written as their escapes (`\\n`),
    so the cell stays one cell of one row (`<` stays as it is: `p < 0.001` reads as written)."""
    return "".join(_MARKDOWN_SPECIAL.get(char) or _visible(char) for char in str(value))


def markdown_row(cells: Iterable[object]) -> str:
    """One Markdown table row of `cells`, each escaped by `markdown_cell`."""
    return "| " + " | ".join(markdown_cell(cell) for cell in cells) + " |"


def markdown_rule(columns: int) -> str:
    """The line under a Markdown table's header row."""
    return "|" + "|".join("---" for _ in range(columns)) + "|"


def csv_text(value: object) -> str:
    """`value` as a text cell of a CSV file: one starting with a formula character gets a leading `'` (a
    spreadsheet shows it as text instead of running it); unprintable characters are written as escapes."""
    text = "".join(_visible(char) for char in str(value))
    return "'" + text if str(value).startswith(_FORMULA_STARTS) else text

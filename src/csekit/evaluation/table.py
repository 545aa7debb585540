"""The papers' result tables: one row of scores x 100 with two decimals, '-' for what was not run."""

from __future__ import annotations

from collections.abc import Sequence

from csekit.core.report_cells import markdown_cell, markdown_row


def score_table(heads: Sequence[str], values: Sequence[float | None]) -> str:
    """A Markdown table with one header row and one row of scores (given in [0, 1] or [-1, 1])."""
    cells = ["-" if v is None else f"{100 * v:.2f}" for v in values]
    widths = [max(len(markdown_cell(h)), len(c)) for h, c in zip(heads, cells, strict=True)]

    def row(items: Sequence[str]) -> str:  # right-aligned: padded by the width each cell has once escaped
        return markdown_row(" " * (w - len(markdown_cell(s))) + s for s, w in zip(items, widths, strict=True))

    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([row(heads), rule, row(cells)])

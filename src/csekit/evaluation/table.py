"""The papers' result tables: one row of scores x 100 with two decimals, '-' for what was not run."""

from __future__ import annotations

from collections.abc import Sequence


def score_table(heads: Sequence[str], values: Sequence[float | None]) -> str:
    """A Markdown table with one header row and one row of scores (given in [0, 1] or [-1, 1])."""
    cells = ["-" if v is None else f"{100 * v:.2f}" for v in values]
    widths = [max(len(h), len(c)) for h, c in zip(heads, cells, strict=True)]

    def row(items: Sequence[str]) -> str:
        return "| " + " | ".join(s.rjust(w) for s, w in zip(items, widths, strict=True)) + " |"

    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([row(heads), rule, row(cells)])

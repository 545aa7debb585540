"""Numbers as a person reads them in progress lines: a small loss is never shown as 0.0000.

A fixed `{:.4f}` prints every loss below 5e-5 as 0.0000, which reads as "the loss is zero" (a collapsed or
finished run) when it is merely small: a converged contrastive loss on an easy corpus, an auxiliary term scaled
by a small weight. Four significant digits keep the same width for ordinary losses (0.6931, 2.303) and say
how small a small one is (1.234e-05).
"""

from __future__ import annotations

import math
from typing import Any

LOSS_DIGITS = 4
"""Significant digits of a shown loss."""
SCIENTIFIC_BELOW = 1e-3
"""A nonzero loss smaller than this (in absolute value) is shown in scientific notation: 1.234e-04."""


def format_loss(value: float) -> str:
    """`value` with 4 significant digits: 0.6931, 2.303, 12.35; below 1e-3 in scientific notation (1.234e-05).

    Zero is 0.000, and NaN and infinities are nan, inf, -inf (a diverged run says so).
    """
    if not math.isfinite(value):
        return str(value)
    if value != 0 and abs(value) < SCIENTIFIC_BELOW:
        return f"{value:.{LOSS_DIGITS - 1}e}"
    return f"{value:#.{LOSS_DIGITS}g}".removesuffix(".")  # '#' keeps trailing zeros; 1234. loses its point


def is_finite_number(value: Any) -> bool:
    """Whether `value` (read from a file or a flag) is a number csekit can compute with: an int or a float, not a
    bool, finite as a float. JSON and YAML read an integer of any length: one of 400 digits overflows a float
    (`math.isfinite` raised OverflowError, a traceback), so it is not one."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False

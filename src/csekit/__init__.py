"""csekit: unsupervised contrastive sentence-embedding learning as composable parts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__version__ = "0.1.0"


def register_part(kind: str, name: str, factory: Callable[..., Any]) -> None:
    """Let recipes name your own part: `kind` is head, views, negatives, weighting or objective.

    Call it before `csekit.training.train`; see `csekit.parts` for the entry-point alternative
    (which also reaches the `csekit` command). Recipes never import code by themselves.
    """
    from csekit.parts import register_part as register

    register(kind, name, factory)

"""csekit: unsupervised contrastive sentence-embedding learning as composable parts."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def register_part(kind: str, name: str, factory: Any) -> None:
    """Let recipes (and commands) name your own part.

    `kind` is one of pooler, views, head, negatives, weighting, objective, engine, task. Call it
    before `csekit.training.trainer.train`; the entry-point alternative (which also reaches the
    `csekit` command) is described in `csekit.core.registry`. Recipes never import code by themselves.
    """
    from csekit.core.registry import register_part as register

    register(kind, name, factory)

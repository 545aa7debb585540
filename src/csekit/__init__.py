"""csekit: unsupervised contrastive sentence-embedding learning as composable parts.

The public API, importable from here (loaded on first use, so `import csekit` stays cheap):
`SentenceEncoder` (load, encode, save), `load_recipe`, `train` and `register_part`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from csekit.core.version import __version__

if TYPE_CHECKING:
    from csekit.encoding.encoder import SentenceEncoder
    from csekit.training.recipe import load_recipe
    from csekit.training.trainer import train

_PUBLIC = {
    "SentenceEncoder": "csekit.encoding.encoder",
    "load_recipe": "csekit.training.recipe",
    "train": "csekit.training.trainer",
}

__all__ = ["SentenceEncoder", "__version__", "load_recipe", "register_part", "train"]


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        import importlib

        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'csekit' has no attribute {name!r}")


def register_part(kind: str, name: str, factory: Any) -> None:
    """Let recipes (and commands) name your own part.

    `kind` is one of pooler, views, head, negatives, weighting, objective, engine, task. Call it
    before `csekit.train`; the entry-point alternative (which also reaches the `csekit` command)
    is described in `csekit.core.registry`. Recipes never import code by themselves.
    """
    from csekit.registries import register_part as register

    register(kind, name, factory)

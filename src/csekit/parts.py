"""Which parts a recipe may name: csekit's own, registered ones, and installed plugins.

A recipe is data that may come from anyone, so it only *names* parts; it never points at Python
code. A user's own part comes in through Python, in one of two ways:

* `csekit.register_part("objective", "my_loss", MyLoss)` in the script that then calls `train`;
* an entry point in the group `csekit.parts` of an installed package, named `KIND.NAME`, e.g. in
  pyproject.toml: `[project.entry-points."csekit.parts"] "objective.my_loss" = "mypkg.losses:MyLoss"`.
  It works with the `csekit` command and with launchers that start several processes; the package
  is imported only when a recipe names the part.

Kinds: head (`model.head`), views (`data.views`), negatives, weighting and objective (`objectives`).
"""

from __future__ import annotations

import importlib.metadata
import re
from collections.abc import Callable
from typing import Any

from csekit.errors import CsekitError, did_you_mean

PART_KINDS = ("head", "views", "negatives", "weighting", "objective")
ENTRY_POINT_GROUP = "csekit.parts"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


def _table(kind: str) -> dict[str, Any]:
    """The built-in table of `kind` (imported here: model.py imports this module)."""
    if kind not in PART_KINDS:
        raise CsekitError(f'unknown part kind "{kind}"{did_you_mean(kind, PART_KINDS)}; choose {", ".join(PART_KINDS)}')
    from csekit.heads import HEADS
    from csekit.model import NEGATIVES, WEIGHTINGS
    from csekit.objectives import OBJECTIVES
    from csekit.views import VIEWS

    tables: dict[str, dict[str, Any]] = {
        "head": HEADS,
        "views": VIEWS,
        "negatives": NEGATIVES,
        "weighting": WEIGHTINGS,
        "objective": OBJECTIVES,
    }
    return tables[kind]


def register_part(kind: str, name: str, factory: Callable[..., Any]) -> None:
    """Make `factory` (a part class or function) available to recipes as `name` among parts of `kind`.

    Registering the same factory twice is harmless; a name that already means another part
    (csekit's own or a registered one) is refused, so a registration never changes a method.
    """
    table = _table(kind)
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise CsekitError(f'part name "{name}": use letters, digits, "_" and "-" (it is written in recipes)')
    if not callable(factory):
        raise CsekitError(f'part "{name}": the factory must be a class or function, not {type(factory).__name__}')
    existing = table.get(name)
    if existing is not None and existing is not factory:
        raise CsekitError(f'part name "{name}" is taken by another {kind} part; choose another name')
    table[name] = factory


def available_parts(kind: str) -> dict[str, Any]:
    """The parts of `kind` a recipe may name; installed plugins appear as entry points, loaded when built."""
    available = dict(_table(kind))
    for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        entry_kind, _, name = entry.name.partition(".")
        if entry_kind == kind and _NAME.fullmatch(name) and name not in available:
            available[name] = entry
    return available

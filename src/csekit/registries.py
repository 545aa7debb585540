"""Every kind's registry by kind: the `KIND` of `csekit.register_part` and of a `KIND.NAME` entry point.

Each registry lives with its kind (`csekit.core.registry` is only the generic `Registry`); this module,
at the top of the layers, gathers them. Importing it imports every kind's package.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from csekit.core.errors import CsekitError, did_you_mean
from csekit.core.registry import Registry
from csekit.encoding.pooling import POOLERS
from csekit.evaluation.tasks import EVAL_TASKS
from csekit.parts.heads import HEADS
from csekit.parts.negatives import NEGATIVES
from csekit.parts.objectives import OBJECTIVES
from csekit.parts.views import VIEWS
from csekit.parts.weighting import WEIGHTINGS
from csekit.prep.paraphrase import ENGINES

REGISTRIES: Mapping[str, Registry[Any]] = {
    registry.kind: registry
    for registry in (POOLERS, VIEWS, HEADS, NEGATIVES, WEIGHTINGS, OBJECTIVES, ENGINES, EVAL_TASKS)
}
"""Every registry by kind."""


def registry(kind: str) -> Registry[Any]:
    """The registry of `kind`, or one line naming the kinds."""
    if kind not in REGISTRIES:
        raise CsekitError(f'unknown part kind "{kind}"{did_you_mean(kind, REGISTRIES)}; choose {", ".join(REGISTRIES)}')
    return REGISTRIES[kind]


def register_part(kind: str, name: str, factory: Any) -> None:
    """Make `factory` (a part class or function; an `EvalTask` for kind `task`) available as `name`.

    Registering the same factory twice is harmless; a name that already means another part is
    refused, so a registration never changes a method. The registration lasts for the process.
    """
    target = registry(kind)
    if kind == "task":
        _check_task(name, factory)
    elif not callable(factory):
        raise CsekitError(f'part "{name}": the factory must be a class or function, not {type(factory).__name__}')
    target.register(name, factory)


def _check_task(name: str, task: Any) -> None:
    """A user's task is a `csekit.evaluation.tasks.EvalTask` named `name`, of group sts or dev, with a `load`."""
    if (
        getattr(task, "name", None) != name
        or getattr(task, "group", None) not in ("sts", "dev")
        or not callable(getattr(task, "load", None))
    ):
        raise CsekitError(
            f'task "{name}": register a csekit.evaluation.tasks.EvalTask named "{name}" of group sts or dev with a '
            "load function (transfer tasks are built in)"
        )

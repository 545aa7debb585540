"""One registry for every kind of part: what a recipe, a command or a saved model may name.

Each kind has one `Registry`. Its built-in entries are a read-only table in the kind's home package
(`csekit.parts.heads:BUILTIN`, ...), imported on first use: this module sits below everything else,
so it names those tables as strings and imports none of them until a name is looked up. That keeps
the layers free of import cycles and makes `import csekit` cheap.

A user's own part comes in two ways, the same for every kind:

* `csekit.register_part("objective", "my_loss", MyLoss)` in the script that then calls `train`;
* an entry point in the group `csekit.parts` of an installed package, named `KIND.NAME`, e.g. in
  pyproject.toml: `[project.entry-points."csekit.parts"] "objective.my_loss" = "mypkg.losses:MyLoss"`.
  It works with the `csekit` command and with launchers that start several processes; the package
  is imported only when something names the part.

Recipes, run folders and model folders may come from anyone: they only *name* entries, so loading
them never imports or calls anything that was not registered here.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import re
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from csekit.core.errors import CsekitError, did_you_mean

if TYPE_CHECKING:
    from torch import nn

    from csekit.evaluation.tasks import EvalTask
    from csekit.prep.paraphrase import ParaphraseEngine

T = TypeVar("T")
ENTRY_POINT_GROUP = "csekit.parts"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


class Registry(Generic[T]):
    """Names -> entries of one kind: the built-in table, then registered entries, then installed plugins.

    `builtin` is `"module:ATTRIBUTE"`, a read-only mapping imported on first use. Registering never
    changes a built-in name's meaning: a name already taken by another entry is refused.
    """

    def __init__(self, kind: str, builtin: str, what: str) -> None:
        self.kind = kind
        self.what = what  # for messages: "head", "paraphrase engine", ...
        self._builtin_ref = builtin
        self._builtin: Mapping[str, T] | None = None
        self._registered: dict[str, T] = {}

    def _builtins(self) -> Mapping[str, T]:
        if self._builtin is None:
            module, _, attribute = self._builtin_ref.partition(":")
            self._builtin = getattr(importlib.import_module(module), attribute)
        return self._builtin

    def _plugins(self) -> dict[str, importlib.metadata.EntryPoint]:
        found = {}
        for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            kind, _, name = entry.name.partition(".")
            if kind == self.kind and _NAME.fullmatch(name):
                found[name] = entry
        return found

    def names(self) -> list[str]:
        """Every name: built-in and registered ones in order, then installed plugins' (not imported)."""
        own = [*self._builtins(), *self._registered]
        return own + sorted(name for name in self._plugins() if name not in own)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self.names()

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def get(self, name: str, key: str | None = None) -> T:
        """The entry named `name`; an unknown name is one line naming `key` (where it was written) and the choices."""
        if name in self._builtins():
            return self._builtins()[name]
        if name in self._registered:
            return self._registered[name]
        plugin = self._plugins().get(name)
        where = f"{key}: " if key else ""
        if plugin is None:
            hint = (
                "; a recipe cannot name Python code: register your part with csekit.register_part "
                "or a csekit.parts entry point (docs/architecture.md)"
                if ":" in name or "." in name
                else ""
            )
            choices = self.names()
            raise CsekitError(
                f'{where}unknown {self.what} "{name}"{did_you_mean(name, choices)}; '
                f"choose one of {', '.join(choices)}{hint}"
            )
        try:
            return plugin.load()
        except Exception as error:  # an installed plugin failing to import is reported, not raised
            raise CsekitError(
                f'{where}{self.what} "{name}" from entry point {plugin.value} cannot be loaded ({error})'
            ) from None

    def register(self, name: str, entry: T) -> None:
        """Make `entry` available as `name`; registering the same entry twice is harmless."""
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise CsekitError(f'part name "{name}": use letters, digits, "_" and "-" (it is written in recipes)')
        existing = self._builtins().get(name, self._registered.get(name))
        if existing is not None and existing is not entry:
            raise CsekitError(f'part name "{name}" is taken by another {self.what}; choose another name')
        self._registered[name] = entry

    def unregister(self, name: str) -> None:
        """Forget a registered entry (tests, notebooks); built-in entries stay."""
        self._registered.pop(name, None)


Factory = Callable[..., Any]

POOLERS: Registry[Factory] = Registry("pooler", "csekit.encoding.pooling:BUILTIN", "pooler")
"""`model.pooler` / `--pooler`: how token states become one sentence vector."""
VIEWS: Registry[Factory] = Registry("views", "csekit.parts.views:BUILTIN", "views")
"""`data.views`: how the inputs of each sentence's views are made."""
HEADS: Registry[Callable[..., nn.Module]] = Registry("head", "csekit.parts.heads:BUILTIN", "head")
"""`model.head`: the projection between the pooled vector and the objectives."""
NEGATIVES: Registry[Callable[..., nn.Module]] = Registry("negatives", "csekit.parts.negatives:BUILTIN", "negatives")
"""`negatives`: extra negatives added to each step."""
WEIGHTINGS: Registry[Callable[..., nn.Module]] = Registry("weighting", "csekit.parts.weighting:BUILTIN", "weighting")
"""`weighting`: weights of the in-batch negatives."""
OBJECTIVES: Registry[Callable[..., nn.Module]] = Registry("objective", "csekit.parts.objectives:BUILTIN", "objective")
"""`objectives`: the loss terms, each returning named loss parts."""
ENGINES: Registry[Callable[..., ParaphraseEngine]] = Registry(
    "engine", "csekit.prep.paraphrase:BUILTIN", "paraphrase engine"
)
"""`csekit augment --engine`: where back-translated paraphrases come from."""
EVAL_TASKS: Registry[EvalTask] = Registry("task", "csekit.evaluation.tasks:BUILTIN", "evaluation task")
"""`csekit evaluate --tasks` and the training dev task: the SentEval tasks and the dev splits."""

REGISTRIES: Mapping[str, Registry[Any]] = {
    registry.kind: registry
    for registry in (POOLERS, VIEWS, HEADS, NEGATIVES, WEIGHTINGS, OBJECTIVES, ENGINES, EVAL_TASKS)
}
"""Every registry by kind (the `KIND` of `register_part` and of a `KIND.NAME` entry point)."""


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

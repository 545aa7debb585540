"""A registry of one kind of part: what a recipe, a command or a saved model may name.

Each kind has one `Registry`, which lives with its kind beside its built-in table (the poolers' in
`csekit.encoding.pooling`, the objectives' in `csekit.parts.objectives`, the evaluation tasks' in
`csekit.evaluation.tasks`, the paraphrase engines' in `csekit.prep.paraphrase`, ...); `csekit.registries`
gathers them by kind. This module is generic: it sits below everything else and imports nothing of
the layers above.

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

import importlib.metadata
import re
from collections.abc import Iterator, Mapping
from typing import Generic, TypeVar

from csekit.core.errors import CsekitError, did_you_mean

T = TypeVar("T")
ENTRY_POINT_GROUP = "csekit.parts"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


class Registry(Generic[T]):
    """Names -> entries of one kind: the built-in table, then registered entries, then installed plugins.

    `builtin` is the kind's read-only table of csekit's own entries. Registering never changes a
    built-in name's meaning: a name already taken by another entry is refused.
    """

    def __init__(self, kind: str, builtin: Mapping[str, T], what: str) -> None:
        if not isinstance(builtin, Mapping):
            raise TypeError(f"the {kind} registry's built-in table must be a mapping, not {type(builtin).__name__}")
        self.kind = kind
        self.what = what  # for messages: "head", "paraphrase engine", ...
        self._builtin = builtin
        self._registered: dict[str, T] = {}

    def _plugins(self) -> dict[str, importlib.metadata.EntryPoint]:
        found = {}
        for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            kind, _, name = entry.name.partition(".")
            if kind == self.kind and _NAME.fullmatch(name):
                found[name] = entry
        return found

    def names(self) -> list[str]:
        """Every name: built-in and registered ones in order, then installed plugins' (not imported)."""
        own = [*self._builtin, *self._registered]
        return own + sorted(name for name in self._plugins() if name not in own)

    def __contains__(self, name: object) -> bool:
        """Built-in and registered names first: reading the installed packages' entry points takes tens of ms."""
        if not isinstance(name, str):
            return False
        return name in self._builtin or name in self._registered or name in self._plugins()

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def get(self, name: str, key: str | None = None) -> T:
        """The entry named `name`; an unknown name is one line naming `key` (where it was written) and the choices."""
        if name in self._builtin:
            return self._builtin[name]
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
        existing = self._builtin.get(name, self._registered.get(name))
        if existing is not None and existing is not entry:
            raise CsekitError(f'part name "{name}" is taken by another {self.what}; choose another name')
        self._registered[name] = entry

    def unregister(self, name: str) -> None:
        """Forget a registered entry (tests, notebooks); built-in entries stay."""
        self._registered.pop(name, None)

"""The paths a recipe names, resolved once when a run starts and recorded absolute in its folder.

A recipe (or `--set`) names files and folders relative to the folder csekit runs in: `data.corpus` (else under
the data folder, `csekit.data.corpus.resolve_corpus_path`), the files of `train.dev_task` (`pairs:PATH`,
`retrieval:PATH` and their mappings), a model folder in `model.backbone`, and the options a part's class lists:
`model_options` (a model folder, an alias or a hub name: RankCSE's teachers, DiffCSE's generator, DCLR's
complementary model) and `counts_options` (a token counts file, else under the data folder:
`csekit.prep.frequency.resolve_counts_path`). `resolve_recipe_paths` gives the recipe with each of them absolute,
found by the rules a run reads them with, so the run folder's recipe.yaml records where the files were; a name
that is no path (a hub dataset, a hub model, an alias, DCLR's `self`) is kept as it is.

On `--resume` (and when `csekit bench` continues a run) a relative path whose recorded absolute one ends with it
names the recorded file: a run continues with its own files from any folder. A run folder of an older csekit
recorded its paths as given, relative: they are read from the folder csekit runs in, as before
(`as_recorded`, `older_run_hint`).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from csekit.core.bounded_read import read_yaml_file
from csekit.core.errors import CsekitError, absolute
from csekit.data.corpus import HUB_PREFIX, resolve_corpus_path
from csekit.encoding.hub import MODEL_ALIASES, looks_like_hub_id
from csekit.evaluation.tasks import FILE_TASK_KINDS
from csekit.prep.frequency import resolve_counts_path
from csekit.training.recipe import Recipe
from csekit.training.recipe_values import recipe_parts

NOT_A_FOLDER = ("self",)
"""Words a model option takes that name no model folder, even where a folder of that name exists (DCLR's
complementary weighting `self`: the step's own vectors)."""


@dataclass
class PathSlot:
    """One path of a recipe: its key as `recipe_changes` names it, how it is found, and where it is held."""

    key: str
    kind: str  # corpus | file | counts | model
    get: Callable[[], str]
    put: Callable[[str], None]


def _item(container: Any, index: Any, key: str, kind: str, prefix: str = "") -> PathSlot:
    """The slot of `container[index]` (a dict or list; `prefix`: the text before the path, `pairs:`)."""

    def put(value: str) -> None:
        container[index] = prefix + value

    return PathSlot(key, kind, lambda: str(container[index])[len(prefix) :], put)


def _attribute(owner: Any, name: str, key: str, kind: str) -> PathSlot:
    return PathSlot(key, kind, lambda: getattr(owner, name), lambda value: setattr(owner, name, value))


def path_slots(recipe: Recipe) -> Iterator[PathSlot]:
    """Every path the recipe names (see the module's docstring), in a fixed order; values that are not text (a
    recipe not validated yet) are left out."""
    if isinstance(recipe.data.corpus, str):
        yield _attribute(recipe.data, "corpus", "data.corpus", "corpus")
    if isinstance(recipe.model.backbone, str):
        yield _attribute(recipe.model, "backbone", "model.backbone", "model")
    yield from _dev_task_slots(recipe.train)
    try:
        parts = recipe_parts(recipe)
    except CsekitError:  # a part without a name: reported, with its line, by the recipe's checks
        parts = []
    for key, factory, spec in parts:
        for kind, options in (("model", "model_options"), ("counts", "counts_options")):
            for option in getattr(factory, options, ()):
                value = spec.get(option)
                if isinstance(value, str):
                    yield _item(spec, option, f"{key}.{option}", kind)
                elif isinstance(value, list):
                    for index, item in enumerate(value):
                        if isinstance(item, str):
                            yield _item(value, index, f"{key}.{option}[{index}]", kind)


def _dev_task_slots(train: Any) -> Iterator[PathSlot]:
    """The files of `train.dev_task`: a `KIND:PATH` string, or a mapping's `KIND` value; alone or in a list."""
    listed = isinstance(train.dev_task, list)
    entries = train.dev_task if listed else [train.dev_task]
    for index, entry in enumerate(entries):
        key = f"train.dev_task[{index}]" if listed else "train.dev_task"
        if isinstance(entry, str):
            kind, colon, path = entry.partition(":")
            if colon and kind in FILE_TASK_KINDS and path.strip():
                if listed:
                    yield _item(entries, index, key, "file", f"{kind}:")
                else:
                    yield _attribute_prefixed(train, key, f"{kind}:")
        elif isinstance(entry, dict):
            for kind in FILE_TASK_KINDS:
                if isinstance(entry.get(kind), str) and entry[kind].strip():
                    yield _item(entry, kind, f"{key}.{kind}", "file")


def _attribute_prefixed(train: Any, key: str, prefix: str) -> PathSlot:
    """`train.dev_task` given as one `KIND:PATH` string."""

    def put(value: str) -> None:
        train.dev_task = prefix + value

    return PathSlot(key, "file", lambda: train.dev_task[len(prefix) :], put)


def is_relative(value: str, kind: str) -> bool:
    """Whether a path slot's value is a relative path (a hub dataset, an alias or `self` is none)."""
    if kind == "corpus" and value.startswith(HUB_PREFIX):
        return False
    if kind == "model" and (value in MODEL_ALIASES or value in NOT_A_FOLDER):
        return False
    return not os.path.isabs(os.path.expanduser(value.strip() if kind == "file" else value))


def names_recorded(relative: str, recorded: str) -> bool:
    """Whether the relative path `relative` names the absolute `recorded` one: `recorded` ends with it (`..`
    folded; one that climbs out of its folder, or `.`, names none)."""
    parts = PurePath(os.path.normpath(os.path.expanduser(relative.strip()))).parts
    if not parts or parts == (".",) or parts[0] == ".." or not os.path.isabs(recorded):
        return False
    whole = PurePath(recorded).parts
    return len(whole) > len(parts) and whole[-len(parts) :] == parts


def _found(slot: PathSlot, value: str, data_dir: Path | None) -> str:
    """`value` found as a run reads it, absolute (a model name that is no folder here: kept)."""
    if slot.kind == "corpus":
        return str(resolve_corpus_path(value, data_dir))
    if slot.kind == "counts":  # without a data folder, the current folder's ($CSEKIT_DATA was looked at for it)
        return str(resolve_counts_path(value, data_dir))
    if slot.kind == "model":
        return absolute(value) if os.path.isdir(value) else value
    return absolute(value.strip())


def as_recorded(recipe: Recipe, recorded: Recipe) -> Recipe:
    """A copy of `recipe` in which each relative path that `recorded`'s absolute one at the same key ends with is
    that one: a resumed run's recipe given its recorded files (before its checks read them), or an older csekit's
    saved recipe given the paths of the recipe it is compared with (a change only where the files differ)."""
    paths = {slot.key: slot.get() for slot in path_slots(recorded)}
    matched = copy.deepcopy(recipe)
    for slot in path_slots(matched):
        value, other = slot.get(), paths.get(slot.key)
        if other is not None and is_relative(value, slot.kind) and names_recorded(value, other):
            slot.put(other)
    return matched


def resolve_recipe_paths(recipe: Recipe, data_dir: Path | None, recorded: Recipe | None = None) -> Recipe:
    """A copy of `recipe` with every relative path absolute (see the module's docstring): the recorded one where
    `recorded` (the run's saved recipe, on resume) holds one at the same key that ends with it (`as_recorded`),
    else found from the current folder (the corpus and counts also in the data folder `data_dir`). A corpus or
    counts file found in neither is one CsekitError naming the paths tried."""
    resolved = as_recorded(recipe, recorded) if recorded is not None else copy.deepcopy(recipe)
    for slot in path_slots(resolved):
        value = slot.get()
        if is_relative(value, slot.kind):
            try:
                slot.put(_found(slot, value, data_dir))
            except CsekitError as error:
                raise CsekitError(f"recipe key {slot.key}: {error}") from None
    return resolved


def relative_paths(recipe: Recipe) -> dict[str, str]:
    """The recipe's relative paths by key, a model's only when it is no hub name (a saved recipe of an older
    csekit holds them; one saved since, none)."""
    return {
        slot.key: slot.get()
        for slot in path_slots(recipe)
        if is_relative(slot.get(), slot.kind) and not (slot.kind == "model" and looks_like_hub_id(slot.get()))
    }


def older_run_hint(path: Path, message: str) -> str:
    """What to do when a run's saved recipe fails to load on a relative path it holds (an older csekit recorded
    the paths as given): resume from the folder the run started in. "" when the failure is about none of them."""
    try:
        raw = read_yaml_file(path, "recipe")[0]
        relative = relative_paths(OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(Recipe), raw)))
    except (CsekitError, OmegaConfBaseException, TypeError, ValueError):  # the error at hand says what is wrong
        return ""
    named = {key: value for key, value in relative.items() if os.path.normpath(value.strip()) in message}
    if not named:
        return ""
    listed = ", ".join(f"{key} {value}" for key, value in named.items())
    return (
        f"; {path} holds paths relative to the folder its run started in ({listed}: saved by an older csekit), read "
        "from the current folder: resume from the folder the run started in, and the run records them absolute"
    )

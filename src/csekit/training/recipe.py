"""Recipes: YAML files that compose a training run from named parts.

A recipe has six sections: `model` (backbone, pooler, head), `data` (corpus, views), `train`
(optimisation and selection), `negatives` and `weighting` (extra negative sources and how in-batch
negatives are weighted), `objectives` (loss terms with weights): what is learned; and `run` (`RunConfig`):
how this machine executes a step, decided in `csekit.training.execution`. The schema is a set of
dataclasses checked by OmegaConf (`recipe_schema.py`); a wrong key or type is reported with the file, the line
and the closest valid key. Values are checked next (`recipe_checks.py`): ranges and choices, and part options
(everything beside `name` and `weight` in a part) against the part's constructor (`csekit.training.part_building`).
Only those checks import torch, so a recipe with a mistyped key or a missing file is refused in a blink.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from csekit.core.bounded_read import parse_yaml_value, read_yaml_file
from csekit.core.errors import CsekitError, did_you_mean
from csekit.training.part_building import yaml_text_number_hint
from csekit.training.recipe_schema import (
    MAX_SEED,
    OPTIMIZERS,
    TRACKER_FOLDER_OPTIONS,
    DataConfig,
    ModelConfig,
    Recipe,
    RunConfig,
    TrainConfig,
    tracker_names,
)

__all__ = [
    "LEGACY_RUN_KEYS",
    "MAX_SEED",
    "OPTIMIZERS",
    "RUN_SECTION",
    "SAVED_RECIPE",
    "TRACKER_FOLDER_OPTIONS",
    "DataConfig",
    "ModelConfig",
    "Recipe",
    "RunConfig",
    "TrainConfig",
    "load_recipe",
    "parse_overrides",
    "recipe_changes",
    "tracker_names",
]


RUN_SECTION = "run"
"""The recipe section of execution settings (`RunConfig`): compared on --resume never, recorded when changed."""

LEGACY_RUN_KEYS = {
    f"{section}.{key}": key
    for section, keys in {
        "model": ("packed", "length_group_size", "fast_dropout"),
        "data": ("num_workers",),
        "train": ("chunk_size", "sync_free", "compile", "keep_freed_memory", "eval_batch_size", "report_to"),
    }.items()
    for key in keys
}
"""Where recipes before the `run:` section gave each execution setting: read as `run.<key>`, with one line."""

SAVED_RECIPE = "recipe.yaml"
"""The name a run folder keeps its recipe under (`csekit.training.run_folder`; `csekit train --resume` reads it)."""


def _key_lines(node: yaml.Node, prefix: str = "") -> dict[str, int]:
    """Map each dotted key of a YAML document to its 1-based line number."""
    lines: dict[str, int] = {}
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = f"{prefix}{key_node.value}"
            lines[key] = key_node.start_mark.line + 1
            lines.update(_key_lines(value_node, key + "."))
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            key = f"{prefix.rstrip('.')}[{index}]"
            lines[key] = item.start_mark.line + 1
            lines.update(_key_lines(item, key + "."))
    return lines


def _check_keys(values: Mapping[str, Any], schema: type, prefix: str, where: Any) -> None:
    """Reject keys the schema does not have, naming the closest valid key."""
    fields = {f.name: f for f in dataclasses.fields(schema)}
    for key, value in values.items():
        dotted = f"{prefix}{key}"
        if key not in fields:
            raise CsekitError(f'{where(dotted)}: unknown recipe key "{dotted}"{did_you_mean(key, fields, prefix)}')
        nested = fields[key].default_factory if fields[key].default_factory is not dataclasses.MISSING else None
        if dataclasses.is_dataclass(nested) and isinstance(value, Mapping):
            _check_keys(value, nested, dotted + ".", where)


def _apply_override(tree: dict[str, Any], key: str, value: Any) -> None:
    """Set dotted `key` in the resolved recipe `tree`; a number picks a list item (`objectives.0.weight`).

    Setting a part's `name` to another part replaces the whole part spec, since the old part's options
    would not fit the new one (`--set model.head.name=none`).
    """
    parts = key.split(".")
    node: Any = tree
    for depth, part in enumerate(parts):
        last = depth == len(parts) - 1
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise CsekitError(f"--set {key}: {'.'.join(parts[:depth])} has {len(node)} items; no item {part}")
            if last:
                node[int(part)] = value
            else:
                node = node[int(part)]
        elif isinstance(node, dict):
            if last:
                if part == "name" and node is not tree and node.get("name") != value:
                    node.clear()
                node[part] = value
            else:
                if node.get(part) is None:
                    node[part] = {}
                elif not isinstance(node[part], dict | list):
                    raise CsekitError(f"--set {key}: {'.'.join(parts[: depth + 1])} is a value, not a section")
                node = node[part]


def _parse_override(item: str) -> tuple[str, Any]:
    """`"train.batch_size=32"` -> ("train.batch_size", 32); the value is parsed as YAML."""
    if "=" not in item:
        raise CsekitError(f'--set "{item}": expected dotted.key=value')
    key, raw = item.split("=", 1)
    value = parse_yaml_value(raw, f"--set {key.strip()}") if raw.strip() else None
    return key.strip(), value


def parse_overrides(overrides: Sequence[str]) -> dict[str, Any]:
    """Turn `["train.batch_size=32", ...]` into a nested dict (for checking keys against the schema)."""
    result: dict[str, Any] = {}
    for item in overrides:
        key, value = _parse_override(item)
        target = result
        parts = key.split(".")
        for part in parts[:-1]:
            child = target.get(part)
            if not isinstance(child, dict):  # only keys matter here: a list or value above is not walked
                child = target[part] = {}
            target = child
        target[parts[-1]] = value
    return result


def _move_legacy_run_keys(raw: dict[str, Any], lines: dict[str, int], label: str) -> list[str]:
    """Move execution settings a recipe gives under model/data/train (before `run:`) into `run`; the keys moved.

    Their lines follow them, so an error in one still names the line it is on.
    """
    moved = []
    for legacy, key in LEGACY_RUN_KEYS.items():
        section = raw.get(legacy.split(".")[0])
        if not isinstance(section, dict) or key not in section:
            continue
        run = raw.setdefault(RUN_SECTION, {})
        if not isinstance(run, dict):
            break  # a run: that is no mapping is reported by the schema check
        if key in run:
            where = f"{label}:{lines[legacy]}" if legacy in lines else label
            raise CsekitError(f"{where}: recipe key {legacy} is given again as {RUN_SECTION}.{key}; keep the run: one")
        run[key] = section.pop(key)
        if legacy in lines:
            lines[f"{RUN_SECTION}.{key}"] = lines[legacy]
        moved.append(legacy)
    return moved


def _legacy_override(item: str, moved: list[str]) -> str:
    """`--set model.packed=true` as `run.packed=true` (an execution setting's old place), noted in `moved`."""
    key, equals, value = item.partition("=")
    new_key = LEGACY_RUN_KEYS.get(key.strip())
    if new_key is None:
        return item
    moved.append(key.strip())
    return f"{RUN_SECTION}.{new_key}{equals}{value}"


@functools.cache
def _schema() -> DictConfig:
    """OmegaConf's typed tree of `Recipe`, built once a process: building it walks every dataclass of the schema,
    half of a recipe's load. `OmegaConf.merge` copies its first argument and never changes it."""
    return OmegaConf.structured(Recipe)


PathsAs = Callable[[Recipe], Recipe] | None
"""What gives a recipe its paths before its checks read the files (`load_recipe`'s `paths`)."""


def load_recipe(
    path: str | Path | None, overrides: Sequence[str] = (), *, note_legacy_keys: bool = True, paths: PathsAs = None
) -> Recipe:
    """Read a recipe file (or the defaults when `path` is None) and apply `--set` overrides.

    Execution settings written where recipes before the `run:` section had them are read into `run`, with one
    line on stderr naming the new keys (none with `note_legacy_keys` False: a saved run's recipe read to compare).
    """
    raw: dict[str, Any] = {}
    lines: dict[str, int] = {}
    label = "recipe"
    if path is not None:
        path = Path(path)
        label = str(path)
        loaded, node = read_yaml_file(path, "recipe")
        if loaded is None:
            raise CsekitError(f"recipe {path} is empty: a recipe gives at least the model and the corpus")
        if not isinstance(loaded, dict):
            raise CsekitError(f"{path}: a recipe must be a mapping of sections (model, data, train, ...)")
        raw, lines = loaded, _key_lines(node) if node is not None else {}
    moved = _move_legacy_run_keys(raw, lines, label)
    overrides = [_legacy_override(item, moved) for item in overrides]
    if moved and note_legacy_keys:
        renamed = ", ".join(f"{key} as {RUN_SECTION}.{LEGACY_RUN_KEYS[key]}" for key in dict.fromkeys(moved))
        print(f"csekit: {label}: execution settings now live in the run: section; read {renamed}", file=sys.stderr)

    update = parse_overrides(overrides)
    overridden = {item.split("=", 1)[0].strip() for item in overrides}

    def where_in_file(key: str) -> str:
        if any(key == o or key.startswith((o + ".", o + "[")) for o in overridden):
            return f"--set {key}"
        line = lines.get(key)
        return f"{label}:{line}" if line else label

    _check_keys(raw, Recipe, "", where_in_file)
    _check_keys(update, Recipe, "", lambda key: f"--set {key}")
    _check_integer_sizes(raw, where_in_file)
    _check_integer_sizes(update, lambda key: f"--set {key}")
    try:
        merged = OmegaConf.merge(_schema(), raw)
        if overrides:  # applied to the resolved tree (a part's defaults filled in), then typed again
            resolved = OmegaConf.to_container(merged)
            assert isinstance(resolved, dict)
            for item in overrides:
                _apply_override(resolved, *_parse_override(item))
            merged = OmegaConf.merge(_schema(), resolved)
        recipe: Recipe = OmegaConf.to_object(merged)  # type: ignore[assignment]
    except OmegaConfBaseException as error:
        key = getattr(error, "full_key", "") or ""
        message = yaml_text_number_hint(getattr(error, "value", None)) or str(error).splitlines()[0]
        if not key:  # OmegaConf did not say where: the file and every --set key
            given = " and ".join([*([label] if path is not None else []), *(f"--set {o}" for o in sorted(overridden))])
            given = given or label
            raise CsekitError(f"{given}: {message}") from None
        raise CsekitError(f"{where_in_file(key)}: recipe key {key}: {message}") from None
    except TypeError as error:  # OmegaConf merging a mapping into a list (`--set objectives={a: 1}`)
        given = f"{label} and --set" if overrides else label
        raise CsekitError(f"{given}: a section is given as another kind of value ({error})") from None
    from csekit.training.recipe_checks import validate_recipe  # the parts' checks import torch: after the schema's

    recipe = paths(recipe) if paths is not None else recipe
    validate_recipe(recipe, where_in_file)
    return recipe


INTEGER_LIMIT = 2**63
"""The largest integer a recipe value may be (every bound is far below; a float key holds one exactly enough)."""


def _check_integer_sizes(tree: dict[str, Any], where: Callable[[str], str]) -> None:
    """YAML reads an integer of any length: one of 400 digits overflowed OmegaConf's float conversion (an
    OverflowError traceback). Any integer beyond INTEGER_LIMIT is refused at its key, before the schema sees it."""
    for key, value in _flatten(tree).items():
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > INTEGER_LIMIT:
            bits = value.bit_length()  # str() of an integer past 4,300 digits is itself a ValueError
            raise CsekitError(f"{where(key)}: recipe key {key}: an integer of {bits} bits is beyond any bound")


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted keys of a resolved recipe (`objectives[0].temperature`) and their values."""
    if isinstance(value, Mapping):
        flat: dict[str, Any] = {}
        for key, item in value.items():
            flat.update(_flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return flat or {prefix: {}}
    if isinstance(value, list) and value:
        flat = {}
        for index, item in enumerate(value):
            flat.update(_flatten(item, f"{prefix}[{index}]"))
        return flat
    return {prefix: value}


def recipe_changes(old: Recipe, new: Recipe) -> dict[str, tuple[Any, Any]]:
    """Every dotted key whose value differs between two resolved recipes: {key: (old, new)} (None: absent)."""
    before, after = _flatten(dataclasses.asdict(old)), _flatten(dataclasses.asdict(new))
    return {
        key: (before.get(key), after.get(key))
        for key in [*before, *(k for k in after if k not in before)]
        if before.get(key) != after.get(key) or (key in before) != (key in after)
    }

"""Recipe values that refer to the corpus or to each other, checked when the recipe is loaded.

A part naming a view the step does not make (`positive_view: 5` with two views) or a corpus field a plain
text corpus cannot have (OssCSE's paraphrases and negations) was found at the first training step, after the
run folder existed: an IndexError traceback, or one line and a folder left behind. A recipe that cannot finish
must not start, and `csekit bench` must find it before its first training. Parts are not built here (that
needs the backbone): each part's options are read over its constructor's defaults, and their names say what
they refer to:

* an option `view`, `views`, `*_view` or `*_views` holds view indices (an integer or a list of them; null
  leaves the choice to the part). They index the training representations, which a head that makes its own
  views (WhitenedCSE's) may have more of than `data.views` makes, except the options a part lists in its
  `input_view_options`, which index the step's inputs (`data.views`' views: the encoder's rows, the features);
* an option `*_field` names a field of the corpus's rows the part reads (a `.jsonl` corpus).

How many views a views part or such a head makes: its `num_views` option or class attribute, else its
`count_views(options)`; a part that says neither is checked when it runs.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from csekit.core.errors import CsekitError
from csekit.core.registry import Registry
from csekit.data.corpus import HUB_PREFIX
from csekit.data.duplicates import DUPLICATE_MODES
from csekit.parts.heads import HEADS
from csekit.parts.negatives import NEGATIVES
from csekit.parts.objectives import OBJECTIVES
from csekit.parts.views import VIEWS
from csekit.parts.weighting import WEIGHTINGS
from csekit.training.part_building import nested_options, nested_spec

MAX_WORKERS = 64
"""The most DataLoader worker processes a recipe may ask for (each is a process with its own memory)."""

JSONL_SUFFIXES = (".jsonl", ".jsonl.gz")
"""The corpora whose rows have fields besides the sentence."""

Where = Callable[[str], str]
Part = tuple[str, Any, Mapping[str, Any]]
"""A recipe part: its recipe key (`objectives[1]`), its factory (class) and its spec."""


PART_REGISTRIES: dict[str, Registry[Any]] = {
    "model.head": HEADS,
    "data.views": VIEWS,
    "negatives": NEGATIVES,
    "weighting": WEIGHTINGS,
    "objectives": OBJECTIVES,
}
"""The registry of each part key of a recipe (list keys without their index)."""


def part_specs(recipe: Any) -> list[tuple[str, Any]]:
    """Every part's recipe key and spec, in the order `build_model` builds them."""
    specs: list[tuple[str, Any]] = [("model.head", recipe.model.head), ("data.views", recipe.data.views)]
    specs += [(f"negatives[{i}]", spec) for i, spec in enumerate(recipe.negatives)]
    if recipe.weighting is not None:
        specs.append(("weighting", recipe.weighting))
    specs += [(f"objectives[{i}]", spec) for i, spec in enumerate(recipe.objectives)]
    return specs


def recipe_parts(recipe: Any, where: Where = lambda key: "recipe") -> list[Part]:
    """Every part's key, factory and spec; a spec without a name, or a name no registry has, is one line."""
    parts = []
    for key, spec in part_specs(recipe):
        if not isinstance(spec, Mapping) or "name" not in spec:
            raise CsekitError(f'{where(key)}: recipe key {key} must be a mapping with a "name"')
        parts += _with_nested(key, spec, PART_REGISTRIES[key.split("[")[0]], where)
    return parts


def _with_nested(key: str, spec: Mapping[str, Any], registry: Any, where: Where) -> list[Part]:
    """The part and the parts its options hold (matryoshka's inner objective, key `objectives[i].objective`)."""
    factory = registry.get(str(spec["name"]), f"{where(key + '.name')}: recipe key {key}.name")
    parts: list[Part] = [(key, factory, spec)]
    for option in nested_options(factory, spec):
        inner = f"{key}.{option}"
        parts += _with_nested(inner, nested_spec(spec[option], inner, where), registry, where)
    return parts


def check_data(data: Any, where: Where) -> None:
    """The `data` section's choices (its numbers' ranges: `recipe_bounds`)."""
    checks = [
        ("data.bad_lines", data.bad_lines in ("error", "skip"), "must be error or skip"),
        ("data.duplicates", data.duplicates in DUPLICATE_MODES, f"must be one of {', '.join(DUPLICATE_MODES)}"),
    ]
    for key, ok, message in checks:
        if not ok:
            raise CsekitError(f"{where(key)}: recipe key {key} {message}")


def part_options(factory: Any, spec: Mapping[str, Any]) -> dict[str, Any]:
    """The part's options: the spec's over the constructor's defaults."""
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # a callable without a signature: only what the spec says
        parameters = []  # type: ignore[assignment]
    defaults = {p.name: p.default for p in parameters if p.default is not inspect.Parameter.empty}
    return {**defaults, **{key: value for key, value in spec.items() if key not in ("name", "weight")}}


def views_made(factory: Any, options: Mapping[str, Any]) -> int | None:
    """How many views a views part (or a head that makes views) makes with `options`; None when it does not say."""
    counter = getattr(factory, "count_views", None)
    try:
        value = counter(options) if callable(counter) else options.get("num_views", getattr(factory, "num_views", None))
    except (TypeError, ValueError):  # options the part refuses: reported when it is built
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _view_indices(options: Mapping[str, Any]) -> Iterator[tuple[str, int]]:
    for name, value in options.items():
        if name in ("view", "views") or name.endswith(("_view", "_views")):
            for index in value if isinstance(value, list | tuple) else [value]:
                if isinstance(index, int) and not isinstance(index, bool):
                    yield name, index


def check_view_indices(parts: Sequence[Part], where: Where) -> None:
    """Every view index a part names is one the step makes (see the module's docstring)."""
    factories = {key: (factory, spec) for key, factory, spec in parts}
    views_factory, views_spec = factories["data.views"]
    inputs = views_made(views_factory, part_options(views_factory, views_spec))
    if inputs is None:
        return
    head_factory, head_spec = factories["model.head"]
    made = views_made(head_factory, part_options(head_factory, head_spec)) if _makes_views(head_factory) else None
    for key, factory, spec in parts:
        if key in ("data.views", "model.head"):
            continue
        for option, index in _view_indices(part_options(factory, spec)):
            reads_inputs = option in getattr(factory, "input_view_options", ()) or made is None
            count, maker = (inputs, "data.views") if reads_inputs else (made, "model.head")
            if not 0 <= index < count:
                name = factories[maker][1].get("name")
                raise CsekitError(
                    f"{where(f'{key}.{option}')}: recipe key {key}.{option}: view {index} does not exist; "
                    f"{maker} ({name}) makes {count} views, 0 to {count - 1}"
                )


def _makes_views(factory: Any) -> bool:
    """A head class with `forward_views` (csekit.parts.hooks.MakesViews)."""
    return callable(getattr(factory, "forward_views", None))


def fields_read(parts: Sequence[Part]) -> list[tuple[str, str, str]]:
    """(recipe key, option, field) of every corpus field a part reads (its `*_field` options)."""
    return [
        (key, option, value)
        for key, factory, spec in parts
        for option, value in part_options(factory, spec).items()
        if option.endswith("_field") and isinstance(value, str)
    ]


def check_corpus_fields(parts: Sequence[Part], corpus: str, where: Where) -> None:
    """A part that reads a corpus field needs a `.jsonl` corpus (a text file or a hub column has no fields)."""
    for key, option, name in fields_read(parts):
        if corpus.startswith(HUB_PREFIX) or not corpus.endswith(JSONL_SUFFIXES):
            part = dict((k, spec.get("name")) for k, _, spec in parts)[key]
            raise CsekitError(
                f'{where(f"{key}.{option}")}: recipe key {key}.{option}: {part} reads the corpus field "{name}", '
                f"but data.corpus {corpus} is not a .jsonl corpus (only its rows have fields); train on the .jsonl "
                "that `csekit augment` writes"
            )

"""Building a recipe's parts: a spec `{name: ..., option: ...}` -> the registered part, its options checked.

A part's options are its constructor's keyword arguments. Besides them a part may ask, by naming the
parameter, for the build arguments `csekit.training.model.build_model` gives it itself (`BUILD_CONTEXT`):
plain values, so that a part can be built outside a recipe with the same arguments (`WhiteningHead(768,
batch_size=64)`). The options are checked twice with the same code: against each constructor when the
recipe is loaded (`csekit.training.recipe_checks.validate_recipe`, before any backbone is read) and when the part
is built. This module imports nothing of the recipe, so that both can use it.

A part that wraps another of its kind (Matryoshka around any objective) lists in `nested_parts` the options
that hold the other's spec: that spec is built first, as a part with the key `<key>.<option>`, and the
wrapper gets the built part (`nested_options`, `nested_spec`).
"""

from __future__ import annotations

import inspect
import types
import typing
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from csekit.core.errors import CsekitError, did_you_mean
from csekit.core.numbers import is_finite_number
from csekit.core.registry import Registry

BUILD_CONTEXT: Mapping[str, str] = types.MappingProxyType(
    {
        "dim": "the encoder's output width",
        "tokenizer": "the backbone's tokenizer",
        "pooler": "model.pooler's pooler",
        "max_length": "model.max_length",
        "encoder": "the SentenceEncoder that trains",
        "seed": "train.seed",
        "batch_size": "train.batch_size, the global batch (every process's rows)",
        "head_at_test": "model.head_at_test",
        "input_view_count": "how many views data.views makes of each sentence (not given to the views part)",
        "head": "the training head (given to the parts built after it: negatives, weighting, objectives)",
        "recipe": "the whole recipe; deprecated: name the build arguments the part reads instead",
    }
)
"""The build arguments `build_model` gives a part that names them, and where each comes from; a recipe cannot
set them as options, and they are not listed among a part's options in an error."""

BUILT_LATER: Mapping[str, tuple[str, ...]] = types.MappingProxyType(
    {"input_view_count": ("data.views",), "head": ("data.views", "model.head")}
)
"""The build arguments that come from a part built first, and the recipe keys of the parts that do not get them."""

DEPRECATED_CONTEXT = ("recipe",)
"""Build arguments kept for users' parts written against them (docs/architecture.md promised `recipe`); csekit's
own parts take none of them (`tests/unit/training/test_part_building.py`)."""


def build_part(registry: Registry[Any], spec: Mapping[str, Any], key: str, **context: Any) -> Any:
    """Instantiate the part named by `spec["name"]` from `registry` with the spec's options.

    Only registered parts are built: csekit's own, those registered with `csekit.register_part` and
    those installed packages declare (entry points, loaded here when named). A recipe is data from
    anyone, so a name is never imported or called as a Python path. `context` holds the build arguments
    the caller supplies (`BUILD_CONTEXT`), passed only when the constructor names them (or takes
    `**kwargs`). A wrong name or option gives one line naming the recipe key and the closest valid choice.
    """
    options = {k: v for k, v in spec.items() if k not in ("name", "weight")}
    factory = registry.get(str(spec["name"]), f"recipe key {key}.name")
    check_part_options(factory, spec, key, context)
    for option in nested_options(factory, options):  # a wrapper's inner part (matryoshka's objective): built first
        options[option] = build_part(
            registry, nested_spec(options[option], f"{key}.{option}"), f"{key}.{option}", **context
        )
    parameters = inspect.signature(factory).parameters
    accepts_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    supplied = {k: v for k, v in context.items() if k in parameters or accepts_any}
    instead = ", ".join(k for k in BUILD_CONTEXT if k not in DEPRECATED_CONTEXT)
    for name in DEPRECATED_CONTEXT:
        if name in parameters and name in supplied:
            warnings.warn(
                f'recipe key {key}: part "{spec["name"]}" takes `{name}`, which a later csekit will not pass; '
                f"name the build arguments it reads instead ({instead})",
                FutureWarning,
                stacklevel=2,
            )
    try:
        return factory(**supplied, **options)
    except (TypeError, ValueError) as error:
        raise CsekitError(f"recipe key {key}: {error}") from None


def nested_options(factory: Any, options: Mapping[str, Any]) -> list[str]:
    """The options of `options` that hold another part's spec (the factory's `nested_parts`), built as parts of
    the same kind with the recipe key `<key>.<option>`."""
    return [option for option in getattr(factory, "nested_parts", ()) if option in options]


def nested_spec(spec: Any, key: str, where: Callable[[str], str] | None = None) -> Mapping[str, Any]:
    """A nested part's spec: a mapping with a name (no weight of its own: the wrapper weighs it)."""
    located = f"{where(key)}: " if where is not None else ""
    if not isinstance(spec, Mapping) or "name" not in spec:
        raise CsekitError(f'{located}recipe key {key} must be a part\'s spec, a mapping with a "name"')
    if "weight" in spec:
        raise CsekitError(f"{located}recipe key {key}.weight: a nested part has no weight of its own; remove it")
    return spec


def check_part_options(
    factory: Any,
    spec: Mapping[str, Any],
    key: str,
    context: Iterable[str] = (),
    where: Callable[[str], str] | None = None,
) -> None:
    """Every option of the part's spec is one its constructor takes, of the type it declares, and not a build
    argument (`context`: the names the caller supplies itself). `where` prefixes the file and line of a key."""
    options = {k: v for k, v in spec.items() if k not in ("name", "weight")}
    supplied = {name for name in context if key.split("[")[0] not in BUILT_LATER.get(name, ())}
    parameters = inspect.signature(factory).parameters
    accepts_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    for option in options:
        located = f"{where(f'{key}.{option}')}: " if where is not None else ""
        if option in supplied:
            source = BUILD_CONTEXT.get(option, "its caller")
            raise CsekitError(
                f'{located}recipe key {key}.{option}: "{spec["name"]}" is given {option} by csekit ({source}), '
                "not by the recipe; remove the option"
            )
        if not accepts_any and option not in parameters:
            valid = [p for p in parameters if p not in supplied]
            raise CsekitError(
                f'{located}recipe key {key}.{option}: "{spec["name"]}" has no option "{option}"'
                f"{did_you_mean(option, valid)}; its options: {', '.join(valid) or 'none'}"
            )
    _check_option_types(factory, options, key, where)


def _option_hints(factory: Any) -> dict[str, Any]:
    """The constructor's resolved type hints, or none when they cannot be resolved (then nothing is checked)."""
    target = factory.__init__ if inspect.isclass(factory) else factory
    try:
        return typing.get_type_hints(target)
    except Exception:  # an unresolvable forward reference in a user's part: leave its options unchecked
        return {}


def _fits(value: Any, hint: Any) -> bool | None:
    """Whether a YAML value fits a type hint: True, False, or None when the hint is not a plain type.

    YAML gives int, float, bool, str, None, lists and mappings. A bool is not a number here (YAML's
    `true` for a temperature is a mistake), an int is a float, and a float option must be finite.
    """
    origin = typing.get_origin(hint)
    if hint is Any:
        return None
    if hint is type(None):
        return value is None
    if origin in (typing.Union, types.UnionType):
        verdicts = [_fits(value, option) for option in typing.get_args(hint)]
        if any(verdicts):
            return True
        return None if None in verdicts else False
    if origin in (list, tuple, Sequence):
        if isinstance(value, str):
            return origin is Sequence  # a string is a Sequence (of characters), never a list
        if not isinstance(value, list | tuple):
            return False
        arguments = typing.get_args(hint)
        if len(arguments) != 1:
            return None
        verdicts = {_fits(item, arguments[0]) for item in value}
        return False if False in verdicts else (None if None in verdicts else True)
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return is_finite_number(value)
    if hint is str:
        return isinstance(value, str)
    return None


def _check_option_types(
    factory: Any, options: Mapping[str, Any], key: str, where: Callable[[str], str] | None = None
) -> None:
    """Refuse a part option whose value does not fit the constructor's annotation (`temperature: abc`).

    Without this a wrong type fails deep inside a training step with a traceback, or, for a bool
    given as a number, silently runs with 1 or 0.
    """
    hints = _option_hints(factory)
    for option, value in options.items():
        hint = hints.get(option)
        if hint is not None and _fits(value, hint) is False:
            expected = _describe(hint)
            got = yaml_text_number_hint(value) if "number" in expected or "integer" in expected else None
            located = f"{where(f'{key}.{option}')}: " if where is not None else ""
            raise CsekitError(f"{located}recipe key {key}.{option}: expected {expected}, " + (got or f"got {value!r}"))


def yaml_text_number_hint(value: Any) -> str | None:
    """For text that reads as a number (`1e-30`: YAML 1.1 wants a dot in a number with an exponent), say so."""
    if not isinstance(value, str):
        return None
    try:
        float(value)
    except ValueError:
        return None
    mantissa, _, exponent = value.strip().lower().partition("e")
    written = f"{mantissa}.0e{exponent}" if exponent and "." not in mantissa else value.strip()
    return f"YAML read {value} as text, not a number (a YAML number with an exponent needs a dot: {written})"


def _describe(hint: Any) -> str:
    """`float | None` -> "a finite number or null", for error messages."""
    names = {bool: "true or false", int: "an integer", float: "a finite number", str: "a string", type(None): "null"}
    if hint in names:
        return names[hint]
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(option) for option in typing.get_args(hint))
    if origin in (list, tuple, Sequence):
        items = {int: "integers", float: "numbers", str: "strings", bool: "true/false values"}
        arguments = typing.get_args(hint)
        return f"a list of {items[arguments[0]]}" if len(arguments) == 1 and arguments[0] in items else "a list"
    return getattr(hint, "__name__", str(hint))

"""Checks on a loaded checkpoint state before torch sees it: every value is what this run expects.

`torch.load(weights_only=True)` rebuilds only tensors and plain values, but it says nothing about
which: a state tensor of the wrong shape makes the fused AdamW kernel read past its end (a
segmentation fault), a learning rate that is text fails deep inside a step. So each state is
compared with the state the freshly built optimizer, scheduler or scaler has now (its template):
the same keys, list lengths, types, tensor shapes and dtypes, finite numbers, and no negative
value where the template's is a count or a rate. The optimizer's per-parameter state (empty in
the template until the first step) is checked against the parameters themselves.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from csekit.core.numbers import is_finite_number

LARGEST_COUNT = 2**62
"""A count beyond this (a step, an epoch) was not written by a run; torch would overflow an int64 with it."""


class StateMismatch(ValueError):
    """A loaded value does not fit the run; the message names where in the state it is (`param_groups[0].lr`)."""


def check_like(value: Any, template: Any, where: str = "state") -> None:
    """Refuse `value` unless it has the layout, types and ranges of `template` (what the run would write)."""
    if isinstance(template, Mapping):
        if not isinstance(value, Mapping):
            raise StateMismatch(f"{where} is {_kind(value)}, expected a mapping")
        if set(value) != set(template):
            extra, missing = sorted(map(str, set(value) - set(template))), sorted(map(str, set(template) - set(value)))
            raise StateMismatch(f"{where} has keys {extra or 'as expected'} beyond / {missing or 'none'} missing")
        for key, item in template.items():
            check_like(value[key], item, f"{where}.{key}")
    elif isinstance(template, list | tuple):
        if not isinstance(value, list | tuple) or len(value) != len(template):
            raise StateMismatch(f"{where} is {_kind(value)}, expected a list of {len(template)}")
        for index, (item, expected) in enumerate(zip(value, template, strict=True)):
            check_like(item, expected, f"{where}[{index}]")
    elif isinstance(template, torch.Tensor):
        check_tensor(value, tuple(template.shape), template.dtype, where)
    else:
        _check_plain(value, template, where)


def _check_plain(value: Any, template: Any, where: str) -> None:
    """A bool, an int, a float, a string or None like the template's; numbers finite and non-negative like it."""
    if isinstance(template, bool) or template is None or isinstance(template, str):
        if type(value) is not type(template):
            raise StateMismatch(f"{where} is {_kind(value)}, expected {_kind(template)}")
        return
    if isinstance(template, int):
        if not isinstance(value, int) or isinstance(value, bool) or abs(value) > LARGEST_COUNT:
            raise StateMismatch(f"{where} is {_kind(value)}, expected an integer")
    elif isinstance(template, float):
        if not is_finite_number(value):
            raise StateMismatch(f"{where} is {_kind(value)}, expected a finite number")
    else:
        raise StateMismatch(f"{where}: csekit does not know how to check a {type(template).__name__}")
    if template >= 0 > value:
        raise StateMismatch(f"{where} is {value}, expected a number >= 0")


def check_tensor(
    value: Any, shape: tuple[int, ...], dtype: torch.dtype, where: str, non_negative: bool = False
) -> None:
    """A tensor of exactly this shape and dtype, with finite (and, if asked, non-negative) values."""
    if not isinstance(value, torch.Tensor):
        raise StateMismatch(f"{where} is {_kind(value)}, expected a tensor")
    if tuple(value.shape) != shape or value.dtype != dtype:
        raise StateMismatch(
            f"{where} is a {value.dtype} tensor of shape {list(value.shape)}, expected {dtype} {list(shape)}"
        )
    if value.dtype.is_floating_point and not bool(torch.isfinite(value).all()):
        raise StateMismatch(f"{where} holds values that are not finite")
    if non_negative and bool((value < 0).any()):
        raise StateMismatch(f"{where} holds negative values")


ADAM_STATE = ("step", "exp_avg", "exp_avg_sq")
"""What AdamW keeps for each parameter once it has stepped (`max_exp_avg_sq` too with amsgrad)."""


def check_optimizer_state(state: Mapping[str, Any], optimizer: Any) -> None:
    """An AdamW state dict for these parameter groups: their hyperparameters, then each parameter's moments.

    `optimizer` may be accelerate's wrapper: both expose `param_groups` and `state_dict()`.
    """
    template = optimizer.state_dict()
    if not isinstance(state, Mapping) or set(state) != {"state", "param_groups"}:
        raise StateMismatch("state is not an optimizer state (keys state and param_groups)")
    check_like(state["param_groups"], template["param_groups"], "param_groups")
    for index, (group, expected) in enumerate(zip(state["param_groups"], template["param_groups"], strict=True)):
        _check_adam_group(group, expected, f"param_groups[{index}]")
    parameters = [param for group in optimizer.param_groups for param in group["params"]]
    moments = state["state"]
    if not isinstance(moments, Mapping):
        raise StateMismatch(f"state.state is {_kind(moments)}, expected a mapping")
    amsgrad = any(group.get("amsgrad") for group in template["param_groups"])
    for key, entry in moments.items():
        if not isinstance(key, int) or isinstance(key, bool) or not 0 <= key < len(parameters):
            raise StateMismatch(f"state.state has an entry {key!r} for no parameter ({len(parameters)} in all)")
        _check_adam_entry(entry, parameters[key], amsgrad, f"state.state[{key}]")


def _check_adam_group(group: Mapping[str, Any], expected: Mapping[str, Any], where: str) -> None:
    """Settings (bools, None) as the run's; parameter indices the same; betas in [0, 1), eps > 0."""
    for key, value in expected.items():
        if (isinstance(value, bool) or value is None or key == "params") and group[key] != value:
            raise StateMismatch(f"{where}.{key} is {group[key]!r}, this run has {value!r}")
    if not all(0 <= beta < 1 for beta in group["betas"]):
        raise StateMismatch(f"{where}.betas is {list(group['betas'])}, expected numbers in [0, 1)")
    if not group["eps"] > 0:
        raise StateMismatch(f"{where}.eps is {group['eps']}, expected a number > 0")


def _check_adam_entry(entry: Any, param: torch.Tensor, amsgrad: bool, where: str) -> None:
    names = (*ADAM_STATE, "max_exp_avg_sq") if amsgrad else ADAM_STATE
    if not isinstance(entry, Mapping) or set(entry) != set(names):
        found = sorted(map(str, entry)) if isinstance(entry, Mapping) else _kind(entry)
        raise StateMismatch(f"{where} holds {found}, expected {list(names)}")
    step = entry["step"]
    if isinstance(step, torch.Tensor):
        check_tensor(step, (), torch.float32, f"{where}.step", non_negative=True)
    else:
        check_like(step, 0.0, f"{where}.step")
    for name in names[1:]:
        check_tensor(entry[name], tuple(param.shape), param.dtype, f"{where}.{name}", non_negative=name != "exp_avg")


def check_state(state: Any, target: Any) -> None:
    """Refuse a loaded state that does not fit `target` (an optimizer, a scheduler or a gradient scaler)."""
    if hasattr(target, "param_groups"):
        check_optimizer_state(state, target)
    else:
        check_like(state, target.state_dict())


def _kind(value: Any) -> str:
    """How a value is named in a message: its type, and a short repr for plain values."""
    if isinstance(value, int | float | str | bool) or value is None:
        text = repr(value)
        return f"{type(value).__name__} {text[:40]}"
    if isinstance(value, Sequence) and not isinstance(value, str):
        return f"a list of {len(value)}"
    return f"a {type(value).__name__}"

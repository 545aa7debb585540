"""Weighting: per-anchor weights of the in-batch negatives (false negatives weighted out)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from torch import nn

from csekit.core.registry import Registry
from csekit.parts.weighting.complementary import ComplementaryWeighting

BUILTIN: Mapping[str, Callable[..., nn.Module]] = MappingProxyType(
    {"dclr": ComplementaryWeighting}  # DCLR: weight 0 where a frozen complementary model says >= phi
)
"""`weighting` names; see `WEIGHTINGS`."""

WEIGHTINGS: Registry[Callable[..., nn.Module]] = Registry("weighting", BUILTIN, "weighting")
"""`weighting`: weights of the in-batch negatives."""

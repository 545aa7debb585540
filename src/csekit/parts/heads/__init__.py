"""Heads: what sits between the pooled sentence vector and the objectives (training only unless kept)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from torch import nn

from csekit.parts.heads.mlp import IdentityHead, MLPHead
from csekit.parts.heads.whitening import WhiteningHead

BUILTIN: Mapping[str, Callable[..., nn.Module]] = MappingProxyType(
    {
        "mlp": MLPHead,  # SimCSE: Linear + tanh
        "none": IdentityHead,
        "whitening": WhiteningHead,  # WhitenedCSE: (shuffled group) whitening -> Linear -> tanh, m views
    }
)
"""`model.head` names; see `csekit.core.registry.HEADS`."""

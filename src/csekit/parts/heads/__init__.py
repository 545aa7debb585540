"""Heads: what sits between the pooled sentence vector and the objectives (training only unless kept)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from torch import nn

from csekit.core.registry import Registry
from csekit.parts.heads.mlp import IdentityHead, MLPHead
from csekit.parts.heads.projection import BatchNormProjection
from csekit.parts.heads.whitening import WhiteningHead

BUILTIN: Mapping[str, Callable[..., nn.Module]] = MappingProxyType(
    {
        "mlp": MLPHead,  # SimCSE: Linear + tanh
        "none": IdentityHead,
        "batchnorm_mlp": BatchNormProjection,  # DiffCSE's code: Linear -> BN -> ReLU -> Linear -> BN, training only
        "whitening": WhiteningHead,  # WhitenedCSE: (shuffled group) whitening -> Linear -> tanh, m views
    }
)
"""`model.head` names; see `HEADS`."""

HEADS: Registry[Callable[..., nn.Module]] = Registry("head", BUILTIN, "head")
"""`model.head`: the projection between the pooled vector and the objectives."""

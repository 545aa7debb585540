"""Negative sources: extra negatives every anchor contrasts, beside the in-batch ones."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from torch import nn

from csekit.core.registry import Registry
from csekit.parts.negatives.mixing import MixedNegatives
from csekit.parts.negatives.momentum import MomentumQueue
from csekit.parts.negatives.noise import NoiseNegatives

BUILTIN: Mapping[str, Callable[..., nn.Module]] = MappingProxyType(
    {
        "dclr_noise": NoiseNegatives,  # DCLR: Gaussian noise moved by gradient ascent on L_U
        "mixcse": MixedNegatives,  # MixCSE: each positive mixed into an in-batch negative, gradient stopped
        "momentum_queue": MomentumQueue,  # ESimCSE: a momentum encoder's outputs of past batches, queued
    }
)
"""`negatives` names; see `NEGATIVES`."""

NEGATIVES: Registry[Callable[..., nn.Module]] = Registry("negatives", BUILTIN, "negatives")
"""`negatives`: extra negatives added to each step."""

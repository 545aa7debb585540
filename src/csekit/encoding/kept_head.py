"""A head kept at test time, in the one form csekit saves and sentence-transformers loads: Linear + tanh.

It lives with the encoder because a saved model folder may carry one (a `Dense` module with tanh);
training heads (`csekit.parts.heads`) derive from it or fold into it.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor, nn


def backbone_initializer_range(encoder: Any) -> float | None:
    """The backbone config's `initializer_range` (the std of its Linear weights), None when it has none."""
    config = getattr(getattr(encoder, "backbone", None), "config", None)
    value = getattr(config, "initializer_range", None)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def init_like_backbone(linear: nn.Linear, initializer_range: float | None) -> None:
    """Initialise a head's Linear as the backbone's own: weights N(0, initializer_range), bias 0.

    SimCSE's code (and DCLR's, WhitenedCSE's, PromptBERT's, built on it) creates its MLP in `cl_init`
    and then calls `init_weights`, which gives every new Linear transformers' `_init_weights`. None
    (no encoder, or a config without `initializer_range`) keeps PyTorch's default.
    """
    if initializer_range is None:
        return
    with torch.no_grad():
        linear.weight.normal_(mean=0.0, std=initializer_range)
        if linear.bias is not None:
            linear.bias.zero_()


class DenseTanh(nn.Module):
    """Linear(d, d) followed by tanh: SimCSE's head and sentence-transformers' Dense(activation=tanh)."""

    def __init__(self, dim: int, initializer_range: float | None = None) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, dim)
        init_like_backbone(self.linear, initializer_range)
        self.activation = nn.Tanh()

    def forward(self, features: Tensor) -> Tensor:
        return self.activation(self.linear(features))


@runtime_checkable
class ExportsAsDenseTanh(Protocol):
    """A head kept at test time that folds into one Linear + tanh for sentence-transformers (whitening does)."""

    def to_dense_tanh(self) -> DenseTanh: ...

"""A head kept at test time, in the one form csekit saves and sentence-transformers loads: Linear + tanh.

It lives with the encoder because a saved model folder may carry one (a `Dense` module with tanh);
training heads (`csekit.parts.heads`) derive from it or fold into it.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from torch import Tensor, nn


class DenseTanh(nn.Module):
    """Linear(d, d) followed by tanh: SimCSE's head and sentence-transformers' Dense(activation=tanh)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, dim)
        self.activation = nn.Tanh()

    def forward(self, features: Tensor) -> Tensor:
        return self.activation(self.linear(features))


@runtime_checkable
class ExportsAsDenseTanh(Protocol):
    """A head kept at test time that folds into one Linear + tanh for sentence-transformers (whitening does)."""

    def to_dense_tanh(self) -> DenseTanh: ...

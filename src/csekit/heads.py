"""Projection heads placed between the pooled sentence vector and the contrastive objectives.

SimCSE's head (Linear d->d + tanh) is used in training only: at test time the representation is
taken before it. Recipes may keep a head at test time (WhitenedCSE's paper does); the encoder then
carries it and exports it.
"""

from __future__ import annotations

from torch import Tensor, nn

from csekit.whitening import WhiteningHead


class MLPHead(nn.Module):
    """SimCSE's training head: Linear(d, d) followed by tanh."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, dim)
        self.activation = nn.Tanh()

    def forward(self, features: Tensor) -> Tensor:
        return self.activation(self.linear(features))


class IdentityHead(nn.Module):
    """No head: objectives see the pooled vector itself."""

    def __init__(self, dim: int) -> None:
        super().__init__()

    def forward(self, features: Tensor) -> Tensor:
        return features


HEADS: dict[str, type[nn.Module]] = {"mlp": MLPHead, "none": IdentityHead}
HEADS["whitening"] = WhiteningHead  # WhitenedCSE: (shuffled group) whitening -> Linear -> tanh, m views
"""Head names a recipe may use; later methods add their own (e.g. whitening heads)."""

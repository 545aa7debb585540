"""Projection heads placed between the pooled sentence vector and the contrastive objectives.

SimCSE's head (Linear d->d + tanh) is used in training only: at test time the representation is
taken before it. Recipes may keep a head at test time (WhitenedCSE's paper does); the encoder then
carries it and exports it.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from csekit.encoding.kept_head import DenseTanh, backbone_initializer_range
from csekit.encoding.pooling import backbone_pooler_layer


class MLPHead(DenseTanh):
    """SimCSE's training head: Linear(d, d) followed by tanh.

    `through_backbone_pooler: true` first passes the [CLS] vector through the backbone's own pre-trained
    pooler layer (BERT's NSP pooler: dense + tanh, trained along), as DCLR's code does (models.py: the
    trained model's representation is `mlp(bert.pooler(last_hidden))`), for reproducing its numbers.
    The head is then training-only (the code evaluates the [CLS] state before both layers), needs the
    `cls` pooler, and the backbone's pooler layer, frozen by the encoder otherwise, is unfrozen.
    The Linear starts as SimCSE's code starts it: N(0, the backbone's initializer_range), bias 0.
    `encoder` and `head_at_test` (`model.head_at_test`) are build arguments.
    """

    def __init__(
        self,
        dim: int,
        through_backbone_pooler: bool = False,
        encoder: Any = None,
        head_at_test: bool = False,
    ) -> None:
        super().__init__(dim, backbone_initializer_range(encoder))
        backbone_pooler = None
        if through_backbone_pooler:
            if encoder is None:
                raise ValueError("through_backbone_pooler needs the encoder (build the head from a recipe)")
            if encoder.pooler.name != "cls":
                raise ValueError(
                    f"through_backbone_pooler reads [CLS] through the backbone's pooler layer: it needs model.pooler "
                    f'cls, not "{encoder.pooler.name}"'
                )
            if head_at_test:
                raise ValueError(
                    "through_backbone_pooler is a training-only head (DCLR's code evaluates [CLS] before it): "
                    "set model.head_at_test: false"
                )
            backbone_pooler = backbone_pooler_layer(encoder.backbone, "model.head.through_backbone_pooler")
            backbone_pooler.requires_grad_(True)
        # A plain reference: the backbone owns the layer (its state_dict entry, its optimizer group).
        object.__setattr__(self, "_backbone_pooler", backbone_pooler)

    def forward(self, features: Tensor) -> Tensor:
        backbone_pooler = self.__dict__["_backbone_pooler"]
        if backbone_pooler is not None:
            features = backbone_pooler.activation(backbone_pooler.dense(features))
        return self.activation(self.linear(features))


class IdentityHead(nn.Module):
    """No head: objectives see the pooled vector itself."""

    def __init__(self, dim: int) -> None:
        super().__init__()

    def forward(self, features: Tensor) -> Tensor:
        return features

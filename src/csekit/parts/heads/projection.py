"""DiffCSE's training head (Chuang et al., NAACL 2022): `model.head: {name: batchnorm_mlp}`.

The authors' code (voidism/DiffCSE, diffcse/models.py `ProjectionMLP`, chosen by `--batchnorm` in their run
script) replaces SimCSE's Linear + tanh with Linear(d, 2d, no bias) -> BatchNorm -> ReLU -> Linear(2d, d, no
bias) -> BatchNorm without affine parameters, over all the step's views at once (its statistics are those of
the V * n stacked rows, as the code applies it to the flattened views). The Linears start as the backbone's
own (N(0, initializer_range): the code builds the head before `init_weights`). Training only: the authors
evaluate [CLS] before it (`--mlp_only_train`, `cls_before_pooler`), so `model.head_at_test: true` is refused.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from csekit.encoding.kept_head import backbone_initializer_range, init_like_backbone


class BatchNormProjection(nn.Module):
    """DiffCSE's `ProjectionMLP`: Linear -> BN -> ReLU -> Linear -> BN (no affine), widths d -> 2d -> d.

    `dim`, `encoder` and `head_at_test` are build arguments.
    """

    def __init__(self, dim: int, encoder: Any = None, head_at_test: bool = False) -> None:
        super().__init__()
        if head_at_test:
            raise ValueError(
                "batchnorm_mlp is a training-only head (DiffCSE evaluates [CLS] before it): "
                "set model.head_at_test: false"
            )
        initializer_range = backbone_initializer_range(encoder)
        first, second = nn.Linear(dim, 2 * dim, bias=False), nn.Linear(2 * dim, dim, bias=False)
        for linear in (first, second):
            init_like_backbone(linear, initializer_range)
        self.net = nn.Sequential(first, nn.BatchNorm1d(2 * dim), nn.ReLU(), second, nn.BatchNorm1d(dim, affine=False))

    def forward(self, features: Tensor) -> Tensor:
        return self.net(features)

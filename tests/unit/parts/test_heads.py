"""Heads start as the authors' code starts them (SimCSE's `cl_init` -> `init_weights`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import make_tiny_encoder

from csekit.parts.heads import HEADS
from csekit.training.part_building import build_part

INITIALIZER_RANGE = 0.5
"""Far from PyTorch's default for a 32-wide Linear (uniform +-1/sqrt(32): std 0.10), so the two cannot be confused."""


def head_linear(spec: dict[str, object], folder: Path, initializer_range: float) -> torch.nn.Linear:
    encoder = make_tiny_encoder(folder, initializer_range=initializer_range)
    head = build_part(HEADS, spec, "model.head", dim=encoder.dim, encoder=encoder)
    return head.linear


@pytest.mark.parametrize(
    "spec",
    [
        {"name": "mlp"},
        {"name": "whitening", "whitening": "zca", "num_groups": None, "group_size": None},
        {"name": "whitening", "whitening": "shuffled_group", "num_groups": 8},
    ],
    ids=["mlp", "whitening-zca", "whitening-sgw"],
)
def test_a_head_linear_starts_like_the_backbones_linears(spec: dict[str, object], tmp_path: Path) -> None:
    """transformers' `_init_weights` for an nn.Linear: weight ~ N(0, config.initializer_range), bias = 0."""
    linear = head_linear(spec, tmp_path, INITIALIZER_RANGE)
    weight = linear.weight.detach().double()
    assert torch.count_nonzero(linear.bias) == 0
    # 1024 draws: the sample std of N(0, 0.5) lies within 0.5 +- 0.035 with probability > 0.999
    assert abs(float(weight.std()) - INITIALIZER_RANGE) < 0.035
    assert abs(float(weight.mean())) < 0.06
    assert float(weight.abs().max()) > 1.0 / 32**0.5  # beyond PyTorch's uniform bound: not its default


def test_the_initialisation_follows_the_config_of_each_backbone(tmp_path: Path) -> None:
    narrow = head_linear({"name": "mlp"}, tmp_path / "a", 0.02)
    wide = head_linear({"name": "mlp"}, tmp_path / "b", 0.3)
    assert abs(float(narrow.weight.detach().std()) - 0.02) < 0.002
    assert abs(float(wide.weight.detach().std()) - 0.3) < 0.025

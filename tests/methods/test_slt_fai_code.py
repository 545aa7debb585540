"""SLT-FAI's discriminators as the authors' code builds them (`discriminator: code`), beside the paper's G."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import make_tiny_encoder
from test_slt_fai import write_counts
from torch import nn

from csekit.core.errors import CsekitError
from csekit.parts.objectives import OBJECTIVES
from csekit.parts.objectives.slt_fai import AdversarialTuning, Discriminator, IncompleteSentenceFiltering
from csekit.training.part_building import build_part


def authors_frequency_stack(hidden_dim: int, high_rank: int) -> nn.Sequential:
    """`freqDiscrim.ffnn` (wangbing1416/SLT-FAI fb9d14f, `AdvCLSoftmaxLoss.py` L262-276), as written there."""
    if high_rank != 0:
        return nn.Sequential(
            nn.Linear(hidden_dim, high_rank * hidden_dim),
            nn.Linear(high_rank * hidden_dim, high_rank * hidden_dim),
            nn.Linear(high_rank * hidden_dim, hidden_dim),
            nn.Linear(hidden_dim, 2),
            nn.ReLU(inplace=True),
        )
    return nn.Sequential(nn.Linear(hidden_dim, hidden_dim), nn.Linear(hidden_dim, 2), nn.ReLU(inplace=True))


def authors_mask_stack(hidden_dim: int) -> nn.Sequential:
    """`maskDiscrim.ffnn` (the same file, L300-304)."""
    return nn.Sequential(nn.Linear(hidden_dim, hidden_dim), nn.Linear(hidden_dim, 2), nn.ReLU(inplace=True))


@pytest.mark.parametrize("rank", [0, 2, 3])
def test_the_code_form_is_the_authors_frequency_stack_on_their_weights(rank: int) -> None:
    torch.manual_seed(0)
    reference = authors_frequency_stack(12, rank)
    ours = Discriminator(12, form="code", rank=rank)
    ours.layers.load_state_dict(reference.state_dict())  # same layers, same order: every key and shape matches
    inputs = torch.randn(64, 12) * 3
    expected = reference(inputs.clone())
    torch.testing.assert_close(ours(inputs), expected, rtol=0, atol=0)
    assert bool((expected == 0).any()) and bool((expected >= 0).all())  # the ReLU on the logits acts


def test_the_paper_form_puts_the_relu_between_two_layers_and_allows_negative_logits() -> None:
    torch.manual_seed(0)
    paper = Discriminator(12)
    assert [type(layer) for layer in paper.layers] == [nn.Linear, nn.ReLU, nn.Linear]
    assert bool((paper(torch.randn(64, 12) * 3) < 0).any())


def test_each_term_builds_the_authors_discriminator_from_a_recipe_spec(tmp_path: Path) -> None:
    encoder = make_tiny_encoder(tmp_path / "tok", pooler="mean")
    counts = str(write_counts(encoder.tokenizer, tmp_path / "counts.json"))
    options = {"dim": encoder.dim, "tokenizer": encoder.tokenizer, "max_length": 16}
    at = build_part(OBJECTIVES, {"name": "slt_fai_at", "counts": counts, "discriminator": "code"}, "o[1]", **options)
    isf = build_part(OBJECTIVES, {"name": "slt_fai_isf", "counts": counts, "discriminator": "code"}, "o[2]", **options)
    assert isinstance(at, AdversarialTuning) and isinstance(isf, IncompleteSentenceFiltering)
    # L_AT: freqDiscrim at the scripts' --high_rank 2; L_ISF: maskDiscrim; the same parameter shapes as the authors'.
    shapes = {name: tuple(p.shape) for name, p in at.discriminator.layers.named_parameters()}
    assert shapes == {name: tuple(p.shape) for name, p in authors_frequency_stack(encoder.dim, 2).named_parameters()}
    shapes = {name: tuple(p.shape) for name, p in isf.discriminator.layers.named_parameters()}
    assert shapes == {name: tuple(p.shape) for name, p in authors_mask_stack(encoder.dim).named_parameters()}
    default = build_part(OBJECTIVES, {"name": "slt_fai_at", "counts": counts}, "o[1]", **options)
    assert [type(layer) for layer in default.discriminator.layers] == [nn.Linear, nn.ReLU, nn.Linear]


@pytest.mark.parametrize("value", ["authors", "", "Code", 2])
def test_another_discriminator_is_one_line_naming_the_key(value: object) -> None:
    stub = SimpleNamespace(mask_token_id=4, is_fast=True)
    spec = {"name": "slt_fai_at", "counts": "x.json", "discriminator": value}
    with pytest.raises(CsekitError, match=r"recipe key objectives\[1\].*discriminator"):
        build_part(OBJECTIVES, spec, "objectives[1]", dim=8, tokenizer=stub, max_length=16)

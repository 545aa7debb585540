"""csekit.encoding.fast_dropout: the 16-bit masks, the dropout layer and the attention function against references."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from csekit.encoding.encoder import SentenceEncoder
from csekit.encoding.fast_dropout import (
    ATTENTION,
    FastDropout,
    cpu_training_attention,
    enable_fast_dropout,
    fast_dropout,
    keep_mask,
    rounded_drop_probability,
)
from csekit.training.execution import build_run_model
from csekit.training.recipe import load_recipe


def test_drop_probability_is_rounded_to_sixteen_bits() -> None:
    assert rounded_drop_probability(0.1) == 6554 / 65536
    assert rounded_drop_probability(0.5) == 0.5
    assert rounded_drop_probability(0.0) == 0.0


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_every_lane_of_a_draw_keeps_at_the_requested_rate(p: float) -> None:
    """Each 64-bit draw fills four elements; a lane with a constant bit (e.g. the sign) would skew one of them."""
    torch.manual_seed(0)
    keep = keep_mask((1_000_000, 4), p).float()
    expected = 1.0 - rounded_drop_probability(p)
    tolerance = 6 * (expected * (1 - expected) / 1_000_000) ** 0.5
    for lane, rate in enumerate(keep.mean(dim=0).tolist()):
        assert abs(rate - expected) < tolerance, f"lane {lane}: keep rate {rate}, expected {expected}"
    # neighbouring elements are independent: both kept as often as the product of the rates
    both = (keep[:, 0] * keep[:, 1]).mean().item()
    assert abs(both - expected**2) < tolerance


def test_masks_follow_the_seed() -> None:
    torch.manual_seed(3)
    first = keep_mask((7, 5), 0.3)
    torch.manual_seed(3)
    assert torch.equal(keep_mask((7, 5), 0.3), first)
    assert not torch.equal(keep_mask((7, 5), 0.3), first)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fast_dropout_is_the_masked_and_rescaled_input_with_the_matching_gradient(dtype: torch.dtype) -> None:
    x = torch.randn(6, 9, 16).to(dtype).requires_grad_()
    torch.manual_seed(1)
    keep = keep_mask(x.shape, 0.2)
    torch.manual_seed(1)
    out = fast_dropout(x, 0.2)
    scale = 1.0 / (1.0 - rounded_drop_probability(0.2))
    torch.testing.assert_close(out, x.detach() * keep * scale)
    assert torch.all(out[~keep] == 0) and out.dtype == dtype
    upstream = torch.randn_like(out)
    out.backward(upstream)
    torch.testing.assert_close(x.grad, upstream * keep * scale)


def test_fast_dropout_is_unbiased() -> None:
    torch.manual_seed(0)
    x = torch.full((2_000_000,), 2.0)
    assert abs(fast_dropout(x, 0.1).mean().item() - 2.0) < 2e-3
    assert torch.equal(fast_dropout(x, 0.0), x)
    assert torch.all(fast_dropout(x[:10], 1.0) == 0)


def test_fast_dropout_layer_acts_only_in_training() -> None:
    layer = FastDropout(0.5)
    x = torch.ones(10_000)
    assert torch.equal(layer.eval()(x), x)
    dropped = (layer.train()(x) == 0).float().mean().item()
    assert 0.47 < dropped < 0.53


def attention_inputs(padding: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    torch.manual_seed(0)
    query, key, value = (torch.randn(3, 2, 5, 8, requires_grad=True) for _ in range(3))
    if not padding:
        return query, key, value, None
    lengths = torch.tensor([5, 3, 1])
    keys_valid = torch.arange(5)[None, :] < lengths[:, None]  # [B, L]
    return query, key, value, keys_valid[:, None, None, :].expand(3, 1, 5, 5)


@pytest.mark.parametrize("padding", [True, False])
def test_attention_without_dropout_matches_transformers_sdpa(padding: bool) -> None:
    query, key, value, mask = attention_inputs(padding)
    module = nn.Module()
    ours, _ = cpu_training_attention(module, query, key, value, mask, dropout=0.0, scaling=0.3)
    ours.sum().backward()
    our_grads = [t.grad.clone() for t in (query, key, value)]
    for t in (query, key, value):
        t.grad = None
    reference, _ = sdpa_attention_forward(module, query, key, value, mask, dropout=0.0, scaling=0.3, is_causal=False)
    reference.sum().backward()
    torch.testing.assert_close(ours, reference)
    for mine, theirs in zip(our_grads, [t.grad for t in (query, key, value)], strict=True):
        torch.testing.assert_close(mine, theirs)


def test_attention_dropout_drops_probabilities_with_the_fast_mask() -> None:
    query, key, value, mask = attention_inputs(padding=True)
    torch.manual_seed(5)
    out, _ = cpu_training_attention(nn.Module(), query, key, value, mask, dropout=0.25, scaling=0.3)
    torch.manual_seed(5)
    keep = keep_mask((3, 2, 5, 5), 0.25)
    scores = (query @ key.transpose(2, 3) * 0.3).masked_fill(~mask, torch.finfo(torch.float32).min)
    weights = scores.softmax(-1) * keep / (1 - rounded_drop_probability(0.25))
    torch.testing.assert_close(out, (weights @ value).transpose(1, 2))


def test_attention_defers_to_sdpa_without_gradients_and_for_causal_modules() -> None:
    query, key, value, _ = attention_inputs(padding=False)
    causal = nn.Module()
    causal.is_causal = True
    reference, _ = sdpa_attention_forward(causal, query, key, value, None, scaling=0.3)
    ours, _ = cpu_training_attention(causal, query, key, value, None, scaling=0.3)
    torch.testing.assert_close(ours, reference)  # causal: a plain softmax would attend to the future
    with torch.no_grad():
        torch.manual_seed(0)
        ours, _ = cpu_training_attention(nn.Module(), query, key, value, None, dropout=0.0, scaling=0.3)
    torch.testing.assert_close(ours, sdpa_attention_forward(nn.Module(), query, key, value, None, scaling=0.3)[0])


def test_swapped_layers_keep_the_models_mode(tiny_model_dir: Path) -> None:
    encoder = SentenceEncoder.load(tiny_model_dir, dropout=0.1).eval()
    enable_fast_dropout(encoder.backbone)
    assert not any(m.training for m in encoder.modules())
    inputs = encoder.tokenize(["a man plays the guitar"])
    torch.testing.assert_close(encoder(inputs).pooled, encoder(inputs).pooled, rtol=0, atol=0)


def test_an_encoder_with_fast_dropout_computes_the_same_function(tiny_model_dir: Path) -> None:
    """Without dropout the switch changes nothing (values and gradients); evaluation is bit-identical."""
    plain = SentenceEncoder.load(tiny_model_dir, pooler="mean", dropout=0.0).train()
    fast = SentenceEncoder.load(tiny_model_dir, pooler="mean", dropout=0.0).train()
    assert enable_fast_dropout(fast.backbone)
    assert fast.backbone.config._attn_implementation == ATTENTION
    assert not any(type(m) is nn.Dropout for m in fast.backbone.modules())
    inputs = plain.tokenize(["a man plays the guitar", "the dog", "a cat sits on the red house today"])
    results = []
    for encoder in (plain, fast):
        pooled = encoder(inputs).pooled
        pooled.pow(2).sum().backward()
        results.append((pooled.detach(), {n: p.grad for n, p in encoder.named_parameters() if p.grad is not None}))
    torch.testing.assert_close(results[1][0], results[0][0])
    for name, grad in results[0][1].items():
        torch.testing.assert_close(results[1][1][name], grad, msg=lambda m, n=name: f"{n}: {m}")
    with torch.no_grad():
        assert torch.equal(fast.eval()(inputs).pooled, plain.eval()(inputs).pooled)


def test_dropout_views_differ_and_the_trained_model_exports_unchanged(tiny_model_dir: Path, tmp_path: Path) -> None:
    recipe_file = tmp_path / "r.yaml"
    recipe_file.write_text("objectives: [{name: infonce, temperature: 0.05}]\n", encoding="utf-8")
    recipe = load_recipe(recipe_file, [f"model.backbone={tiny_model_dir}"])
    encoder = SentenceEncoder.load(tiny_model_dir, pooler="cls", dropout=0.1)
    model, _ = build_run_model(recipe, encoder)
    assert any(isinstance(m, FastDropout) for m in encoder.backbone.modules())
    sentences = ["a man plays the guitar", "the dog runs"]
    model.train()
    first, second = encoder(encoder.tokenize(sentences)).pooled, encoder(encoder.tokenize(sentences)).pooled
    assert not torch.allclose(first, second)  # SimCSE's positives come from dropout
    encoder.save(tmp_path / "model")
    config = json.loads((tmp_path / "model" / "config.json").read_text(encoding="utf-8"))
    assert ATTENTION not in json.dumps(config)
    st = pytest.importorskip("sentence_transformers")
    theirs = st.SentenceTransformer(str(tmp_path / "model"), device="cpu").encode(sentences)
    np.testing.assert_allclose(theirs, encoder.encode(sentences), atol=1e-5)


def test_the_recipe_can_keep_pytorchs_dropout(tiny_model_dir: Path, tmp_path: Path) -> None:
    recipe_file = tmp_path / "r.yaml"
    recipe_file.write_text("objectives: [{name: infonce, temperature: 0.05}]\n", encoding="utf-8")
    recipe = load_recipe(recipe_file, [f"model.backbone={tiny_model_dir}", "run.fast_dropout=false"])
    encoder = SentenceEncoder.load(tiny_model_dir, pooler="cls")
    build_run_model(recipe, encoder)
    assert not any(isinstance(m, FastDropout) for m in encoder.backbone.modules())
    assert encoder.backbone.config._attn_implementation == "sdpa"

"""The optimizers a recipe may name: sentence-transformers 0.3's AdamW (ConSERT, SLT-FAI) beside torch's."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from conftest import make_corpus, make_tiny_encoder, tiny_recipe

from csekit.core.errors import CsekitError
from csekit.training.execution import build_run_model
from csekit.training.optimization import UncorrectedAdamW, make_optimizer
from csekit.training.recipe import load_recipe


def transformers3_adamw_no_bias_correction(
    values: list[float], grads: list[list[float]], lr: float, weight_decay: float
) -> list[float]:
    """transformers 3.x AdamW.step with correct_bias=False, eps 1e-6, betas (0.9, 0.999), written out per scalar."""
    beta1, beta2, eps = 0.9, 0.999, 1e-6
    m, v = [0.0] * len(values), [0.0] * len(values)
    p = list(values)
    for grad in grads:
        for i, g in enumerate(grad):
            m[i] = beta1 * m[i] + (1 - beta1) * g
            v[i] = beta2 * v[i] + (1 - beta2) * g * g
            p[i] = p[i] - lr * m[i] / (math.sqrt(v[i]) + eps)  # step_size = lr: no bias correction
            p[i] = p[i] - lr * weight_decay * p[i]  # decay after the update, on the updated weight
    return p


@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_uncorrected_adamw_follows_the_update_rule(weight_decay: float) -> None:
    start = [0.5, -1.5, 2.0, 1e-3]
    grads = [[0.1, -2.0, 3e-4, 0.0], [0.3, 1.0, -5e-4, 1e-7], [-0.2, 0.5, 1e-4, -1e-7]]
    param = torch.nn.Parameter(torch.tensor(start, dtype=torch.float64))
    optimizer = UncorrectedAdamW([param], lr=0.1, weight_decay=weight_decay)
    for grad in grads:
        param.grad = torch.tensor(grad, dtype=torch.float64)
        optimizer.step()
    expected = transformers3_adamw_no_bias_correction(start, grads, 0.1, weight_decay)
    torch.testing.assert_close(param.detach(), torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=1e-15)
    # torch's AdamW (bias-corrected, eps 1e-8) takes another path: the rule above is what tells them apart
    other = torch.nn.Parameter(torch.tensor(start, dtype=torch.float64))
    reference = torch.optim.AdamW([other], lr=0.1, weight_decay=weight_decay)
    for grad in grads:
        other.grad = torch.tensor(grad, dtype=torch.float64)
        reference.step()
    assert not torch.allclose(other.detach(), param.detach(), rtol=1e-3)


def test_uncorrected_adamw_state_round_trips(tmp_path: Path) -> None:
    """A resumed run continues the moments and the step count (the checkpoint holds the state dict)."""
    param = torch.nn.Parameter(torch.ones(3))
    optimizer = UncorrectedAdamW([param], lr=0.1)
    param.grad = torch.tensor([1.0, -1.0, 0.5])
    optimizer.step()
    torch.save(optimizer.state_dict(), tmp_path / "optimizer.pt")
    resumed = UncorrectedAdamW([torch.nn.Parameter(param.detach().clone())], lr=0.1)
    resumed.load_state_dict(torch.load(tmp_path / "optimizer.pt", weights_only=True))
    state = next(iter(resumed.state.values()))
    assert float(state["step"]) == 1.0
    torch.testing.assert_close(state["exp_avg"], torch.tensor([0.1, -0.1, 0.05]))


def test_a_recipe_names_the_optimizer(tmp_path: Path) -> None:
    corpus = make_corpus(tmp_path / "corpus.txt")
    encoder = make_tiny_encoder(tmp_path / "tok")
    for name, kind in (("adamw", torch.optim.AdamW), ("adamw_uncorrected", UncorrectedAdamW)):
        recipe = tiny_recipe(tmp_path, corpus, f"train.optimizer={name}", "train.weight_decay=0.01")
        model, _ = build_run_model(recipe, encoder)
        optimizer = make_optimizer(model, recipe)
        assert type(optimizer) is kind
        assert {group["weight_decay"] for group in optimizer.param_groups} == {0.0, 0.01}  # no decay on biases
    with pytest.raises(CsekitError, match=r"train\.optimizer.*adamw, adamw_uncorrected"):
        load_recipe(None, ["train.optimizer=sgd"])


@pytest.mark.parametrize("name", ["slt-fai-consert-sts.yaml", "consert-views-minilm.yaml"])
def test_the_consert_based_recipes_use_sentence_transformers_03s_optimizer(name: str) -> None:
    recipe = load_recipe(Path(__file__).resolve().parents[3] / "recipes" / name)
    assert recipe.train.optimizer == "adamw_uncorrected"

"""Contrastive Tension (in-batch negatives) against sentence-transformers' ContrastiveTensionLossInBatchNegatives."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from conftest import DISTINCT_SENTENCES, TinyTrainer, make_tiny_encoder
from part_checks import assert_same_gradients, gradients
from st_reference import sentence_transformer_of, st_losses

from csekit.core.errors import CsekitError
from csekit.parts.heads.mlp import IdentityHead, MLPHead
from csekit.parts.objectives import ContrastiveTension
from csekit.parts.views import VIEWS
from csekit.training.model import ContrastiveModel

SENTENCES = DISTINCT_SENTENCES[:8]


def ct_model(tmp_path: Path, **options: object) -> tuple[ContrastiveModel, ContrastiveTension]:
    encoder = make_tiny_encoder(tmp_path / "tok", pooler="mean", initializer_range=0.2)
    head = IdentityHead(encoder.dim)
    objective = ContrastiveTension(encoder, head, **options)  # type: ignore[arg-type]
    return ContrastiveModel(encoder, head, 1, [(objective, 1.0)]), objective


def perturb(module: torch.nn.Module, seed: int) -> None:
    """Move the weights away from the other encoder's, the same way on both sides (two encoders part in training)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in module.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=generator))


@pytest.mark.parametrize(("scale", "similarity"), [(20.0, "cosine"), (1.0, "dot")])
def test_loss_and_gradients_equal_sentence_transformers(tmp_path: Path, scale: float, similarity: str) -> None:
    losses = st_losses()
    util = pytest.importorskip("sentence_transformers.util")
    model, objective = ct_model(tmp_path, scale=scale, similarity=similarity)
    reference_model = sentence_transformer_of(model.encoder, tmp_path / "st")
    reference = losses.ContrastiveTensionLossInBatchNegatives(
        reference_model, scale=scale, similarity_fct=util.cos_sim if similarity == "cosine" else util.dot_score
    )
    # model1 (the copy) differs from model2 (the saved encoder) after the first step: make it so on both sides
    perturb(objective.copy_encoder.backbone, seed=7)
    perturb(reference.model1[0].auto_model, seed=7)
    model.eval()  # dropout off in both encoders, on both sides: the same computation
    reference.eval()

    views = VIEWS.get("single", "test")(model.encoder.tokenizer, model.encoder.pooler, 32)
    ours, _ = model(views(SENTENCES), SENTENCES)
    ours.backward()
    features = reference_model.tokenize(SENTENCES)
    theirs = reference([features], None)
    theirs.backward()

    assert ours.item() > 0.1
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-6, abs=1e-6)
    assert objective.logit_scale.grad is not None
    torch.testing.assert_close(objective.logit_scale.grad, reference.logit_scale.grad, rtol=1e-4, atol=1e-6)
    pairs = [
        (model.encoder.backbone, reference.model2[0].auto_model),  # the saved encoder is sentence-transformers' model2
        (objective.copy_encoder.backbone, reference.model1[0].auto_model),  # the copy is its model1
    ]
    for ours_module, theirs_module in pairs:
        theirs_grads = gradients(theirs_module.named_parameters())
        compared = assert_same_gradients(
            ours_module.named_parameters(), theirs_grads, rtol=1e-4, atol=1e-6, zero_is_none=True
        )
        assert compared > 10


def test_both_encoders_and_the_scale_train_and_only_the_encoder_is_saved(tmp_path: Path) -> None:
    model, objective = ct_model(tmp_path)
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    assert all(id(p) in trainable for p in objective.copy_encoder.parameters())
    assert id(objective.logit_scale) in trainable
    assert model.saved_encoder() is model.encoder
    held, _ = ct_model(tmp_path, learn_scale=False)
    assert not held.objectives[0].logit_scale.requires_grad


def test_refuses_a_head_and_a_missing_view(tmp_path: Path) -> None:
    encoder = make_tiny_encoder(tmp_path / "tok", pooler="mean")
    with pytest.raises(ValueError, match=r"model\.head to none"):
        ContrastiveTension(encoder, MLPHead(encoder.dim))
    with pytest.raises(ValueError, match="similarity"):
        ContrastiveTension(encoder, similarity="euclid")
    model, _ = ct_model(tmp_path, view=1)
    views = VIEWS.get("single", "test")(model.encoder.tokenizer, model.encoder.pooler, 32)
    with pytest.raises(CsekitError, match="option view 1"):
        model(views(SENTENCES), SENTENCES)


def test_a_ct_recipe_trains_both_encoders_and_exports_only_its_own(
    tiny_model_dir: Path, train_tiny: TinyTrainer
) -> None:
    from safetensors.torch import load_file

    run = train_tiny("model.head={name: none}", "data.views={name: single}", "objectives=[{name: contrastive_tension}]")
    assert run.result.steps == 3
    start = load_file(next(tiny_model_dir.glob("*.safetensors")))
    exported = load_file(next((run.folder / "best").glob("*.safetensors")))
    assert set(exported) == set(start)  # the encoder alone, not the copy
    checkpoint = load_file(run.folder / "checkpoint" / "model.safetensors")
    copy_keys = [key for key in checkpoint if key.startswith("objectives.0.copy_encoder.")]
    assert copy_keys and "objectives.0.logit_scale" in checkpoint
    assert float(checkpoint["objectives.0.logit_scale"]) != pytest.approx(math.log(20.0))  # the scale trained
    name = next(key for key in start if key.endswith("word_embeddings.weight"))
    copy_name = next(key for key in copy_keys if key.endswith("word_embeddings.weight"))
    assert not torch.equal(exported[name], start[name])  # the encoder (model2) trained
    assert not torch.equal(checkpoint[copy_name], start[name])  # the copy (model1) trained too
    assert not torch.equal(checkpoint[copy_name], exported[name])  # apart: two encoders, not one


def test_contrastive_tension_composes_with_simcse(train_tiny: TinyTrainer) -> None:
    """Beside SimCSE's infonce on two dropout views, the copy reads view 0's inputs; both losses are logged."""
    objectives = "objectives=[{name: infonce}, {name: contrastive_tension, weight: 0.5}]"
    run = train_tiny("model.head={name: none}", objectives, steps=2)
    assert run.result.steps == 2
    record = run.losses[0]
    assert record["loss"] == pytest.approx(record["infonce"] + 0.5 * record["contrastive_tension"], rel=1e-5)


def ct_resume_recipe(model_dir: Path, corpus: Path, marker: Path) -> str:
    return f"""
model: {{backbone: "{model_dir}", pooler: mean, max_length: 16, head: {{name: none}}}}
data: {{corpus: "{corpus}", views: {{name: single}}}}
train: {{batch_size: 16, lr: 1.0e-3, max_steps: 12, eval_every: 4, log_every: 1, dev_task: none, seed: 7}}
objectives:
  - {{name: contrastive_tension}}
  - {{name: kill_once, weight: 0.0, at_call: 7, marker: "{marker}"}}
"""


def test_the_copy_and_the_scale_survive_sigkill_and_resume_bit_exactly(tmp_path: Path, tiny_model_dir: Path) -> None:
    """Killed during step 7, resumed from step 4's checkpoint: every tensor, the copy and the scale included."""
    from conftest import make_corpus
    from resumed_runs import killed_and_resumed

    corpus = make_corpus(tmp_path / "corpus.txt", lines=128)
    killed_and_resumed(tmp_path, lambda marker: ct_resume_recipe(tiny_model_dir, corpus, marker))

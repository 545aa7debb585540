"""Matryoshka around any objective: against sentence-transformers' MatryoshkaLoss, and nested specs in recipes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import DISTINCT_SENTENCES, TinyTrainer, make_tiny_encoder
from part_checks import assert_same_gradients, gradients
from st_reference import sentence_transformer_of, st_losses

from csekit.core.errors import CsekitError
from csekit.parts.heads.mlp import IdentityHead, MLPHead
from csekit.parts.objectives import InfoNCE, Matryoshka
from csekit.parts.views import VIEWS
from csekit.training.model import ContrastiveModel

SENTENCES = DISTINCT_SENTENCES[:8]
DIMS, WEIGHTS = [8, 32, 16], [0.25, 1.0, 0.5]


def test_matryoshka_infonce_equals_matryoshka_multiple_negatives_ranking_loss(tmp_path: Path) -> None:
    """csekit's matryoshka around infonce (temperature 0.05, anchors view 0, candidates view 1, two dropout views)
    computes sentence-transformers' MatryoshkaLoss around MultipleNegativesRankingLoss (scale 20 = 1 / 0.05) on
    (anchor, positive) = (sentence, sentence) pairs: without dropout (eval mode) both views are the sentence."""
    losses = st_losses()
    encoder = make_tiny_encoder(tmp_path / "tok", pooler="mean", initializer_range=0.2)
    head = IdentityHead(encoder.dim)
    objective = Matryoshka(InfoNCE(temperature=0.05), dims=DIMS, weights=WEIGHTS, dim=encoder.dim, head=head)
    model = ContrastiveModel(encoder, head, 2, [(objective, 1.0)]).eval()
    reference_model = sentence_transformer_of(encoder, tmp_path / "st").eval()
    inner = losses.MultipleNegativesRankingLoss(reference_model, scale=20.0)
    reference = losses.MatryoshkaLoss(reference_model, inner, matryoshka_dims=DIMS, matryoshka_weights=WEIGHTS)

    views = VIEWS.get("dropout", "test")(encoder.tokenizer, encoder.pooler, 32)
    ours, parts = model(views(SENTENCES), SENTENCES)
    ours.backward()
    features = reference_model.tokenize(SENTENCES)
    theirs = reference([features, reference_model.tokenize(SENTENCES)], None)
    theirs.backward()

    assert list(parts) == ["matryoshka"] and objective.dims == [32, 16, 8]
    assert ours.item() > 0.1
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-6, abs=1e-6)
    theirs_grads = gradients(reference_model[0].auto_model.named_parameters())
    assert assert_same_gradients(encoder.backbone.named_parameters(), theirs_grads, rtol=1e-4, atol=1e-6) > 10
    # not the full-width loss alone: the cut widths change it
    with torch.no_grad():
        full = ContrastiveModel(encoder, head, 2, [(InfoNCE(temperature=0.05), 1.0)]).eval()(
            views(SENTENCES), SENTENCES
        )[0]
    assert ours.item() != pytest.approx(1.75 * full.item(), rel=1e-3)


def test_matryoshka_around_a_dot_product_infonce_normalises_the_cut_vectors_as_shrink(tmp_path: Path) -> None:
    """With a dot-product inner objective (infonce `similarity: dot`, MNRL's `similarity_fct=dot_score`) the cut
    vectors are normalised first, as sentence-transformers' `shrink` does: loss and gradients equal its
    MatryoshkaLoss; `normalize: false` (the raw cut) gives another loss, so the test sees the normalisation."""
    from sentence_transformers.util import dot_score

    losses = st_losses()
    encoder = make_tiny_encoder(tmp_path / "tok", pooler="mean", initializer_range=0.2)
    head = IdentityHead(encoder.dim)
    inner = InfoNCE(temperature=0.05, similarity="dot")
    objective = Matryoshka(inner, dims=DIMS, weights=WEIGHTS, dim=encoder.dim, head=head)
    model = ContrastiveModel(encoder, head, 2, [(objective, 1.0)]).eval()
    reference_model = sentence_transformer_of(encoder, tmp_path / "st").eval()
    mnrl = losses.MultipleNegativesRankingLoss(reference_model, scale=20.0, similarity_fct=dot_score)
    reference = losses.MatryoshkaLoss(reference_model, mnrl, matryoshka_dims=DIMS, matryoshka_weights=WEIGHTS)

    views = VIEWS.get("dropout", "test")(encoder.tokenizer, encoder.pooler, 32)
    ours, _ = model(views(SENTENCES), SENTENCES)
    ours.backward()
    theirs = reference([reference_model.tokenize(SENTENCES), reference_model.tokenize(SENTENCES)], None)
    theirs.backward()

    assert objective.normalize and ours.item() > 0.1
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-6, abs=1e-6)
    theirs_grads = gradients(reference_model[0].auto_model.named_parameters())
    assert assert_same_gradients(encoder.backbone.named_parameters(), theirs_grads, rtol=1e-4, atol=1e-6) > 10
    raw = Matryoshka(inner, dims=DIMS, weights=WEIGHTS, normalize=False, dim=encoder.dim, head=head)
    with torch.no_grad():
        unnormalised = ContrastiveModel(encoder, head, 2, [(raw, 1.0)]).eval()(views(SENTENCES), SENTENCES)[0]
    assert unnormalised.item() != pytest.approx(theirs.item(), rel=1e-2)


def test_normalising_the_cut_leaves_a_cosine_objective_unchanged(tmp_path: Path) -> None:
    """infonce's cosine reads the cut vectors' directions only: normalize true and false give the same loss."""
    encoder = make_tiny_encoder(tmp_path / "tok", pooler="mean", initializer_range=0.2)
    head = IdentityHead(encoder.dim)
    views = VIEWS.get("dropout", "test")(encoder.tokenizer, encoder.pooler, 32)
    inputs = views(SENTENCES)
    with torch.no_grad():
        found = [
            ContrastiveModel(encoder, head, 2, [(Matryoshka(InfoNCE(), dims=DIMS, normalize=flag), 1.0)]).eval()(
                inputs, SENTENCES
            )[0]
            for flag in (True, False)
        ]
    assert found[0].item() == pytest.approx(found[1].item(), rel=1e-6)


def test_refuses_bad_dims_weights_and_a_head_not_kept(tmp_path: Path) -> None:
    inner = InfoNCE()
    with pytest.raises(ValueError, match="widths from 1 to the representation's 32"):
        Matryoshka(inner, dims=[64, 32], dim=32)
    with pytest.raises(ValueError, match="one weight per dim"):
        Matryoshka(inner, dims=[32, 16], weights=[1.0], dim=32)
    with pytest.raises(ValueError, match="at least one width"):
        Matryoshka(inner, dims=[], dim=32)
    with pytest.raises(ValueError, match="option similarity must be one of cosine, dot"):
        InfoNCE(similarity="euclid")
    with pytest.raises(ValueError, match="head_at_test"):
        Matryoshka(inner, dims=[32, 16], dim=32, head=MLPHead(32), head_at_test=False)
    Matryoshka(inner, dims=[32, 16], dim=32, head=MLPHead(32), head_at_test=True)


MATRYOSHKA_RECIPE = """
name: tiny-matryoshka
model: {{backbone: {backbone}, pooler: cls, max_length: 16, head: {{name: none}}}}
data: {{corpus: {corpus}, views: {{name: dropout}}}}
train: {{batch_size: 4, lr: 1.0e-4, max_steps: 2, eval_every: 0, dev_task: none, seed: 1}}
objectives:
  - name: matryoshka
    dims: [32, 16]
    objective: {inner}
"""


def write_recipe(tmp_path: Path, inner: str) -> Path:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(DISTINCT_SENTENCES) + "\n", encoding="utf-8")
    path = tmp_path / "recipe.yaml"
    text = MATRYOSHKA_RECIPE.format(backbone=tmp_path / "model", corpus=corpus, inner=inner)
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("inner", "message"),
    [
        ("{name: infonse}", "objectives\\[0\\].objective.name"),
        ("{name: infonce, temprature: 0.05}", 'objectives\\[0\\].objective.temprature: "infonce" has no option'),
        ("{name: infonce, temperature: abc}", "objectives\\[0\\].objective.temperature: expected a finite number"),
        ("{name: infonce, positive_view: 5}", "objectives\\[0\\].objective.positive_view: view 5 does not exist"),
        ("{name: infonce, weight: 2}", "objectives\\[0\\].objective.weight: a nested part has no weight"),
        ("infonce", "objectives\\[0\\].objective must be a part's spec"),
    ],
)
def test_a_bad_inner_objective_is_one_line_at_load(tmp_path: Path, inner: str, message: str) -> None:
    from csekit.training.recipe import load_recipe

    with pytest.raises(CsekitError, match=message) as error:
        load_recipe(write_recipe(tmp_path, inner))
    assert "\n" not in str(error.value)


def test_a_recipe_builds_and_trains_the_inner_objective(tmp_path: Path) -> None:
    from csekit.training.model import build_model
    from csekit.training.recipe import load_recipe

    encoder = make_tiny_encoder(tmp_path / "tok", pooler="cls")
    encoder.save(tmp_path / "model")
    recipe = load_recipe(write_recipe(tmp_path, "{name: infonce, temperature: 0.1}"))
    model, views = build_model(recipe, encoder)
    (objective,) = model.objectives
    assert isinstance(objective, Matryoshka) and isinstance(objective.objective, InfoNCE)
    assert objective.objective.temperature == 0.1 and objective.dims == [32, 16]
    loss, parts = model(views(SENTENCES[:4]), SENTENCES[:4])
    assert list(parts) == ["matryoshka"] and torch.isfinite(loss)


def test_matryoshka_composes_with_dclr_noise_and_weighting(train_tiny: TinyTrainer) -> None:
    """DCLR's noise negatives and weights enter the inner infonce at every width (the noise cut like the rest)."""
    run = train_tiny(
        "model.head={name: none}",
        "negatives=[{name: dclr_noise}]",
        "weighting={name: dclr}",
        "objectives=[{name: matryoshka, dims: [32, 8], objective: {name: infonce}}]",
        steps=2,
    )
    assert run.result.steps == 2


def test_the_inner_objective_reads_token_states_through_the_wrapper() -> None:
    class ReadsTokens(InfoNCE):
        reads_token_states = True

    assert Matryoshka(ReadsTokens(), dims=[8], dim=32).reads_token_states
    assert not Matryoshka(InfoNCE(), dims=[8], dim=32).reads_token_states

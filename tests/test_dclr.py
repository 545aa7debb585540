"""DCLR: noise negatives, complementary weighting, the paper's and the authors' losses, and training."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from test_training import make_corpus, tiny_recipe

from csekit.config import build_part, load_recipe
from csekit.dclr import ComplementaryWeighting, NoiseNegatives, improve_noise, non_uniformity_loss
from csekit.encoder import SentenceEncoder
from csekit.errors import CsekitError
from csekit.heads import MLPHead
from csekit.model import NEGATIVES, ContrastiveModel
from csekit.objectives import InfoNCE, cosine_matrix
from csekit.objectives.dclr_code import DclrCodeLoss
from csekit.state import StepState
from csekit.training import train
from csekit.views import DropoutViews

# Sentences 0/2 and 1/4 are duplicates: the only negatives a model that sees itself should weight out.
SENTENCES = [
    "a man plays guitar",
    "the dog runs in the park",
    "a man plays guitar",
    "she eats food",
    "the dog runs in the park",
    "it is big and red",
]
DUPLICATES = {(0, 2), (2, 0), (1, 4), (4, 1)}
PHI = 0.99
TAU = 1.0  # the authors' test: a temperature at which logit 0 and removal differ visibly


def build(model_dir: Path, weighting: torch.nn.Module | None, noise: NoiseNegatives | None = None) -> ContrastiveModel:
    encoder = SentenceEncoder.load(model_dir, pooler="mean")
    negatives = [noise] if noise is not None else []
    return ContrastiveModel(encoder, MLPHead(encoder.dim), 2, [(InfoNCE(), 1.0)], negatives, weighting)


def step_state(model: ContrastiveModel, sentences: list[str] = SENTENCES) -> StepState:
    views = DropoutViews(model.encoder.tokenizer, model.encoder.pooler, 16)
    return model.make_state(views(sentences), sentences, {})


def test_the_model_as_its_own_complementary_model_weights_out_exactly_the_duplicates(tiny_model_dir: Path) -> None:
    weighting = ComplementaryWeighting(model=str(tiny_model_dir), model_pooler="mean", phi=PHI, max_length=16)
    model = build(tiny_model_dir, weighting)
    state = step_state(model)
    similarity = weighting.similarities(state)
    distinct = torch.tensor([[SENTENCES[i] != SENTENCES[j] for j in range(6)] for i in range(6)])
    assert similarity[distinct].max() < PHI, "the tiny model must tell the distinct sentences apart"
    weighting(state)
    expected = torch.ones(6, 6)
    for i, j in DUPLICATES:
        expected[i, j] = 0.0
    assert torch.equal(state.negative_weights, expected)


def paper_loss_by_hand(state: StepState, temperature: float) -> torch.Tensor:
    """Eq. 6 directly: each anchor's softmax over its kept in-batch candidates and the noise, columns removed."""
    anchors, positives = state.embeddings
    losses = []
    for i in range(len(anchors)):
        kept = [j for j in range(len(positives)) if (i, j) not in DUPLICATES]
        candidates = torch.cat([positives[kept], *state.extra_negatives])
        logits = F.cosine_similarity(anchors[i : i + 1].float(), candidates.float()) / temperature
        losses.append(-F.log_softmax(logits, dim=0)[kept.index(i)])
    return torch.stack(losses).mean()


def test_paper_loss_equals_the_loss_with_false_negative_columns_removed(tiny_model_dir: Path) -> None:
    weighting = ComplementaryWeighting(model=str(tiny_model_dir), model_pooler="mean", phi=PHI, max_length=16)
    model = build(tiny_model_dir, weighting, NoiseNegatives(ratio=1.5))
    state = step_state(model)
    model.negatives[0](state)
    weighting(state)
    assert state.extra_negatives[0].shape == (9, 32)  # k = 1.5 x 6
    loss = InfoNCE(temperature=0.05)(state)["infonce"]
    torch.testing.assert_close(loss, paper_loss_by_hand(state, 0.05))
    # Without the weights the loss is a different number, so the comparison above can fail.
    state.negative_weights = None
    assert not torch.isclose(InfoNCE(temperature=0.05)(state)["infonce"], paper_loss_by_hand(state, 0.05))


def test_authors_code_option_zeroes_the_false_negative_logits(tiny_model_dir: Path) -> None:
    weighting = ComplementaryWeighting(model=str(tiny_model_dir), model_pooler="mean", phi=PHI, max_length=16)
    model = build(tiny_model_dir, weighting, NoiseNegatives(ratio=1.0))
    state = step_state(model)
    model.negatives[0](state)
    weighting(state)
    anchors, positives = state.embeddings
    logits = cosine_matrix(anchors, positives) / TAU
    for i, j in DUPLICATES:
        logits[i, j] = 0.0  # the code keeps false negatives in the softmax with logit 0
    logits = torch.cat([logits, cosine_matrix(anchors, state.extra_negatives[0]) / TAU], dim=1)
    labels = torch.arange(6)
    infonce = DclrCodeLoss(temperature=TAU, loss="infonce")(state)["dclr_code"]
    torch.testing.assert_close(infonce, F.cross_entropy(logits, labels))
    bce = DclrCodeLoss(temperature=TAU, loss="bce")(state)["dclr_code"]
    probabilities = logits.softmax(dim=1)
    targets = F.one_hot(labels, logits.shape[1]).float()
    by_hand = -(targets * probabilities.log() + (1 - targets) * (1 - probabilities).log()).mean()
    torch.testing.assert_close(bce, by_hand)
    # The paper's removal gives another value: the two options really differ.
    assert not torch.isclose(InfoNCE(temperature=TAU)(state)["infonce"], infonce)


def test_gradient_ascent_steps_increase_the_non_uniformity_loss() -> None:
    torch.manual_seed(0)
    anchors, positives = torch.randn(8, 16), torch.randn(8, 16)
    noise = torch.randn(8, 16)
    losses = [non_uniformity_loss(anchors, positives, noise, 0.05)]
    for _ in range(4):
        noise = improve_noise(noise, anchors, positives, steps=1, step_size=0.5, temperature=0.05)
        losses.append(non_uniformity_loss(anchors, positives, noise, 0.05))
    assert all(after > before for before, after in itertools.pairwise(losses))
    # Each step moves every noise vector by exactly beta (normalised gradient).
    moved = improve_noise(noise, anchors, positives, steps=1, step_size=0.5, temperature=0.05)
    torch.testing.assert_close((moved - noise).norm(dim=1), torch.full((8,), 0.5))
    # The paper's beta = 1e-3 also increases it; zero steps leave the noise as drawn.
    small = improve_noise(noise, anchors, positives, steps=4, step_size=1e-3, temperature=0.05)
    assert non_uniformity_loss(anchors, positives, small, 0.05) > non_uniformity_loss(anchors, positives, noise, 0.05)
    assert torch.equal(improve_noise(noise, anchors, positives, 0, 1e-3, 0.05), noise)


def test_model_gradient_equals_the_gradient_with_the_final_noise_as_constants(tiny_model_dir: Path) -> None:
    model = build(tiny_model_dir, None, NoiseNegatives(ratio=2.0, steps=4, step_size=0.5))
    model.train()
    inputs = DropoutViews(model.encoder.tokenizer, model.encoder.pooler, 16)(SENTENCES)

    torch.manual_seed(1)
    loss, _ = model(inputs, SENTENCES)
    loss.backward()
    with_ascent = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()

    torch.manual_seed(1)  # the same dropout masks and the same initial noise
    state = model.make_state(inputs, SENTENCES, {})
    model.negatives[0](state)
    constants = state.extra_negatives[0].detach().clone()
    assert not state.extra_negatives[0].requires_grad
    torch.manual_seed(1)
    state = model.make_state(inputs, SENTENCES, {})
    state.extra_negatives.append(constants)
    InfoNCE()(state)["infonce"].backward()
    for name, p in model.named_parameters():
        if name in with_ascent:
            torch.testing.assert_close(p.grad, with_ascent[name], msg=name)
    assert with_ascent, "the model received gradients"


def test_noise_ratio_may_be_fractional_and_bad_options_name_the_recipe_key() -> None:
    assert NoiseNegatives(ratio=2.5).ratio == 2.5
    with pytest.raises(CsekitError, match=r"negatives\[0\].*ratio"):
        build_part(NEGATIVES, {"name": "dclr_noise", "ratio": 0}, "negatives[0]")
    with pytest.raises(CsekitError, match=r"weighting\.model"):
        ComplementaryWeighting(model="./no/such/model")


def test_self_weighting_uses_the_steps_own_detached_representations(tiny_model_dir: Path) -> None:
    weighting = ComplementaryWeighting(model="self", phi=PHI)
    model = build(tiny_model_dir, weighting)
    model.eval()  # no dropout: duplicate sentences get identical representations
    state = step_state(model)
    weighting(state)
    expected = torch.ones(6, 6)
    for i, j in DUPLICATES:
        expected[i, j] = 0.0
    distinct = torch.tensor([[SENTENCES[i] != SENTENCES[j] for j in range(6)] for i in range(6)])
    assert weighting.similarities(state)[distinct].max() < PHI
    assert torch.equal(state.negative_weights, expected)
    assert not state.negative_weights.requires_grad


def test_complementary_model_is_in_no_state_dict_and_not_trained(tiny_model_dir: Path) -> None:
    weighting = ComplementaryWeighting(model=str(tiny_model_dir), model_pooler="mean", phi=PHI)
    with_weighting = build(tiny_model_dir, weighting)
    without = build(tiny_model_dir, None)
    assert set(with_weighting.state_dict()) == set(without.state_dict())
    complementary = {id(p) for p in weighting.complementary.parameters()}
    assert not complementary & {id(p) for p in with_weighting.parameters()}
    assert not any(p.requires_grad for p in weighting.complementary.parameters())
    assert not weighting.complementary.training
    with_weighting.train()
    assert not weighting.complementary.training  # the model's train() does not reach it


def test_a_dclr_recipe_trains_and_saves_no_complementary_model(tmp_path: Path, tiny_model_dir: Path) -> None:
    corpus = make_corpus(tmp_path / "corpus.txt", lines=64)
    recipe = tiny_recipe(
        tiny_model_dir,
        corpus,
        "train.max_steps=3",
        "train.eval_every=0",
        "model.pooler=mean",
        "negatives=[{name: dclr_noise, ratio: 1.0}]",
        f"weighting={{name: dclr, model: {tiny_model_dir}, model_pooler: mean, phi: 0.95}}",
    )
    result = train(recipe, tmp_path / "run", show_progress=False)
    assert result.steps == 3
    plain = build(tiny_model_dir, None)
    saved = load_file(str(tmp_path / "run" / "checkpoint" / "model.safetensors"))
    assert set(saved) == set(plain.state_dict())
    files = {p.relative_to(tmp_path / "run" / "best").as_posix() for p in (tmp_path / "run" / "best").rglob("*")}
    reference = tmp_path / "reference"
    plain.encoder.save(reference)
    assert files == {p.relative_to(reference).as_posix() for p in reference.rglob("*")}


def test_authors_code_recipe_objective_loads() -> None:
    recipe = load_recipe(Path(__file__).resolve().parents[1] / "recipes" / "dclr-bert-base-authors-code.yaml")
    assert recipe.objectives[0]["name"] == "dclr_code"
    assert recipe.weighting is not None and recipe.weighting["phi"] == 0.9

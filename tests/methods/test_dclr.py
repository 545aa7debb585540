"""DCLR: noise negatives, complementary weighting, the paper's and the authors' losses, and training."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import TinyTrainer
from part_checks import assert_same_gradients, step_gradients
from safetensors.torch import load_file

from csekit.core.errors import CsekitError
from csekit.encoding.encoder import SentenceEncoder
from csekit.parts.heads import HEADS
from csekit.parts.heads.mlp import MLPHead
from csekit.parts.negatives import NEGATIVES
from csekit.parts.negatives.noise import NoiseNegatives, improve_noise, non_uniformity_loss
from csekit.parts.objectives import InfoNCE, cosine_matrix
from csekit.parts.objectives.weighted_logits import WeightedLogitsLoss, bce_of_softmax
from csekit.parts.step_state import StepState
from csekit.parts.views.dropout import DropoutViews
from csekit.parts.weighting.complementary import ComplementaryWeighting
from csekit.training.model import ContrastiveModel
from csekit.training.part_building import build_part
from csekit.training.recipe import load_recipe

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


def weighted_state(model_dir: Path, noise_ratio: float) -> StepState:
    """A step's state after DCLR's noise negatives (`noise_ratio` x the batch) and the weights of the model as its
    own complementary model (mean pooling, phi 0.99): duplicates weighted out, the noise appended."""
    weighting = ComplementaryWeighting(model=str(model_dir), model_pooler="mean", phi=PHI, max_length=16)
    model = build(model_dir, weighting, NoiseNegatives(ratio=noise_ratio))
    state = step_state(model)
    model.negatives[0](state)
    weighting(state)
    return state


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
    """Eq. 6 with the positive in the softmax (the authors' code, SimCSE's cross-entropy): each anchor's
    softmax over its kept in-batch candidates (its positive included) and the noise, columns removed."""
    anchors, positives = state.embeddings
    losses = []
    for i in range(len(anchors)):
        kept = [j for j in range(len(positives)) if (i, j) not in DUPLICATES]
        candidates = torch.cat([positives[kept], *state.extra_negatives])
        logits = F.cosine_similarity(anchors[i : i + 1].float(), candidates.float()) / temperature
        losses.append(-F.log_softmax(logits, dim=0)[kept.index(i)])
    return torch.stack(losses).mean()


def test_complementary_similarities_are_float32_inside_a_bf16_step(tiny_model_dir: Path) -> None:
    """The phi decision is made on float32 cosines of the complementary model, whatever autocast the step runs."""
    weighting = ComplementaryWeighting(model=str(tiny_model_dir), model_pooler="mean", phi=PHI, max_length=16)
    state = step_state(build(tiny_model_dir, weighting))
    complementary = SentenceEncoder.load(tiny_model_dir, pooler="mean").eval()
    inputs = complementary.tokenize(SENTENCES, max_length=16)
    with torch.no_grad():
        vectors = complementary(inputs, token_states=False).pooled.double()  # the reference, in float64
    expected = F.normalize(vectors, dim=-1) @ F.normalize(vectors, dim=-1).T
    with torch.autocast("cpu", dtype=torch.bfloat16):
        in_bf16_step = weighting.similarities(state)
    assert in_bf16_step.dtype == torch.float32
    torch.testing.assert_close(in_bf16_step.double(), expected, rtol=0, atol=1e-6)


def test_paper_loss_equals_the_loss_with_false_negative_columns_removed(tiny_model_dir: Path) -> None:
    state = weighted_state(tiny_model_dir, noise_ratio=1.5)
    assert state.extra_negatives[0].shape == (9, 32)  # k = 1.5 x 6
    loss = InfoNCE(temperature=0.05)(state)["infonce"]
    torch.testing.assert_close(loss, paper_loss_by_hand(state, 0.05))
    # Without the weights the loss is a different number, so the comparison above can fail.
    state.negative_weights = None
    assert not torch.isclose(InfoNCE(temperature=0.05)(state)["infonce"], paper_loss_by_hand(state, 0.05))


def printed_eq6_by_hand(state: StepState, temperature: float) -> torch.Tensor:
    """Eq. 6 as printed: -log(e^{s+/tau} / sum over the kept in-batch negatives and the noise of e^{s/tau})."""
    anchors, positives = state.embeddings
    noise = torch.cat(state.extra_negatives).double()
    losses = []
    for i in range(len(anchors)):
        anchor = anchors[i].double()
        negatives = [positives[j].double() for j in range(len(positives)) if j != i and (i, j) not in DUPLICATES]
        denominator = sum(torch.exp(F.cosine_similarity(anchor, h, dim=0) / temperature) for h in negatives)
        denominator = denominator + torch.exp(F.cosine_similarity(anchor.unsqueeze(0), noise) / temperature).sum()
        numerator = torch.exp(F.cosine_similarity(anchor, positives[i].double(), dim=0) / temperature)
        losses.append(-torch.log(numerator / denominator))
    return torch.stack(losses).mean()


def test_the_printed_eq6_leaves_the_positive_out_of_the_denominator(tiny_model_dir: Path) -> None:
    state = weighted_state(tiny_model_dir, noise_ratio=1.5)
    printed = InfoNCE(temperature=0.05, positive_in_denominator=False)(state)["infonce"]
    torch.testing.assert_close(printed.double(), printed_eq6_by_hand(state, 0.05), rtol=1e-5, atol=1e-5)
    default = InfoNCE(temperature=0.05)(state)["infonce"]
    assert float(default) > float(printed)  # the positive's own term enlarges the denominator


def test_the_printed_eq6_is_finite_for_an_anchor_without_negatives() -> None:
    anchors = torch.randn(3, 8, requires_grad=True)
    state = StepState([""] * 3, [anchors, anchors * 2], [anchors, anchors * 2], None, None)  # type: ignore[arg-type]
    state.negative_weights = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0]])
    loss = InfoNCE(positive_in_denominator=False)(state)["infonce"]
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(anchors.grad).all()


def test_authors_code_option_zeroes_the_false_negative_logits(tiny_model_dir: Path) -> None:
    state = weighted_state(tiny_model_dir, noise_ratio=1.0)
    anchors, positives = state.embeddings
    logits = cosine_matrix(anchors, positives) / TAU
    for i, j in DUPLICATES:
        logits[i, j] = 0.0  # the code keeps false negatives in the softmax with logit 0
    logits = torch.cat([logits, cosine_matrix(anchors, state.extra_negatives[0]) / TAU], dim=1)
    labels = torch.arange(6)
    infonce = WeightedLogitsLoss(temperature=TAU, loss="infonce")(state)["dclr_code"]
    torch.testing.assert_close(infonce, F.cross_entropy(logits, labels))
    bce = WeightedLogitsLoss(temperature=TAU, loss="bce")(state)["dclr_code"]
    probabilities = logits.softmax(dim=1)
    targets = F.one_hot(labels, logits.shape[1]).float()
    by_hand = -(targets * probabilities.log() + (1 - targets) * (1 - probabilities).log()).mean()
    torch.testing.assert_close(bce, by_hand)
    # The paper's removal gives another value: the two options really differ.
    assert not torch.isclose(InfoNCE(temperature=TAU)(state)["infonce"], infonce)


def probabilities_bce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The authors' formula as csekit first wrote it: BCELoss on softmax probabilities (CUDA autocast bans it)."""
    probabilities = logits.softmax(dim=1)
    return F.binary_cross_entropy(probabilities, F.one_hot(labels, logits.shape[1]).to(probabilities.dtype))


def code_logits(seed: int, n: int = 16, extra: int = 16, temperature: float = 0.05) -> torch.Tensor:
    """Logits shaped like the code's: cosines / tau against n candidates and `extra` noise, some zeroed."""
    generator = torch.Generator().manual_seed(seed)
    cosines = torch.rand(n, n + extra, generator=generator) * 1.6 - 0.6
    cosines[torch.arange(n), torch.arange(n)] = 0.95  # positives
    logits = cosines / temperature
    logits[0, 3] = logits[5, 1] = 0.0  # false negatives weighted out (logit x 0)
    return logits


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_code_bce_from_logits_equals_bce_on_probabilities_in_fp32(seed: int) -> None:
    labels = torch.arange(16)
    logits = code_logits(seed).requires_grad_(True)
    reference = probabilities_bce(logits, labels)
    (reference_grad,) = torch.autograd.grad(reference, logits)
    value = bce_of_softmax(logits, labels)
    (grad,) = torch.autograd.grad(value, logits)
    torch.testing.assert_close(value, reference, rtol=1e-5, atol=0)
    torch.testing.assert_close(grad, reference_grad, rtol=1e-4, atol=1e-9)


def test_code_bce_is_finite_where_a_probability_rounds_to_one_or_zero() -> None:
    logits = torch.tensor([[200.0, 0.0, -200.0], [0.0, 0.0, 0.0]], requires_grad=True)
    labels = torch.tensor([1, 1])  # row 0: the target's p rounds to 0 and a negative's to 1 (both floors)
    value = bce_of_softmax(logits, labels)
    torch.testing.assert_close(value, probabilities_bce(logits.detach(), labels))
    (grad,) = torch.autograd.grad(value, logits)
    assert torch.isfinite(grad).all()


def test_code_bce_runs_under_autocast_without_the_banned_probability_bce(monkeypatch: pytest.MonkeyPatch) -> None:
    """CUDA autocast raises on binary_cross_entropy; CPU autocast does not, so the ban is reproduced here."""

    def banned(*args: object, **kwargs: object) -> torch.Tensor:
        raise RuntimeError("torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast")

    generator = torch.Generator().manual_seed(0)
    views = [torch.randn(16, 32, generator=generator), torch.randn(16, 32, generator=generator)]
    state = StepState([""] * 16, views, views, None, None)  # type: ignore[arg-type]
    state.extra_negatives.append(torch.randn(16, 32, generator=generator))
    state.negative_weights = torch.ones(16, 16)
    state.negative_weights[0, 3] = state.negative_weights[5, 1] = 0.0
    loss = WeightedLogitsLoss(temperature=0.05, loss="bce")
    expected = loss(state)["dclr_code"]
    monkeypatch.setattr(F, "binary_cross_entropy", banned)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under_autocast = loss(state)["dclr_code"]
    assert under_autocast.dtype == torch.float32
    # The logits are rounded to bf16 by autocast's matmul; the loss itself is float32 math on them.
    torch.testing.assert_close(under_autocast, expected, rtol=2e-2, atol=0)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_code_bce_runs_under_cuda_autocast() -> None:
    labels = torch.arange(16, device="cuda")
    logits = code_logits(0).cuda().requires_grad_(True)
    with torch.autocast("cuda", dtype=torch.float16):
        value = bce_of_softmax(logits.half(), labels)
    value.backward()
    torch.testing.assert_close(value.cpu(), probabilities_bce(logits.detach().half().float().cpu(), labels.cpu()))


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
    with_ascent, inputs = step_gradients(model, SENTENCES)

    torch.manual_seed(1)  # the same dropout masks and the same initial noise
    state = model.make_state(inputs, SENTENCES, {})
    model.negatives[0](state)
    constants = state.extra_negatives[0].detach().clone()
    assert not state.extra_negatives[0].requires_grad
    torch.manual_seed(1)
    state = model.make_state(inputs, SENTENCES, {})
    state.extra_negatives.append(constants)
    InfoNCE()(state)["infonce"].backward()
    assert_same_gradients(model.named_parameters(), with_ascent)


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


def test_a_dclr_recipe_trains_and_saves_no_complementary_model(
    tmp_path: Path, tiny_model_dir: Path, train_tiny: TinyTrainer
) -> None:
    run = train_tiny(
        "model.pooler=mean",
        "negatives=[{name: dclr_noise, ratio: 1.0}]",
        f"weighting={{name: dclr, model: {tiny_model_dir}, model_pooler: mean, phi: 0.95}}",
    )
    assert run.result.steps == 3
    plain = build(tiny_model_dir, None)
    saved = load_file(str(run.folder / "checkpoint" / "model.safetensors"))
    assert set(saved) == set(plain.state_dict())
    files = {p.relative_to(run.folder / "best").as_posix() for p in (run.folder / "best").rglob("*")}
    reference = tmp_path / "reference"
    plain.encoder.save(reference)
    assert files == {p.relative_to(reference).as_posix() for p in reference.rglob("*")}


def test_authors_code_recipe_objective_loads() -> None:
    recipe = load_recipe(Path(__file__).resolve().parents[2] / "recipes" / "dclr-bert-base-authors-code.yaml")
    assert recipe.objectives[0]["name"] == "dclr_code"
    assert recipe.weighting is not None and recipe.weighting["phi"] == 0.9


# --------------------------------------------------------------------------- representations as the authors' code
DCLR_CODE_RECIPES = [
    "dclr-bert-base.yaml",
    "dclr-roberta-base.yaml",
    "dclr-bert-base-authors-code.yaml",
    "dclr-ablation-no-noise.yaml",
    "dclr-ablation-random-noise.yaml",
    "dclr-ablation-self-weighting.yaml",
    "dclr-ablation-no-weighting.yaml",
]
RECIPES = Path(__file__).resolve().parents[2] / "recipes"


def test_complementary_model_can_read_its_pooler_layer(tiny_model_dir: Path) -> None:
    """`model_pooler: pooler_output`: cosines of the complementary backbone's own pooler_output (DCLR's code)."""
    weighting = ComplementaryWeighting(model=str(tiny_model_dir), model_pooler="pooler_output", phi=PHI, max_length=16)
    model = build(tiny_model_dir, weighting)
    state = step_state(model)
    complementary = weighting.complementary
    assert not any(p.requires_grad for p in complementary.parameters())  # frozen, its pooler layer too
    inputs = complementary.tokenize(SENTENCES, max_length=16)
    with torch.no_grad():
        pooled = complementary(inputs, token_states=False).pooled  # what `similarities` encodes with
        outputs = complementary.backbone(**inputs, return_dict=True)
    torch.testing.assert_close(pooled, outputs.pooler_output)
    assert not torch.allclose(pooled, outputs.last_hidden_state[:, 0], atol=1e-3)  # not the raw [CLS]
    torch.testing.assert_close(weighting.similarities(state), cosine_matrix(pooled, pooled))


@pytest.mark.parametrize("name", DCLR_CODE_RECIPES)
def test_dclr_recipes_use_the_authors_evaluation_interval_and_complementary_pooler(name: str) -> None:
    recipe = load_recipe(RECIPES / name)
    assert recipe.train.eval_every == 125  # run.sh: --eval_steps 125 (the paper's text says 150)
    if recipe.weighting is not None and recipe.weighting["model"] != "self":
        assert recipe.weighting["model_pooler"] == "pooler_output"  # models.py: encoder.pooler(sequence_output)


@pytest.mark.parametrize("name", ["dclr+whitened-bert-base.yaml", "combined-bert-base.yaml"])
def test_compositions_read_the_simcse_complementary_model_as_dclr_does(name: str) -> None:
    recipe = load_recipe(RECIPES / name)
    assert recipe.weighting is not None
    assert recipe.weighting["model"] == "princeton-nlp/unsup-simcse-bert-base-uncased"
    assert recipe.weighting["model_pooler"] == "pooler_output"


def test_mlp_head_through_the_backbone_pooler_is_the_authors_training_representation(tiny_model_dir: Path) -> None:
    """DCLR's code trains on mlp(bert.pooler(last_hidden)): tanh(L(tanh(P [CLS]))), P pre-trained and trained."""
    encoder = SentenceEncoder.load(tiny_model_dir, pooler="cls")
    spec = {"name": "mlp", "through_backbone_pooler": True}
    head = build_part(HEADS, spec, "model.head", dim=encoder.dim, encoder=encoder, head_at_test=False)
    assert all(p.requires_grad for p in encoder.backbone.pooler.parameters())
    cls = torch.randn(5, encoder.dim)
    pooler = encoder.backbone.pooler
    expected = torch.tanh(head.linear(torch.tanh(pooler.dense(cls))))
    torch.testing.assert_close(head(cls), expected)
    assert set(dict(head.named_parameters())) == {"linear.weight", "linear.bias"}  # the backbone owns P
    plain = build_part(HEADS, {"name": "mlp"}, "model.head", dim=encoder.dim, encoder=encoder, head_at_test=False)
    plain.load_state_dict(head.state_dict())
    assert not torch.allclose(plain(cls), head(cls))


def test_mlp_head_through_the_backbone_pooler_refuses_what_it_cannot_reproduce(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    from conftest import make_tiny_encoder

    spec = {"name": "mlp", "through_backbone_pooler": True}
    encoder = SentenceEncoder.load(tiny_model_dir, pooler="cls")
    with pytest.raises(CsekitError, match=r"model\.head: .*training-only.*head_at_test: false"):
        build_part(HEADS, spec, "model.head", dim=encoder.dim, encoder=encoder, head_at_test=True)
    mean = SentenceEncoder.load(tiny_model_dir, pooler="mean")
    with pytest.raises(CsekitError, match=r"model\.head: .*needs model\.pooler cls"):
        build_part(HEADS, spec, "model.head", dim=mean.dim, encoder=mean)
    electra = make_tiny_encoder(tmp_path / "tok", model_type="electra")
    with pytest.raises(CsekitError, match=r"model\.head\.through_backbone_pooler needs a backbone with a pooler layer"):
        build_part(HEADS, spec, "model.head", dim=electra.dim, encoder=electra)


def test_a_recipe_with_the_authors_representations_trains_the_backbone_pooler(
    tiny_model_dir: Path, train_tiny: TinyTrainer
) -> None:
    run = train_tiny(
        "model.head={name: mlp, through_backbone_pooler: true}",
        "negatives=[{name: dclr_noise, ratio: 1.0}]",
        f"weighting={{name: dclr, model: {tiny_model_dir}, model_pooler: pooler_output, phi: 0.9, dropout: true}}",
        "objectives=[{name: dclr_code, temperature: 0.05, loss: bce}]",
        steps=2,
    )
    assert run.result.steps == 2
    before = load_file(str(tiny_model_dir / "model.safetensors"))
    after = load_file(str(run.folder / "best" / "model.safetensors"))
    assert not torch.equal(before["pooler.dense.weight"], after["pooler.dense.weight"])  # trained, as in the code
    assert SentenceEncoder.load(run.folder / "best").pooler.name == "cls"  # evaluated on [CLS] before it

"""RankCSE: ListNet and ListMLE distillation against the paper's definitions and the public code's computation."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import TinyTrainer, make_tiny_encoder

from csekit.core.errors import CsekitError
from csekit.encoding.encoder import SentenceEncoder
from csekit.parts.heads.mlp import MLPHead
from csekit.parts.objectives import OBJECTIVES, InfoNCE
from csekit.parts.objectives.ranking import RankingConsistency, RankingDistillation, jensen_shannon, listmle, listnet
from csekit.parts.views.dropout import DropoutViews
from csekit.training.model import ContrastiveModel
from csekit.training.part_building import build_part

SENTENCES = ["a man plays guitar", "the dog runs in the park", "she eats food", "it is big and red"]


def listnet_as_the_public_code(teacher: torch.Tensor, student: torch.Tensor) -> torch.Tensor:
    """rankcse/models.py ListNet: diagonals to -inf, -(q * log p).nansum() / q.nansum()."""
    p = F.log_softmax(student.clone().fill_diagonal_(float("-inf")), dim=-1)
    q = F.softmax(teacher.clone().fill_diagonal_(float("-inf")), dim=-1)
    return -(q * p).nansum() / q.nansum()


def listmle_by_plackett_luce(teacher: torch.Tensor, student: torch.Tensor) -> torch.Tensor:
    """-log prod_j e^{s_pi(j)} / sum_{k >= j} e^{s_pi(k)}, pi the teacher's descending order, per row, averaged."""
    losses = []
    for t, s in zip(teacher.tolist(), student.tolist(), strict=True):
        order = sorted(range(len(t)), key=lambda j: -t[j])
        log_likelihood = 0.0
        for j, item in enumerate(order):
            log_likelihood += s[item] - math.log(sum(math.exp(s[k]) for k in order[j:]))
        losses.append(-log_likelihood)
    return torch.tensor(sum(losses) / len(losses))


def test_listnet_equals_the_public_codes_computation() -> None:
    torch.manual_seed(0)
    student, teacher = torch.randn(5, 5) * 3, torch.randn(5, 5) * 3
    torch.testing.assert_close(listnet(student, teacher, torch.arange(5)), listnet_as_the_public_code(teacher, student))
    # The same teacher list as the student's is the minimum over students: the entropy of softmax(t).
    q = F.softmax(teacher.fill_diagonal_(float("-inf")), dim=-1)
    entropy = -(q * torch.log(q)).nansum() / 5
    torch.testing.assert_close(listnet(teacher.clone(), teacher, torch.arange(5)), entropy)


def test_the_listnet_recipe_scores_the_teachers_list_at_half_the_students_temperature() -> None:
    """tau_3 = tau_2 / 2: the public code's first ListNet (`Similarity(tau / 2)` for the teacher, commit 39fabf5) and
    its README's reading of the paper; a refactor the next day left tau / 2 unused (see the recipe's comment)."""
    from csekit.training.recipe import load_recipe

    recipe = load_recipe(Path(__file__).resolve().parents[2] / "recipes" / "rankcse-listnet-bert-base.yaml")
    (spec,) = [spec for spec in recipe.objectives if spec["name"] == "rank_distill"]
    assert spec["loss"] == "listnet" and spec["teacher_temperature"] == spec["temperature"] / 2 == 0.025


def test_listmle_is_the_plackett_luce_likelihood_of_the_teachers_order() -> None:
    torch.manual_seed(0)
    student, teacher = torch.randn(4, 6), torch.randn(4, 6)
    torch.testing.assert_close(listmle(student, teacher), listmle_by_plackett_luce(teacher, student))
    # A student that orders like the teacher, by a wide margin, has a likelihood near 1.
    ranks = torch.stack([torch.randperm(6).float() for _ in range(4)])  # distinct values a unit apart
    assert listmle(ranks * 20, ranks).item() < 1e-6


def test_listmle_breaks_ties_at_random_not_by_position() -> None:
    teacher = torch.zeros(1, 3)  # every order ties; the likelihood of a random order is averaged
    student = torch.tensor([[2.0, 0.0, -2.0]])
    values = {round(listmle(student, teacher).item(), 5) for _ in range(60)}
    expected = {round(listmle_by_plackett_luce(torch.tensor([list(p)]), student).item(), 5) for p in perms()}
    assert len(values) > 1 and values <= expected


def perms() -> list[tuple[float, ...]]:
    """Teacher rows whose descending order is each permutation of three items."""
    return [
        tuple(float(-rank) for rank in (order.index(0), order.index(1), order.index(2)))
        for order in itertools.permutations(range(3))
    ]


def rank_model(tmp_path: Path, loss: str, teachers: list[str]) -> ContrastiveModel:
    encoder = make_tiny_encoder(tmp_path / "tok", pooler="cls")
    distill = RankingDistillation(teachers, ["mean"] * len(teachers), [0.33, 0.67][: len(teachers)], loss=loss)
    model = ContrastiveModel(encoder, MLPHead(encoder.dim), 2, [(InfoNCE(), 1.0), (distill, 1.0)])
    model.eval()
    return model


@pytest.mark.parametrize("loss", ["listnet", "listmle"])
def test_objective_distills_the_weighted_teachers_similarity_lists(tmp_path: Path, loss: str) -> None:
    teacher_dirs = []
    for index, seed in enumerate((1, 2)):
        make_tiny_encoder(tmp_path / f"t{index}-tok", seed=seed).save(tmp_path / f"teacher{index}")
        teacher_dirs.append(str(tmp_path / f"teacher{index}"))
    model = rank_model(tmp_path, loss, teacher_dirs)
    state = model.make_state(DropoutViews(model.encoder.tokenizer, model.encoder.pooler, 16)(SENTENCES), SENTENCES, {})
    torch.manual_seed(3)
    value = model.objectives[1](state)[loss]
    # The public trainer: each teacher's cos(z1T_i, z2T_j) / tau2, weighted alpha and 1 - alpha; the student's
    # list is InfoNCE's cos(z1_i, z2_j) / tau.
    cosines = []
    for path in teacher_dirs:
        teacher = SentenceEncoder.load(path, pooler="mean").eval()
        with torch.no_grad():
            vectors = teacher(teacher.tokenize(SENTENCES)).pooled
        cosines.append(F.cosine_similarity(vectors[:, None], vectors[None], dim=-1) / 0.05)
    teacher_list = 0.33 * cosines[0] + 0.67 * cosines[1]
    z1, z2 = state.embeddings
    student_list = F.cosine_similarity(z1[:, None], z2[None], dim=-1) / 0.05
    if loss == "listnet":
        expected = listnet_as_the_public_code(teacher_list, student_list)
    else:
        expected = listmle_by_plackett_luce(teacher_list, student_list.detach())
    torch.testing.assert_close(value.detach(), expected.detach(), rtol=1e-4, atol=1e-4)
    value.backward()
    assert model.encoder.backbone.embeddings.word_embeddings.weight.grad.abs().sum() > 0
    assert not any(key.startswith("objectives.1") for key in model.state_dict())  # teachers are never checkpointed


def test_bad_rank_options_name_the_recipe_key(tmp_path: Path) -> None:
    assert OBJECTIVES.get("rank_distill") is RankingDistillation
    with pytest.raises(CsekitError, match=r"objectives\[1\].*loss"):
        build_part(OBJECTIVES, {"name": "rank_distill", "teachers": ["x"], "loss": "listwise"}, "objectives[1]")
    with pytest.raises(CsekitError, match=r"objectives\[1\].*one entry per teacher"):
        build_part(
            OBJECTIVES, {"name": "rank_distill", "teachers": ["x"], "teacher_weights": [0.5, 0.5]}, "objectives[1]"
        )
    with pytest.raises(CsekitError, match=r"teachers\[0\]"):
        build_part(OBJECTIVES, {"name": "rank_distill", "teachers": [str(tmp_path / "none")]}, "objectives[1]")


def test_a_rankcse_recipe_trains(tiny_model_dir: Path, train_tiny: TinyTrainer) -> None:
    objectives = (
        f"objectives=[{{name: infonce}}, {{name: rank_distill, teachers: [{tiny_model_dir}], "
        "teacher_poolers: [mean], loss: listmle}]"
    )
    run = train_tiny(objectives)
    assert run.result.steps == 3
    assert sum("listmle" in r for r in run.metrics) == 3


def js_by_hand(p_logits: torch.Tensor, q_logits: torch.Tensor) -> torch.Tensor:
    """The paper's Jensen-Shannon divergence, row by row from its definition."""
    total = 0.0
    for p_row, q_row in zip(p_logits.softmax(dim=1).tolist(), q_logits.softmax(dim=1).tolist(), strict=True):
        m = [(a + b) / 2 for a, b in zip(p_row, q_row, strict=True)]
        kl_p = sum(a * math.log(a / c) for a, c in zip(p_row, m, strict=True))
        kl_q = sum(b * math.log(b / c) for b, c in zip(q_row, m, strict=True))
        total += (kl_p + kl_q) / 2
    return torch.tensor(total / len(p_logits))


def test_ranking_consistency_is_the_js_divergence_of_the_two_views_lists(tmp_path: Path) -> None:
    torch.manual_seed(0)
    p, q = torch.randn(5, 5) * 3, torch.randn(5, 5) * 3
    torch.testing.assert_close(jensen_shannon(p, q), js_by_hand(p, q))
    torch.testing.assert_close(jensen_shannon(p, q), jensen_shannon(q, p))
    assert jensen_shannon(p, p).item() == pytest.approx(0.0, abs=1e-6)
    assert jensen_shannon(p * 100, -p * 100).item() <= math.log(2) + 1e-6
    model = rank_model(tmp_path, "listnet", [str(_saved_teacher(tmp_path))])
    state = model.make_state(DropoutViews(model.encoder.tokenizer, model.encoder.pooler, 16)(SENTENCES), SENTENCES, {})
    z1, z2 = state.embeddings
    forward = F.cosine_similarity(z1[:, None], z2[None], dim=-1) / 0.05
    backward = F.cosine_similarity(z2[:, None], z1[None], dim=-1) / 0.05
    value = RankingConsistency(temperature=0.05)(state)["rank_consistency"]
    torch.testing.assert_close(value.detach(), js_by_hand(forward.detach(), backward.detach()), rtol=1e-4, atol=1e-5)
    assert OBJECTIVES.get("rank_consistency") is RankingConsistency


def _saved_teacher(tmp_path: Path) -> Path:
    make_tiny_encoder(tmp_path / "teacher-tok", seed=1).save(tmp_path / "teacher")
    return tmp_path / "teacher"

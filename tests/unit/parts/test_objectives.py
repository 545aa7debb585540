"""InfoNCE against sentence-transformers' MultipleNegativesRankingLoss and a direct computation."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from csekit.parts.objectives import InfoNCE, NTXent
from csekit.parts.step_state import StepState


def make_state(anchors: torch.Tensor, positives: torch.Tensor) -> StepState:
    return StepState(
        sentences=[""] * anchors.shape[0],
        features=[anchors, positives],
        embeddings=[anchors, positives],
        encoder_output=None,  # type: ignore[arg-type]
        encoder=None,  # type: ignore[arg-type]
    )


def test_infonce_equals_multiple_negatives_ranking_loss_and_its_gradients() -> None:
    losses = pytest.importorskip("sentence_transformers.losses")
    torch.manual_seed(0)
    anchors = torch.randn(16, 24, dtype=torch.float64)
    positives = anchors + 2.0 * torch.randn(16, 24, dtype=torch.float64)

    ours_a, ours_p = anchors.clone().float().requires_grad_(), positives.clone().float().requires_grad_()
    ours = InfoNCE(temperature=0.05)(make_state(ours_a, ours_p))["infonce"]
    ours.backward()

    theirs_a, theirs_p = anchors.clone().float().requires_grad_(), positives.clone().float().requires_grad_()
    reference = losses.MultipleNegativesRankingLoss(model=None, scale=20.0)
    theirs = reference.compute_loss_from_embeddings([theirs_a, theirs_p], labels=None)
    theirs.backward()

    assert ours.item() > 0.1  # a loss far from zero, so the comparison is meaningful
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-5)
    torch.testing.assert_close(ours_a.grad, theirs_a.grad, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(ours_p.grad, theirs_p.grad, rtol=1e-4, atol=1e-6)


def test_infonce_matches_direct_formula_with_weights_and_extra_negatives() -> None:
    torch.manual_seed(1)
    n, d, tau = 6, 8, 0.1
    anchors, positives, noise = torch.randn(n, d), torch.randn(n, d), torch.randn(3, d)
    weights = torch.ones(n, n)
    weights[0, 2] = 0.0  # a false negative removed
    weights[1, 3] = 0.5
    state = make_state(anchors, positives)
    state.negative_weights = weights
    state.extra_negatives = [noise]
    loss = InfoNCE(temperature=tau)(state)["infonce"]

    def sim(anchor: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
        return torch.exp(F.cosine_similarity(anchor, other, dim=0) / tau)

    expected = []
    for i in range(n):
        numerator = sim(anchors[i], positives[i])
        denominator = sum(weights[i, j] * sim(anchors[i], positives[j]) for j in range(n))
        denominator = denominator + sum(sim(anchors[i], z) for z in noise)
        expected.append(-torch.log(numerator / denominator))
    assert loss.item() == pytest.approx(torch.stack(expected).mean().item(), rel=1e-5)


def test_infonce_is_low_for_identical_views_and_high_for_random_ones() -> None:
    torch.manual_seed(2)
    x = torch.randn(32, 16)
    same = InfoNCE()(make_state(x, x.clone()))["infonce"]
    shuffled = InfoNCE()(make_state(x, x[torch.randperm(32)]))["infonce"]
    assert same.item() < 0.05 < shuffled.item()


def test_infonce_rejects_non_positive_temperature() -> None:
    with pytest.raises(ValueError, match="temperature"):
        InfoNCE(temperature=0.0)


def consert_nt_xent(hidden1: torch.Tensor, hidden2: torch.Tensor, temperature: float) -> torch.Tensor:
    """The reference: ConSERT's `_contrastive_loss_forward`, `nt_xent` branch (yym6472/ConSERT,
    sentence_transformers/losses/AdvCLSoftmaxLoss.py), one process."""
    large_num = 1e9
    batch_size = hidden1.shape[0]
    hidden1, hidden2 = F.normalize(hidden1, p=2, dim=-1), F.normalize(hidden2, p=2, dim=-1)
    labels = torch.arange(0, batch_size)
    masks = F.one_hot(torch.arange(0, batch_size), num_classes=batch_size).float()
    logits_aa = hidden1 @ hidden1.T / temperature - masks * large_num
    logits_bb = hidden2 @ hidden2.T / temperature - masks * large_num
    logits_ab = hidden1 @ hidden2.T / temperature
    logits_ba = hidden2 @ hidden1.T / temperature
    loss_a = F.cross_entropy(torch.cat([logits_ab, logits_aa], 1), labels)
    loss_b = F.cross_entropy(torch.cat([logits_ba, logits_bb], 1), labels)
    return loss_a + loss_b


def test_nt_xent_equals_consert_and_its_gradients() -> None:
    torch.manual_seed(3)
    a0, b0 = torch.randn(12, 16), torch.randn(12, 16)
    b0 = a0 + 0.8 * b0
    ours_a, ours_b = a0.clone().requires_grad_(), b0.clone().requires_grad_()
    ours = NTXent(temperature=0.1)(make_state(ours_a, ours_b))["nt_xent"]
    ours.backward()
    ref_a, ref_b = a0.clone().requires_grad_(), b0.clone().requires_grad_()
    reference = consert_nt_xent(ref_a, ref_b, 0.1)
    reference.backward()
    assert ours.item() > 0.1 and ours.item() == pytest.approx(reference.item(), rel=1e-5)
    torch.testing.assert_close(ours_a.grad, ref_a.grad, rtol=1e-4, atol=1e-7)
    torch.testing.assert_close(ours_b.grad, ref_b.grad, rtol=1e-4, atol=1e-7)
    # not SimCSE's loss: the same-view negatives and the second direction change it
    infonce = InfoNCE(temperature=0.1)(make_state(a0, b0))["infonce"]
    assert ours.item() != pytest.approx(infonce.item(), rel=0.05)
    # symmetric in its two views
    swapped = NTXent(temperature=0.1)(make_state(b0, a0))["nt_xent"]
    assert swapped.item() == pytest.approx(ours.item(), rel=1e-6)


def test_nt_xent_rejects_bad_settings_and_missing_views() -> None:
    with pytest.raises(ValueError, match="temperature"):
        NTXent(temperature=0.0)
    with pytest.raises(ValueError, match="two different views"):
        NTXent(views=[1, 1])
    with pytest.raises(ValueError, match="nt_xent needs views 0 and 2"):
        NTXent(views=[0, 2])(make_state(torch.randn(4, 8), torch.randn(4, 8)))

"""MixCSE: mixed hard negatives against the paper's equation, stopped gradients, composition, training."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import TinyTrainer
from part_checks import assert_same_gradients, step_gradients

from csekit.core.errors import CsekitError
from csekit.encoding.encoder import SentenceEncoder
from csekit.parts.heads.mlp import MLPHead
from csekit.parts.negatives import NEGATIVES
from csekit.parts.negatives.mixing import MixedNegatives
from csekit.parts.negatives.noise import NoiseNegatives
from csekit.parts.objectives import InfoNCE
from csekit.parts.objectives.weighted_logits import WeightedLogitsLoss
from csekit.parts.step_state import StepState
from csekit.parts.views.dropout import DropoutViews
from csekit.training.model import ContrastiveModel
from csekit.training.part_building import build_part

SENTENCES = ["a man plays guitar", "the dog runs in the park", "she eats food", "it is big and red", "a cat sleeps"]
LAMBDA = 0.2  # the paper's mixing coefficient for BERT-base


def build(model_dir: Path, negatives: list[torch.nn.Module]) -> ContrastiveModel:
    encoder = SentenceEncoder.load(model_dir, pooler="mean")
    return ContrastiveModel(encoder, MLPHead(encoder.dim), 2, [(InfoNCE(), 1.0)], negatives, None)


def step_state(model: ContrastiveModel) -> StepState:
    views = DropoutViews(model.encoder.tokenizer, model.encoder.pooler, 16)
    return model.make_state(views(SENTENCES), SENTENCES, {})


def mixcse_loss_by_hand(anchors: torch.Tensor, positives: torch.Tensor, temperature: float) -> torch.Tensor:
    """The paper's loss, anchor by anchor: in-batch positives plus the mixes of the positives,

    h~_j = normalise(lambda h_j^+ + (1 - lambda) h_{j+1}^+), constants. Anchor i leaves out the mix
    whose (1 - lambda) share is its own positive, h~_{i-1}.
    """
    n = len(anchors)
    losses = []
    for i in range(n):
        mixes = []
        for j in range(n):
            if (j + 1) % n == i:
                continue
            mix = LAMBDA * positives[j].detach() + (1 - LAMBDA) * positives[(j + 1) % n].detach()
            mixes.append(mix / mix.norm())
        candidates = torch.cat([positives, torch.stack(mixes)])
        logits = F.cosine_similarity(anchors[i : i + 1].float(), candidates.float()) / temperature
        losses.append(-F.log_softmax(logits, dim=0)[i])
    return torch.stack(losses).mean()


def test_loss_equals_the_papers_mixed_negatives_loss(tiny_model_dir: Path) -> None:
    model = build(tiny_model_dir, [MixedNegatives(positive_share=LAMBDA)])
    state = step_state(model)
    model.negatives[0](state)
    anchors, positives = state.embeddings
    loss = InfoNCE(temperature=0.05)(state)["infonce"]
    torch.testing.assert_close(loss, mixcse_loss_by_hand(anchors, positives, 0.05))
    # Without leaving out each anchor's own-positive mix the loss differs, so the comparison can fail.
    state.extra_negative_weights.clear()
    assert not torch.isclose(InfoNCE(temperature=0.05)(state)["infonce"], mixcse_loss_by_hand(anchors, positives, 0.05))


def test_with_the_dclr_code_objective_the_left_out_mix_gets_logit_0_as_in_the_authors_code(
    tiny_model_dir: Path,
) -> None:
    model = build(tiny_model_dir, [MixedNegatives(positive_share=LAMBDA)])
    state = step_state(model)
    model.negatives[0](state)
    anchors, positives = (view.float() for view in state.embeddings)
    # models_mix.py: z3 = lambda z2 + (1 - lambda) roll(z2, -1), detached; cos(z1, z3) with the entries
    # [i, i - 1] multiplied by 0, appended to the in-batch cosines; cross-entropy.
    mixes = LAMBDA * positives.detach() + (1 - LAMBDA) * positives.detach().roll(-1, dims=0)
    to_mixes = F.cosine_similarity(anchors[:, None], mixes[None], dim=-1)
    to_mixes = to_mixes * (1 - torch.cat([torch.eye(5)[-1:], torch.eye(5)[:-1]]))  # the code's mask
    in_batch = F.cosine_similarity(anchors[:, None], positives[None], dim=-1)
    logits = torch.cat([in_batch, to_mixes], dim=1) / 0.05
    expected = F.cross_entropy(logits, torch.arange(5))
    loss = WeightedLogitsLoss(temperature=0.05, loss="infonce")(state)["dclr_code"]
    torch.testing.assert_close(loss, expected)


def authors_logits_with_both_blocks(anchors: torch.Tensor, positives: torch.Tensor) -> torch.Tensor:
    """models_mix.py L198-271 (no hard negatives in the data, hard_negative_weight 0): the in-batch cosines,
    then z1 against z3 = lambda z2 + (1 - lambda) roll(z2, -1) with [i, i - 1] multiplied by 0, then
    z4 = lambda z1 + (1 - lambda) roll(z1, -1) against z2 with [i, i + 1] multiplied by 0; all over tau."""
    n = len(anchors)
    z1, z2 = anchors.float(), positives.float()
    cos = F.cosine_similarity(z1[:, None], z2[None], dim=-1)
    z3 = (LAMBDA * z2 + (1 - LAMBDA) * torch.cat([z2[1:], z2[:1]])).detach()
    mask = torch.eye(n)
    z1_z3 = F.cosine_similarity(z1[:, None], z3[None], dim=-1) * (1 - torch.cat([mask[-1:], mask[:-1]]))
    z4 = (LAMBDA * z1 + (1 - LAMBDA) * torch.cat([z1[1:], z1[:1]])).detach()
    z4_z2 = F.cosine_similarity(z4[:, None], z2[None], dim=-1) * (1 - torch.cat([mask[:, -1:], mask[:, :-1]], dim=1))
    return torch.cat([cos, z1_z3, z4_z2], dim=1) / 0.05


def test_the_symmetric_block_is_the_authors_second_block(tiny_model_dir: Path) -> None:
    model = build(tiny_model_dir, [MixedNegatives(positive_share=LAMBDA, symmetric=True)])
    state = step_state(model)
    model.negatives[0](state)
    anchors, positives = state.embeddings
    expected = authors_logits_with_both_blocks(anchors, positives)
    # With the dclr_code objective (weights multiply logits) the left-out entries get logit 0, as in the code.
    loss = WeightedLogitsLoss(temperature=0.05, loss="infonce")(state)["dclr_code"]
    torch.testing.assert_close(loss, F.cross_entropy(expected, torch.arange(5)))
    # With infonce they are left out (weight 0); every other logit is the code's.
    logits = InfoNCE(temperature=0.05).logits(state)
    left_out = torch.zeros(5, 15, dtype=torch.bool)
    left_out[torch.arange(5), 5 + (torch.arange(5) - 1) % 5] = True
    left_out[torch.arange(5), 10 + (torch.arange(5) + 1) % 5] = True
    assert bool(torch.isinf(logits[left_out]).all()) and bool(torch.isfinite(logits[~left_out]).all())
    torch.testing.assert_close(logits[~left_out], expected[~left_out])
    # The block's gradient reaches the positives only (its stand-ins are constants), as z4 is detached.
    (grad_anchors, grad_positives) = torch.autograd.grad(logits[:, 10:][~left_out[:, 10:]].sum(), [anchors, positives])
    assert float(grad_anchors.abs().sum()) == 0.0 and float(grad_positives.abs().sum()) > 0.0
    # Without the block the code's loss is not reached, so the comparison can fail.
    state.extra_row_contrasts.clear()
    assert not torch.isclose(
        WeightedLogitsLoss(temperature=0.05, loss="infonce")(state)["dclr_code"],
        F.cross_entropy(expected, torch.arange(5)),
    )


def test_each_mix_is_a_unit_vector_mostly_of_the_next_positive(tiny_model_dir: Path) -> None:
    model = build(tiny_model_dir, [MixedNegatives(positive_share=LAMBDA)])
    state = step_state(model)
    model.negatives[0](state)
    mixes, positives = state.extra_negatives[0], state.embeddings[1].detach()
    torch.testing.assert_close(mixes.norm(dim=1), torch.ones(5))
    to_own = F.cosine_similarity(mixes, positives)
    to_next = F.cosine_similarity(mixes, positives.roll(-1, dims=0))
    assert bool((to_next > to_own).all())
    assert not mixes.requires_grad
    assert torch.equal(state.extra_negative_weights[0], 1 - torch.eye(5).roll(-1, dims=1))


def test_model_gradient_equals_the_gradient_with_the_mixes_as_constants(tiny_model_dir: Path) -> None:
    model = build(tiny_model_dir, [MixedNegatives()])
    with_mixes, inputs = step_gradients(model, SENTENCES)
    torch.manual_seed(1)  # the same dropout masks
    state = model.make_state(inputs, SENTENCES, {})
    anchors, positives = state.embeddings
    mixcse_loss_by_hand(anchors, positives, 0.05).backward()
    assert_same_gradients(model.named_parameters(), with_mixes)


def test_mixes_after_other_negatives_weight_their_own_entry_only(tiny_model_dir: Path) -> None:
    model = build(tiny_model_dir, [NoiseNegatives(ratio=1.0, steps=0), MixedNegatives()])
    state = step_state(model)
    for negatives in model.negatives:
        negatives(state)
    assert set(state.extra_negative_weights) == {1}
    logits = InfoNCE(temperature=0.05).logits(state)
    assert logits.shape == (5, 5 + 5 + 5)
    assert bool(torch.isfinite(logits[:, :10]).all())
    assert int(torch.isinf(logits[:, 10:]).sum()) == 5  # one left-out mix per anchor


def test_bad_mixing_share_names_the_recipe_key() -> None:
    for share in (1.0, -0.1):
        with pytest.raises(CsekitError, match=r"negatives\[0\].*positive_share"):
            build_part(NEGATIVES, {"name": "mixcse", "positive_share": share}, "negatives[0]")
    with pytest.raises(CsekitError, match=r"negatives\[0\].*must differ"):
        build_part(NEGATIVES, {"name": "mixcse", "symmetric": True, "anchor_view": 1}, "negatives[0]")


def test_a_mixcse_recipe_trains(train_tiny: TinyTrainer) -> None:
    assert train_tiny("negatives=[{name: mixcse}]").result.steps == 3

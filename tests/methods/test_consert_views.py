"""ConSERT's views: each augmentation changes what it should and nothing else."""

from __future__ import annotations

import pytest
import torch
from conftest import TinyTrainer

from csekit.core.errors import CsekitError
from csekit.encoding.encoder import SentenceEncoder
from csekit.encoding.passes import EMBEDDING_MASK
from csekit.parts.views import VIEWS
from csekit.parts.views.consert import ConsertViews
from csekit.parts.views.dropout import DropoutViews
from csekit.training.part_building import build_part

SENTENCES = [
    "a man plays guitar in the park",
    "the dog runs",
    "she eats food quickly and slowly",
    "it is big",
    "the small red cat sits on the blue house",
    "they are playing music",
]


def make_views(encoder: SentenceEncoder, augmentations: list, **rates: float) -> ConsertViews:
    return ConsertViews(encoder.tokenizer, encoder.pooler, 32, encoder.dim, encoder, augmentations, **rates)


def plain(encoder: SentenceEncoder, views: int = 2) -> dict[str, torch.Tensor]:
    return DropoutViews(encoder.tokenizer, encoder.pooler, 32, num_views=views)(SENTENCES)


def eligible(encoder: SentenceEncoder, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    special = torch.tensor([encoder.tokenizer.cls_token_id, encoder.tokenizer.sep_token_id])
    return batch["attention_mask"].bool() & ~torch.isin(batch["input_ids"], special)


def test_shuffle_permutes_positions_of_ordinary_tokens_only(tiny_encoder: SentenceEncoder) -> None:
    torch.manual_seed(0)
    batch = make_views(tiny_encoder, ["none", "shuffle"])(SENTENCES)
    reference = plain(tiny_encoder)
    for key in reference:  # token ids, masks and types are untouched: the token multiset is the same
        assert torch.equal(batch[key], reference[key])
    assert EMBEDDING_MASK not in batch
    n, length = len(SENTENCES), batch["input_ids"].shape[1]
    default = torch.arange(length).expand(2 * n, -1)
    movable = eligible(tiny_encoder, batch)
    assert torch.equal(batch["position_ids"][:n], default[:n])  # the first view is not shuffled
    assert torch.equal(batch["position_ids"][~movable], default[~movable])  # [CLS], [SEP], padding in place
    changed = 0
    for row in range(n, 2 * n):
        where = movable[row]
        assert sorted(batch["position_ids"][row, where].tolist()) == default[row, where].tolist()
        changed += int(not torch.equal(batch["position_ids"][row], default[row]))
    assert changed >= n - 1


def test_shuffled_positions_encode_like_the_reordered_sentence(tiny_encoder: SentenceEncoder) -> None:
    """Permuted position ids are token shuffling: the [CLS] output equals that of the physically reordered ids."""
    torch.manual_seed(1)
    tiny_encoder.eval()
    batch = make_views(tiny_encoder, ["shuffle", "shuffle"])(SENTENCES[:1])
    reordered = batch["input_ids"][:1].clone()
    reordered[0, batch["position_ids"][0]] = batch["input_ids"][0]
    assert not torch.equal(reordered, batch["input_ids"][:1])
    with torch.no_grad():
        shuffled = tiny_encoder({k: v[:1] for k, v in batch.items()}).token_states[0, 0]
        moved = tiny_encoder({**{k: v[:1] for k, v in batch.items() if k != "position_ids"}, "input_ids": reordered})
    torch.testing.assert_close(shuffled, moved.token_states[0, 0])


@pytest.mark.parametrize(("name", "rate"), [("token_cutoff", 0.3), ("span_cutoff", 0.4)])
def test_token_and_span_cutoff_zero_exactly_the_chosen_fraction(
    tiny_encoder: SentenceEncoder, name: str, rate: float
) -> None:
    torch.manual_seed(2)
    batch = make_views(tiny_encoder, ["none", name], **{f"{name}_rate": rate})(SENTENCES)
    reference = plain(tiny_encoder)
    for key in reference:
        assert torch.equal(batch[key], reference[key])
    assert "position_ids" not in batch
    mask = batch[EMBEDDING_MASK]
    n = len(SENTENCES)
    assert mask.shape == (2 * n, batch["input_ids"].shape[1], 1)
    assert torch.all(mask[:n] == 1)
    movable = eligible(tiny_encoder, batch)
    for row in range(n, 2 * n):
        zeroed = mask[row, :, 0] == 0
        assert int(zeroed.sum()) == int(movable[row].sum() * rate)
        assert not torch.any(zeroed & ~movable[row])  # never [CLS], [SEP] or padding
        if name == "span_cutoff" and zeroed.any():
            where = zeroed.nonzero().flatten()
            assert torch.equal(where, torch.arange(int(where[0]), int(where[0]) + len(where)))


def test_feature_cutoff_zeroes_whole_dimensions(tiny_encoder: SentenceEncoder) -> None:
    torch.manual_seed(3)
    batch = make_views(tiny_encoder, ["feature_cutoff", "none"], feature_cutoff_rate=0.25)(SENTENCES)
    mask = batch[EMBEDDING_MASK]
    n = len(SENTENCES)
    assert mask.shape == (2 * n, 1, tiny_encoder.dim)
    assert torch.all(mask[n:] == 1)
    for row in range(n):
        assert int((mask[row, 0] == 0).sum()) == int(tiny_encoder.dim * 0.25)
    assert not all(torch.equal(mask[0], mask[row]) for row in range(1, n))  # drawn per sentence


def test_the_embedding_mask_reaches_the_embedding_output_and_nothing_else(tiny_encoder: SentenceEncoder) -> None:
    torch.manual_seed(4)
    tiny_encoder.eval()
    batch = make_views(tiny_encoder, [["token_cutoff", "feature_cutoff"], "none"], token_cutoff_rate=0.3)(SENTENCES)
    assert batch[EMBEDDING_MASK].shape == (12, batch["input_ids"].shape[1], tiny_encoder.dim)
    seen: list[torch.Tensor] = []
    layer = tiny_encoder.backbone.encoder.layer[0]
    handle = layer.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(args[0] if args else kwargs["hidden_states"]), with_kwargs=True
    )
    try:
        with torch.no_grad():
            masked = tiny_encoder(batch)
            unmasked = tiny_encoder({k: v for k, v in batch.items() if k != EMBEDDING_MASK})
    finally:
        handle.remove()
    torch.testing.assert_close(seen[0], seen[1] * batch[EMBEDDING_MASK])
    n = len(SENTENCES)
    torch.testing.assert_close(masked.pooled[n:], unmasked.pooled[n:])  # the plain view is untouched
    assert not torch.allclose(masked.pooled[:n], unmasked.pooled[:n])
    assert not tiny_encoder.backbone.embeddings._forward_hooks  # the hook lives for one call only


def test_consert_views_are_registered_and_validate_their_options(tiny_encoder: SentenceEncoder) -> None:
    context = {"tokenizer": tiny_encoder.tokenizer, "pooler": tiny_encoder.pooler, "max_length": 32}
    context |= {"dim": tiny_encoder.dim, "encoder": tiny_encoder}
    views = build_part(
        VIEWS, {"name": "consert", "augmentations": ["shuffle", "token_cutoff"]}, "data.views", **context
    )
    assert views.num_views == 2
    with pytest.raises(CsekitError, match=r"data\.views.*shufle"):
        build_part(VIEWS, {"name": "consert", "augmentations": ["shufle", "none"]}, "data.views", **context)
    with pytest.raises(CsekitError, match=r"data\.views.*token_cutoff_rate"):
        build_part(VIEWS, {"name": "consert", "token_cutoff_rate": 1.5}, "data.views", **context)


def test_a_tiny_model_trains_with_consert_views(train_tiny: TinyTrainer) -> None:
    views = "data.views={name: consert, augmentations: [[shuffle, span_cutoff], [token_cutoff, feature_cutoff]]}"
    assert train_tiny("model.pooler=mean", views, steps=2).result.steps == 2

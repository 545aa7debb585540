"""SNCSE: the bidirectional margin loss against the authors' computation, its negations, training."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from conftest import REPO, WORDS, TinyTrainer, make_byte_level_bpe_tokenizer, make_tiny_encoder

from csekit.core.errors import CsekitError
from csekit.encoding.pooling import MaskPooler
from csekit.parts.heads.mlp import MLPHead
from csekit.parts.objectives import OBJECTIVES, InfoNCE
from csekit.parts.objectives.bidirectional_margin import BidirectionalMargin
from csekit.parts.views.dropout import DropoutViews
from csekit.training.model import ContrastiveModel
from csekit.training.part_building import build_part
from csekit.training.recipe import load_recipe

SENTENCES = ["the man plays guitar", "a dog runs", "the cat sits", "she eats food"]
ALPHA, BETA = 0.1, 0.3  # the authors' code (train_SNCSE.py)


def bml_as_the_authors_code(z1: torch.Tensor, z2: torch.Tensor, z3: torch.Tensor) -> torch.Tensor:
    """simcse/models.py: temp = cos(z1, z3) - cos(z1, z2); mean(relu(temp + alpha) + relu(-temp - beta))."""
    temp = torch.cosine_similarity(z1, z3, dim=1) - torch.cosine_similarity(z1, z2, dim=1)
    return torch.mean(torch.relu(temp + ALPHA) + torch.relu(-temp - BETA))


def test_bml_values_by_hand() -> None:
    h = torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0]])
    positive = torch.tensor([[0.6, 0.8], [1.0, 0.0], [0.8, 0.6]])  # cosines 0.6, 1.0, 0.8
    negation = torch.tensor([[0.8, 0.6], [0.0, 1.0], [0.6, 0.8]])  # cosines 0.8, 0.0, 0.6
    # Delta = 0.2: 0.2 + 0.1; Delta = -1.0: -(-1.0) - 0.3; Delta = -0.2 lies in [-beta, -alpha]: 0.
    expected = torch.tensor((0.3 + 0.7 + 0.0) / 3)
    torch.testing.assert_close(bml_as_the_authors_code(h, positive, negation), expected)


def sncse_model(tmp_path: Path) -> ContrastiveModel:
    encoder = make_tiny_encoder(tmp_path / "tok", pooler="mask")
    objectives = [(InfoNCE(), 1.0), (BidirectionalMargin(ALPHA, BETA), 1e-3)]
    model = ContrastiveModel(encoder, MLPHead(encoder.dim), 2, objectives)
    model.eval()  # the tiny model has dropout: compare without it
    return model


def test_bml_objective_equals_the_authors_loss_with_negations_in_view_1s_template(tmp_path: Path) -> None:
    model = sncse_model(tmp_path)
    fields = {"negation": ["the man does not play guitar", None, "the cat does not sit", "  "]}
    inputs = DropoutViews(model.encoder.tokenizer, model.encoder.pooler, 16)(SENTENCES)
    state = model.make_state(inputs, SENTENCES, fields)
    loss = model.objectives[1](state)["bml"]
    # The authors' code: a missing negation is "Not " + sentence; the negation in the template
    # 'This sentence of "..." means [MASK] .' (view 1), through the training MLP.
    negations = ["the man does not play guitar", "Not a dog runs", "the cat does not sit", "Not she eats food"]
    encoder = model.encoder
    z3 = model.head(encoder(encoder.tokenize(negations, view=1, max_length=16)).pooled)
    z1, z2 = state.embeddings
    torch.testing.assert_close(loss, bml_as_the_authors_code(z1, z2, z3))
    # The other template gives another loss, so the comparison can fail.
    z3_view0 = model.head(encoder(encoder.tokenize(negations, view=0, max_length=16)).pooled)
    assert not torch.isclose(loss, bml_as_the_authors_code(z1, z2, z3_view0))
    loss.backward()
    assert encoder.backbone.embeddings.word_embeddings.weight.grad.abs().sum() > 0
    assert all(p.grad is not None for p in model.head.parameters())


def test_without_a_fallback_rows_without_a_negation_are_skipped(tmp_path: Path) -> None:
    model = sncse_model(tmp_path)
    fields = {"negation": ["the man does not play guitar", None, "", "she does not eat food"]}
    inputs = DropoutViews(model.encoder.tokenizer, model.encoder.pooler, 16)(SENTENCES)
    state = model.make_state(inputs, SENTENCES, fields)
    loss = BidirectionalMargin(ALPHA, BETA, fallback_prefix=None, max_length=16)(state)["bml"]
    encoder, rows = model.encoder, [0, 3]
    z3 = model.head(encoder(encoder.tokenize([fields["negation"][i] for i in rows], view=1, max_length=16)).pooled)
    z1, z2 = (view[rows] for view in state.embeddings)
    torch.testing.assert_close(loss, bml_as_the_authors_code(z1, z2, z3))
    none = {"negation": [None] * 4}
    empty = BidirectionalMargin(fallback_prefix=None)(model.make_state(inputs, SENTENCES, none))["bml"]
    assert empty.item() == 0.0


def test_bml_without_negations_or_with_bad_margins_says_what_to_do(tmp_path: Path) -> None:
    model = sncse_model(tmp_path)
    inputs = DropoutViews(model.encoder.tokenizer, model.encoder.pooler, 16)(SENTENCES)
    with pytest.raises(CsekitError, match=r'field "negation".*csekit augment'):
        BidirectionalMargin()(model.make_state(inputs, SENTENCES, {}))
    assert OBJECTIVES.get("bml") is BidirectionalMargin
    with pytest.raises(CsekitError, match=r"objectives\[1\].*alpha"):
        build_part(OBJECTIVES, {"name": "bml", "alpha": 0.5, "beta": 0.3}, "objectives[1]")


def negation_corpus(path: Path, lines: int = 48) -> Path:
    rng = random.Random(0)
    words = [w for w in WORDS if w.isalpha()]
    with open(path, "w", encoding="utf-8") as handle:
        for i in range(lines):
            text = " ".join(rng.choices(words, k=5))
            handle.write(json.dumps({"text": text, "negation": None if i % 5 == 0 else f"not {text}"}) + "\n")
    return path


@pytest.mark.parametrize("weighting", [False, True], ids=["sncse", "sncse+dclr"])
def test_sncse_recipes_train(tmp_path: Path, tiny_model_dir: Path, train_tiny: TinyTrainer, weighting: bool) -> None:
    extra = ["model.pooler=mask", "model.head={name: mlp}"]
    extra.append("objectives=[{name: infonce}, {name: bml, alpha: 0.1, beta: 0.3, weight: 1.0e-3}]")
    if weighting:
        extra.append(f"weighting={{name: dclr, model: {tiny_model_dir}, model_pooler: mean, phi: 0.9}}")
    run = train_tiny(*extra, corpus=negation_corpus(tmp_path / "corpus.jsonl"))
    steps = [r for r in run.metrics if "bml" in r]
    assert run.result.steps == 3 and len(steps) == 3 and all(r["bml"] >= 0.0 for r in steps)


# --- RoBERTa: the authors' token ids ---------------------------------------------------------------------

AUTHORS_PREFIXES = {0: 'This sentence : " ', 1: 'This sentence of " '}
"""train_SNCSE.py L490-493: s1 (view 0) and ss1 (view 1 and the negation), tokenised with the trailing space."""


def authors_sncse_roberta_ids(tokenizer, sentence: str, view: int, max_seq_length: int = 32) -> list[int]:  # type: ignore[no-untyped-def]
    """train_SNCSE.py L490-535 for RoBERTa: [<s>] + s1 + tokens[:budget] + s2 + [</s>], with
    s2 = encode(' " means <mask> .')[1:-1] and budget = max_seq_length - len(s1) - len(s2) - 2."""
    prefix = tokenizer.convert_tokens_to_ids(tokenizer.tokenize(AUTHORS_PREFIXES[view]))
    suffix = tokenizer.encode(' " means <mask> .')[1:-1]
    assert suffix.count(tokenizer.mask_token_id) == 1
    budget = max_seq_length - len(prefix) - len(suffix) - 2
    tokens = tokenizer.convert_tokens_to_ids(tokenizer.tokenize(sentence))[:budget]
    return [tokenizer.cls_token_id, *prefix, *tokens, *suffix, tokenizer.sep_token_id]


def test_the_roberta_recipes_templates_and_budget_give_the_authors_token_ids() -> None:
    # The tokenizer learns the template's words as roberta-base has them: 'This', 'Ġsentence', 'Ġ:', 'Ġ"', ...
    texts = ['This sentence : " a man plays " means .', 'This sentence of " the dog runs " means .', "she eats food"]
    tokenizer = make_byte_level_bpe_tokenizer(texts)
    prefix = tokenizer.tokenize(AUTHORS_PREFIXES[0])
    assert prefix == ["This", "Ġsentence", "Ġ:", 'Ġ"', "Ġ"]  # roberta-base's: a lone space token last
    recipe = load_recipe(REPO / "recipes" / "sncse-roberta-base.yaml")
    assert recipe.model.max_length == 32 - len(prefix) - 4 - 2  # the authors' budget: 21 sentence tokens
    pooler = MaskPooler(recipe.model.templates or ())
    pooler.bind(tokenizer)
    words = " ".join(WORDS[:30])  # longer than the budget: the authors' truncation is compared too
    sentences = ["a man plays the guitar .", "She eats food.", words, "the dog does not run in the park ."]
    for view in (0, 1):
        ids = pooler.encode_ids(tokenizer, sentences, recipe.model.max_length, view=view)["input_ids"]
        assert ids == [authors_sncse_roberta_ids(tokenizer, sentence, view) for sentence in sentences]
    assert len(ids[2]) == 32

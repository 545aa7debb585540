"""PromptBERT's template denoising (`mask_denoised`): against the authors' code's computation, test time, training."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import REPO, TinyTrainer, make_byte_level_bpe_tokenizer, make_tiny_encoder

from csekit.core.errors import CsekitError
from csekit.encoding.encoder import SentenceEncoder
from csekit.encoding.pooling import MaskPooler
from csekit.encoding.representation import Reading
from csekit.training.recipe import load_recipe

SENTENCES = ["the man plays", "a dog runs in the park", "she eats", "the man plays"]
TEMPLATES = {0: 'This sentence of "', 1: 'This sentence : "'}  # PromptBERT's unsup-bert, before [X]


def denoised_by_hand(encoder: SentenceEncoder, inputs: dict[str, torch.Tensor], view: int) -> torch.Tensor:
    """The authors' `get_delta` for each row: the template's ids alone ([CLS] prefix suffix [SEP]), the
    positions after the sentence shifted by its length, the [MASK] state subtracted from the row's."""
    tokenizer = encoder.tokenizer
    prefix = len(tokenizer(TEMPLATES[view], add_special_tokens=False)["input_ids"])
    full = encoder.backbone(**inputs, return_dict=True).last_hidden_state
    rows = []
    embeddings = encoder.backbone.embeddings
    padding_idx = getattr(embeddings, "padding_idx", None)
    for row, sentence in enumerate(SENTENCES):
        ids = inputs["input_ids"][row][inputs["attention_mask"][row].bool()]
        # The row's own position ids: BERT counts from 0, RoBERTa as its embeddings number an input (transformers).
        if padding_idx is None:
            row_positions = torch.arange(len(ids))
        else:
            row_positions = embeddings.create_position_ids_from_input_ids(ids[None], padding_idx)[0]
        length = len(tokenizer(sentence, add_special_tokens=False)["input_ids"])
        start = 1 + prefix  # [CLS] and the prefix
        template = torch.cat([ids[:start], ids[start + length :]])
        positions = torch.cat([row_positions[:start], row_positions[start + length :]])
        alone = encoder.backbone(input_ids=template[None], position_ids=positions[None]).last_hidden_state[0]
        mask = int((ids == tokenizer.mask_token_id).nonzero()[-1])
        rows.append(full[row, mask] - alone[mask - length])
    return torch.stack(rows)


@pytest.mark.parametrize("model_type", ["bert", "roberta"])
@pytest.mark.parametrize("view", [0, 1])
def test_training_representation_is_the_mask_state_minus_the_template_alone_at_the_same_positions(
    tmp_path: Path, view: int, model_type: str
) -> None:
    encoder = make_tiny_encoder(tmp_path / "tok", pooler="mask_denoised", initializer_range=0.2, model_type=model_type)
    encoder.train()
    encoder.backbone.eval()  # no dropout, so both passes are deterministic; the pooler stays in training
    inputs = encoder.tokenize(SENTENCES, view=view)
    with torch.no_grad():
        pooled = encoder(inputs, token_states=False).pooled
        expected = denoised_by_hand(encoder, inputs, view)
        torch.testing.assert_close(pooled, expected)
        # The template states depend on the shifted positions: without the shift they differ.
        plain = MaskPooler(encoder.pooler.templates)
        plain.bind(encoder.tokenizer)
        states = encoder.backbone(**inputs).last_hidden_state
        undenoised = plain((states,), inputs["attention_mask"], inputs["input_ids"])
    assert not torch.allclose(pooled, undenoised, atol=1e-4)


def authors_get_delta_by_hand(encoder: SentenceEncoder, inputs: dict[str, torch.Tensor], view: int) -> torch.Tensor:
    """The authors' `get_delta` as written (models.py L96-98): the template alone with position ids
    arange(template length) and those after the prefix (`len(bs) + 1`) shifted by the sentence's length;
    on RoBERTa the sentence pass keeps its own numbering (from padding_idx + 1)."""
    tokenizer = encoder.tokenizer
    prefix = len(tokenizer(TEMPLATES[view], add_special_tokens=False)["input_ids"])
    full = encoder.backbone(**inputs, return_dict=True).last_hidden_state
    rows = []
    for row, sentence in enumerate(SENTENCES):
        ids = inputs["input_ids"][row][inputs["attention_mask"][row].bool()]
        length = len(tokenizer(sentence, add_special_tokens=False)["input_ids"])
        start = 1 + prefix
        template = torch.cat([ids[:start], ids[start + length :]])
        positions = torch.arange(len(template))
        positions[start:] += length
        alone = encoder.backbone(input_ids=template[None], position_ids=positions[None]).last_hidden_state[0]
        mask = int((ids == tokenizer.mask_token_id).nonzero()[-1])
        rows.append(full[row, mask] - alone[mask - length])
    return torch.stack(rows)


@pytest.mark.parametrize("model_type", ["bert", "roberta"])
def test_template_positions_from_zero_are_the_authors_get_delta(tmp_path: Path, model_type: str) -> None:
    encoder = make_tiny_encoder(tmp_path / "tok", pooler="mask_denoised", initializer_range=0.2, model_type=model_type)
    encoder.pooler.template_positions = "from_zero"
    encoder.train()
    encoder.backbone.eval()
    inputs = encoder.tokenize(SENTENCES, view=0)
    with torch.no_grad():
        pooled = encoder(inputs, token_states=False).pooled
        torch.testing.assert_close(pooled, authors_get_delta_by_hand(encoder, inputs, 0))
        encoder.pooler.template_positions = "row"
        same_positions = encoder(inputs, token_states=False).pooled
    # On BERT the two numberings are one; on RoBERTa the authors' puts the template two positions earlier.
    assert torch.allclose(pooled, same_positions) == (model_type == "bert")


def test_the_roberta_recipe_numbers_the_template_pass_as_the_authors_code() -> None:
    recipe = load_recipe(ROBERTA_RECIPE)
    assert recipe.model.template_positions == "from_zero"
    assert load_recipe(REPO / "recipes" / "promptbert-bert-base.yaml").model.template_positions == "row"


def test_the_two_views_use_promptberts_two_templates(tmp_path: Path) -> None:
    encoder = make_tiny_encoder(tmp_path / "tok", pooler="mask_denoised")
    first, second = (encoder.tokenizer.decode(encoder.tokenize(["a dog"], view=v)["input_ids"][0]) for v in (0, 1))
    # The tiny vocabulary has no quote: [unk] stands for it.
    assert first.lower() == "[cls] this sentence of [unk] a dog [unk] means [mask]. [sep]"
    assert second.lower() == "[cls] this sentence [unk] [unk] a dog [unk] means [mask]. [sep]"  # ":" too


def test_gradients_reach_the_model_through_the_template_pass(tmp_path: Path) -> None:
    """As in the authors' code (no --mask_embedding_sentence_delta_freeze), the template pass is not detached."""
    encoder = make_tiny_encoder(tmp_path / "tok", pooler="mask_denoised", initializer_range=0.2)
    encoder.train()
    encoder.backbone.eval()
    inputs = encoder.tokenize(SENTENCES, view=0)
    weight = encoder.backbone.embeddings.word_embeddings.weight
    direction = torch.randn(encoder.dim, generator=torch.Generator().manual_seed(0))  # a LayerNorm output's sum is flat
    (encoder(inputs).pooled @ direction).sum().backward()
    denoised = weight.grad.clone()
    encoder.zero_grad()
    plain = MaskPooler(encoder.pooler.templates)
    plain.bind(encoder.tokenizer)
    states = encoder.backbone(**inputs).last_hidden_state
    (plain((states,), inputs["attention_mask"], inputs["input_ids"]) @ direction).sum().backward()
    mask_row = encoder.tokenizer.mask_token_id
    # The template's own tokens (the [MASK] among them) get gradients from the template pass too.
    assert not torch.allclose(denoised[mask_row], weight.grad[mask_row], atol=1e-6)


def test_test_time_is_the_plain_mask_pooler_and_saves_as_one(tmp_path: Path) -> None:
    encoder = make_tiny_encoder(tmp_path / "tok", pooler="mask_denoised", initializer_range=0.2)
    encoder.eval()
    inputs = encoder.tokenize(SENTENCES, view=0)
    with torch.no_grad():
        states = encoder(inputs).token_states
    mask = (inputs["input_ids"] == encoder.tokenizer.mask_token_id).int().argmax(dim=1)
    torch.testing.assert_close(encoder(inputs).pooled, states[torch.arange(len(SENTENCES)), mask])
    encoder.save(tmp_path / "model")
    meta = json.loads((tmp_path / "model" / "csekit.json").read_text())["representation"]
    assert meta["pooler"] == "mask" and meta["templates"][0] == 'This sentence of "[X]" means [MASK] .'
    reloaded = SentenceEncoder.load(tmp_path / "model")
    assert type(reloaded.pooler) is MaskPooler
    np.testing.assert_allclose(reloaded.encode(SENTENCES), encoder.encode(SENTENCES), atol=1e-5)


def test_an_input_without_its_templates_is_refused(tmp_path: Path) -> None:
    encoder = make_tiny_encoder(tmp_path / "tok", pooler="mask_denoised")
    encoder.train()
    plain = MaskPooler(('Sentence "[X]" is [MASK] .',))
    inputs = plain.tokenize(encoder.tokenizer, ["a dog"], None)
    with pytest.raises(CsekitError, match="without its templates"):
        encoder(inputs)


def test_a_promptbert_recipe_trains(train_tiny: TinyTrainer) -> None:
    run = train_tiny("model.pooler=mask_denoised")
    assert run.result.steps == 3
    assert json.loads((run.folder / "best" / "csekit.json").read_text())["representation"]["pooler"] == "mask"


# --- RoBERTa ------------------------------------------------------------------------------------------

ROBERTA_RECIPE = REPO / "recipes" / "promptbert-roberta-base.yaml"
AUTHORS_ROBERTA_PIECES = {0: ("This sentence : '", " ' means<mask>."), 1: ("The sentence : '", " ' means<mask>.")}
"""What the authors' train.py (L618-641) makes of run.sh unsup-roberta's templates (L80-81): the text before
the sentence (stripped for RoBERTa) and after it, `*mask*` replaced by the tokenizer's mask token."""


def authors_roberta_ids(tokenizer, sentence: str, view: int, max_length: int) -> list[int]:  # type: ignore[no-untyped-def]
    """The authors' prepare_features: encode(bs)[:-1] + encode(s, no specials)[:max_seq_length] + encode(es)[1:]."""
    before, after = AUTHORS_ROBERTA_PIECES[view]
    body = tokenizer.encode(sentence, add_special_tokens=False)[:max_length]
    return tokenizer.encode(before)[:-1] + body + tokenizer.encode(after)[1:]


def test_the_roberta_recipes_templates_give_the_authors_token_ids() -> None:
    texts = ["This sentence : 'a man plays' means.", "The sentence : 'the dog runs' means.", "she eats food"]
    tokenizer = make_byte_level_bpe_tokenizer(texts)
    recipe = load_recipe(ROBERTA_RECIPE)
    pooler = MaskPooler(recipe.model.templates or ())
    pooler.bind(tokenizer)
    sentences = ["a man plays the guitar .", "She eats food", "the dog runs in the park and the man plays"]
    for view in (0, 1):
        ids = pooler.encode_ids(tokenizer, sentences, 6, view=view)["input_ids"]
        assert ids == [authors_roberta_ids(tokenizer, s, view, 6) for s in sentences]
    assert tokenizer.decode(ids[1]) == "<s>The sentence : 'She eats food ' means<mask>.</s>"


def test_a_recipes_templates_reach_the_trained_and_saved_model(train_tiny: TinyTrainer) -> None:
    templates = ["the [X] is [MASK] .", "a [X] means [MASK] ."]
    run = train_tiny("model.pooler=mask_denoised", f"model.templates={json.dumps(templates)}", steps=2)
    meta = json.loads((run.folder / "best" / "csekit.json").read_text())["representation"]
    assert meta["pooler"] == "mask" and meta["templates"] == templates
    reloaded = SentenceEncoder.load(run.folder / "best")
    assert reloaded.pooler.templates == tuple(templates)


@pytest.mark.parametrize(
    ("pooler", "templates", "message"),
    [
        ("cls", "['the [X] is [MASK] .']", "prompt poolers .mask, mask_denoised., not model.pooler cls"),
        ("mask_denoised", "[]", "at least one prompt template"),
        ("mask", "['no sentence here [MASK] .']", "one .X. and one .MASK."),
    ],
)
def test_templates_a_pooler_cannot_use_are_refused_at_their_line(
    tmp_path: Path, pooler: str, templates: str, message: str
) -> None:
    path = tmp_path / "recipe.yaml"
    path.write_text(f"model:\n  backbone: roberta-base\n  pooler: {pooler}\n  templates: {templates}\n")
    with pytest.raises(CsekitError, match=rf"^{path}:4: recipe key model.templates: .*{message}"):
        load_recipe(path)


def test_templates_for_a_pooler_without_them_are_refused_on_load(tiny_model_dir: Path) -> None:
    with pytest.raises(CsekitError, match="prompt templates are for the prompt poolers"):
        SentenceEncoder.load(tiny_model_dir, "cls", reading=Reading(templates=("the [X] is [MASK] .",)))

"""SimCSE's MLM auxiliary objective: loss and gradients equal a reference written from princeton-nlp/SimCSE
(train.py's collator `mask_tokens`, simcse/models.py `cl_forward` with `do_mlm`); the LM head is the checkpoint's,
untied; a recipe trains with it and saves the encoder without the head."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from conftest import DISTINCT_SENTENCES, TinyTrainer, make_tiny_encoder, make_tiny_mlm
from mlm_reference import authors_mask_tokens
from part_checks import assert_same_gradients, gradients
from safetensors.torch import load_file
from torch import nn
from transformers import BertForMaskedLM

from csekit.core.errors import CsekitError
from csekit.encoding.encoder import SentenceEncoder
from csekit.parts.objectives import OBJECTIVES
from csekit.parts.objectives.mlm import MaskedLanguageModeling
from csekit.parts.step_state import StepState
from csekit.parts.views.repetition import batch_generator

SENTENCES = DISTINCT_SENTENCES[:4]


def test_mlm_loss_and_gradients_equal_simcses_computation(tmp_path: Path) -> None:
    assert OBJECTIVES.get("mlm") is MaskedLanguageModeling
    folder = make_tiny_mlm(tmp_path / "mlm", initializer_range=0.2)  # a checkpoint with its LM head
    encoder = SentenceEncoder.load(folder, "cls")
    objective = MaskedLanguageModeling(encoder, encoder.tokenizer, mask_ratio=0.15)
    encoder.eval(), objective.eval()  # no dropout on either side
    tokenizer = encoder.tokenizer
    pretrained = BertForMaskedLM.from_pretrained(folder)
    # The code: BertForCL's own BertModel, and lm_head = BertLMPredictionHead loaded from cls.predictions.
    their_encoder = copy.deepcopy(pretrained.bert).eval()
    lm_head = copy.deepcopy(pretrained.cls.predictions).eval()
    lm_head.decoder.weight = nn.Parameter(lm_head.decoder.weight.detach().clone())  # BertForCL ties nothing
    assert torch.equal(objective.lm_head.predictions.transform.dense.weight, lm_head.transform.dense.weight)
    assert objective.lm_head.predictions.decoder.weight is not encoder.backbone.embeddings.word_embeddings.weight

    inputs = encoder.pooler.tokenize(tokenizer, SENTENCES, 32)
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    n, views = len(SENTENCES), 2
    their_ids = torch.stack([ids] * views, dim=1).view(n * views, -1)
    their_mask = torch.stack([mask] * views, dim=1).view(n * views, -1)
    torch.set_rng_state(batch_generator(0, ["mlm", *SENTENCES]).get_state())
    mlm_input_ids = authors_mask_tokens(their_ids, tokenizer, 0.15)
    torch.set_rng_state(batch_generator(0, ["mlm", *SENTENCES]).get_state())
    labels = their_ids.clone()
    special = torch.isin(labels, torch.tensor(tokenizer.all_special_ids))
    probability = torch.full(labels.shape, 0.15).masked_fill(special, 0.0)
    labels[~torch.bernoulli(probability).bool()] = -100  # the collator's mlm_labels, from the same first draw
    assert (labels != -100).sum() >= 2
    mlm_outputs = their_encoder(mlm_input_ids, attention_mask=their_mask, return_dict=True)
    prediction_scores = lm_head(mlm_outputs.last_hidden_state)
    expected = nn.CrossEntropyLoss()(prediction_scores.view(-1, their_encoder.config.vocab_size), labels.view(-1))
    expected.backward()

    pooled = encoder({"input_ids": torch.cat([ids] * views), "attention_mask": torch.cat([mask] * views)})
    embeddings = list(pooled.pooled.detach().chunk(views))
    state = StepState(list(SENTENCES), embeddings, embeddings, pooled, encoder)
    ours = objective(state)["mlm"]
    ours.backward()

    assert torch.allclose(ours, expected, rtol=1e-6, atol=1e-7), (ours, expected)
    theirs = {f"head.{k}": v for k, v in lm_head.named_parameters()}
    theirs |= {f"encoder.{k}": v for k, v in their_encoder.named_parameters()}
    mine = {f"head.{k.removeprefix('predictions.')}": v for k, v in objective.lm_head.named_parameters()}
    mine |= {f"encoder.{k}": v for k, v in encoder.backbone.named_parameters() if not k.startswith("pooler.")}
    assert assert_same_gradients(mine.items(), gradients(theirs.items()), rtol=1e-4, atol=1e-7) > 20


MLM_BESIDE_INFONCE = "objectives=[{name: infonce}, {name: mlm, weight: 0.1}]"


def test_an_mlm_recipe_trains_and_saves_the_encoder_without_the_lm_head(
    tmp_path: Path, train_tiny: TinyTrainer
) -> None:
    folder = make_tiny_mlm(tmp_path / "mlm", initializer_range=0.2)
    run = train_tiny(MLM_BESIDE_INFONCE, steps=2, model=folder)
    assert run.result.steps == 2
    exported = load_file(next((run.folder / "best").glob("*.safetensors")))
    assert not any("lm_head" in key or "predictions" in key for key in exported)
    assert any("lm_head" in key for key in load_file(run.folder / "checkpoint" / "model.safetensors"))


def test_a_backbone_without_an_lm_head_is_one_line_naming_the_recipe_key(
    tmp_path: Path, train_tiny: TinyTrainer
) -> None:
    model_dir = tmp_path / "opt"
    encoder = make_tiny_encoder(tmp_path / "tok", model_type="opt")
    encoder.tokenizer.eos_token = "[SEP]"  # a decoder needs one (csekit.encoding.decoder)
    encoder.save(model_dir)
    with pytest.raises(CsekitError, match=r"recipe key objectives\[1\]: mlm needs .* model type 'opt'") as caught:
        train_tiny(MLM_BESIDE_INFONCE, steps=1, lines=32, model=model_dir)
    assert "\n" not in str(caught.value)

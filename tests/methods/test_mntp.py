"""MNTP, LLM2Vec's masked next-token prediction (issue 54, items 3 and 6): its loss against a reference computed
here, its masks, its LM head, and MNTP composed with SimCSE in one run and chained before it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import make_corpus, read_metrics
from tiny_decoders import decoder_config, make_decoder_tokenizer, make_tiny_decoder, tiny_decoder_dir

from csekit.core.errors import CsekitError
from csekit.encoding.encoder import SentenceEncoder
from csekit.parts.objectives.mntp import MaskedNextTokenPrediction
from csekit.parts.step_state import StepState
from csekit.training.recipe import load_recipe
from csekit.training.trainer import train

SENTENCES = ["a man plays the guitar slowly .", "the dog runs", "she eats food quickly in the park", "a cat"]


def _tied_decoder() -> SentenceEncoder:
    tokenizer = make_decoder_tokenizer()
    config = decoder_config("llama", len(tokenizer), attention="bidirectional")
    config.tie_word_embeddings = True
    torch.manual_seed(0)
    return SentenceEncoder.from_config(config, tokenizer, "mean").eval()


def test_the_mntp_loss_equals_a_reference_computation() -> None:
    encoder = _tied_decoder()
    objective = MaskedNextTokenPrediction(encoder, encoder.tokenizer, probability=0.4)
    inputs = encoder.tokenize(SENTENCES)
    output = encoder(inputs)
    state = StepState(list(SENTENCES), [output.pooled], [output.pooled], output, encoder)
    torch.manual_seed(11)
    masked_ids, masked = objective.mask(inputs["input_ids"], inputs["attention_mask"])
    torch.manual_seed(11)
    loss = objective(state)["mntp"]

    # The reference: the backbone on the masked ids, and for every masked token i the log-probability of the
    # original token under the LM head (here the tied input embeddings) at position i - 1.
    ids, attention = inputs["input_ids"], inputs["attention_mask"]
    underscore = encoder.tokenizer.convert_tokens_to_ids("_")
    assert masked.any() and (masked_ids[masked] == underscore).all() and torch.equal(masked_ids[~masked], ids[~masked])
    assert not masked[:, 0].any() and not masked[attention == 0].any()  # <s> and padding are never masked
    with torch.no_grad():
        states = encoder.backbone(input_ids=masked_ids, attention_mask=attention).last_hidden_state
        weight = encoder.backbone.get_input_embeddings().weight
        terms = [
            -torch.log_softmax(states[row, i - 1] @ weight.T, dim=-1)[ids[row, i]]
            for row in range(ids.shape[0])
            for i in range(1, ids.shape[1])
            if masked[row, i]
        ]
    torch.testing.assert_close(loss.detach(), torch.stack(terms).mean(), rtol=1e-5, atol=1e-6)
    loss.backward()
    assert encoder.backbone.get_input_embeddings().weight.grad is not None


def test_masks_take_the_probability_of_real_tokens() -> None:
    encoder = _tied_decoder()
    objective = MaskedNextTokenPrediction(encoder, encoder.tokenizer, probability=0.2)
    inputs = encoder.tokenize(SENTENCES * 200)
    torch.manual_seed(0)
    _, masked = objective.mask(inputs["input_ids"], inputs["attention_mask"])
    real = int(inputs["attention_mask"].sum()) - inputs["input_ids"].shape[0]  # less each row's <s>
    assert abs(int(masked.sum()) / real - 0.2) < 0.02


def test_an_untied_lm_head_comes_from_the_checkpoint(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    tokenizer = make_decoder_tokenizer()
    torch.manual_seed(1)
    lm = AutoModelForCausalLM.from_config(decoder_config("mistral", len(tokenizer)))
    assert not lm.config.tie_word_embeddings
    lm.save_pretrained(tmp_path / "lm")
    tokenizer.save_pretrained(tmp_path / "lm")
    encoder = SentenceEncoder.load(tmp_path / "lm", "mean", attention="bidirectional")
    objective = MaskedNextTokenPrediction(encoder, encoder.tokenizer)
    assert torch.equal(objective.output_weight(), lm.lm_head.weight)
    assert objective.lm_head.weight.requires_grad  # it trains, as LLM2Vec's (train_lm_head: false freezes it)
    assert not MaskedNextTokenPrediction(encoder, encoder.tokenizer, train_lm_head=False).lm_head.weight.requires_grad
    # A folder csekit saved (the encoder alone) has no LM head to predict with: one line, not a random head.
    saved = tiny_decoder_dir(tmp_path / "encoder-only", "llama")
    with pytest.raises(CsekitError, match=r"lm_head\.weight"):
        MaskedNextTokenPrediction(SentenceEncoder.load(saved), make_decoder_tokenizer())


def _recipe(tmp_path: Path, model: Path, *objectives: str) -> Path:
    corpus = make_corpus(tmp_path / "corpus.txt", lines=32)
    path = tmp_path / f"{len(list(tmp_path.glob('*.yaml')))}.yaml"
    path.write_text(
        f'model: {{backbone: "{model}", pooler: mean, attention: bidirectional, max_length: 16}}\n'
        f'data: {{corpus: "{corpus}"}}\n'
        "train: {batch_size: 8, lr: 1.0e-3, max_steps: 2, eval_every: 0, log_every: 1, dev_task: none,\n"
        "        precision: fp32}\n"
        "objectives:\n" + "".join(f"  - {spec}\n" for spec in objectives),
        encoding="utf-8",
    )
    return path


def test_mntp_composes_with_simcse_in_one_run_and_chains_before_it(tmp_path: Path) -> None:
    encoder = make_tiny_decoder("gemma")  # Gemma ties its LM head to the input embeddings
    assert encoder.backbone.config.tie_word_embeddings
    encoder.save(tmp_path / "model")
    both = _recipe(tmp_path, tmp_path / "model", "{name: infonce, temperature: 0.05}", "{name: mntp, weight: 0.5}")
    train(load_recipe(both), tmp_path / "both", show_progress=False)
    steps = [r for r in read_metrics(tmp_path / "both") if "mntp" in r.get("losses", r)]
    assert steps, read_metrics(tmp_path / "both")[:3]
    # Two runs: MNTP alone, then SimCSE from the model it saved.
    alone = _recipe(tmp_path, tmp_path / "model", "{name: mntp}")
    train(load_recipe(alone), tmp_path / "adapted", show_progress=False)
    simcse = _recipe(tmp_path, tmp_path / "adapted" / "last", "{name: infonce, temperature: 0.05}")
    train(load_recipe(simcse), tmp_path / "simcse", show_progress=False)
    card = json.loads((tmp_path / "simcse" / "last" / "config.json").read_text())
    assert card["is_causal"] is False

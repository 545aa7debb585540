"""Decoder LLM backbones (issue 54, items 1 and 6): bidirectional attention, padding on either side, the missing pad
token, the decoder poolers, gradient checkpointing, and a tiny decoder trained, evaluated and exported by the CLI.

Every model here is a tiny random decoder built from a config (tests/tiny_decoders.py): no decoder LLM weights
can be downloaded on this machine.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import add_sick_trial, make_corpus, make_data_dir, run_cli
from tiny_decoders import DECODER_TYPES, decoder_config, make_decoder_tokenizer, make_tiny_decoder, tiny_decoder_dir

from csekit.core.errors import CsekitError
from csekit.encoding.encoder import SentenceEncoder
from csekit.training.execution import enable_gradient_checkpointing
from csekit.training.recipe import load_recipe

SENTENCES = ["a man plays the guitar slowly", "the dog", "she eats food quickly .", "a cat"]


def _left_padded(encoder: SentenceEncoder, sentences: list[str]) -> dict[str, torch.Tensor]:
    """The encoder's own ids of `sentences`, padded on the left (as many decoder tokenizers pad)."""
    rows = encoder.pooler.encode_ids(encoder.tokenizer, sentences, None)["input_ids"]
    width, pad = max(len(row) for row in rows), encoder.tokenizer.pad_token_id
    ids = [[pad] * (width - len(row)) + row for row in rows]
    mask = [[0] * (width - len(row)) + [1] * len(row) for row in rows]
    return {"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(mask)}


@pytest.mark.parametrize("model_type", DECODER_TYPES)
def test_a_tokens_state_depends_on_later_tokens_only_under_bidirectional_attention(
    model_type: str, tmp_path: Path
) -> None:
    states = {}
    for attention in ("causal", "bidirectional"):
        encoder = make_tiny_decoder(model_type, attention=attention).eval()
        # Two sentences that differ in their last word only; position 2 ("man") comes before it.
        inputs = encoder.tokenize(["a man plays the guitar", "a man plays the dog"])
        with torch.no_grad():
            output = encoder(inputs).token_states
        states[attention] = (output[0, 2] - output[1, 2]).abs().max().item()
    assert states["causal"] == 0.0 and states["bidirectional"] > 1e-3
    # The saved model keeps its attention (config.json's is_causal), and loading may switch it.
    saved = tiny_decoder_dir(tmp_path / "model", model_type, attention="bidirectional")
    assert json.loads((saved / "config.json").read_text())["is_causal"] is False
    reloaded = SentenceEncoder.load(saved).eval()
    assert all(m.is_causal is False for m in reloaded.backbone.modules() if hasattr(m, "is_causal"))
    causal = SentenceEncoder.load(saved, attention="causal").eval()
    inputs = causal.tokenize(["a man plays the guitar", "a man plays the dog"])
    with torch.no_grad():
        assert torch.equal(causal(inputs).token_states[0, 2], causal(inputs).token_states[1, 2])
        assert not torch.equal(reloaded(inputs).token_states[0, 2], reloaded(inputs).token_states[1, 2])


@pytest.mark.parametrize("attention", ["causal", "bidirectional"])
@pytest.mark.parametrize("pooler", ["mean", "last_token", "weighted_mean"])
def test_pooled_vectors_with_left_and_right_padding_agree(pooler: str, attention: str) -> None:
    encoder = make_tiny_decoder("llama", pooler=pooler, attention=attention).eval()
    right = encoder.tokenize(SENTENCES)
    left = _left_padded(encoder, SENTENCES)
    assert right["attention_mask"][:, -1].tolist() != left["attention_mask"][:, -1].tolist()  # really two layouts
    with torch.no_grad():
        # Not bit for bit: the softmax sums its keys in another order on another CPU's kernels (wrong position
        # ids, the defect this guards, move the vectors by far more).
        torch.testing.assert_close(encoder(left).pooled, encoder(right).pooled, rtol=0, atol=1e-5)
        # And each row as if alone (no padding at all).
        alone = torch.cat([encoder(encoder.tokenize([s])).pooled for s in SENTENCES])
    torch.testing.assert_close(encoder(right).pooled.detach(), alone, rtol=0, atol=1e-5)


def test_a_tokenizer_without_a_pad_token_pads_with_eos(tmp_path: Path) -> None:
    """A plain transformers folder of a decoder whose tokenizer has no pad token (and no [CLS]/[SEP]) loads."""
    from transformers import AutoModel

    tokenizer = make_decoder_tokenizer()
    AutoModel.from_config(decoder_config("llama", len(tokenizer))).save_pretrained(tmp_path / "plain")
    tokenizer.save_pretrained(tmp_path / "plain")
    encoder = SentenceEncoder.load(tmp_path / "plain", "mean")
    assert encoder.tokenizer.pad_token == "</s>" and encoder.tokenizer.padding_side == "right"
    vectors = encoder.encode(SENTENCES)
    assert vectors.shape == (4, 32) and (vectors != 0).any()


def test_the_last_token_pooler_appends_eos_and_keeps_it_when_truncating() -> None:
    encoder = make_tiny_decoder("llama", pooler="last_token")
    eos = encoder.tokenizer.eos_token_id
    ids = encoder.pooler.encode_ids(encoder.tokenizer, ["a man plays the guitar", "a"], 4)
    assert ids["input_ids"][0][-1] == eos and len(ids["input_ids"][0]) == 4
    assert ids["input_ids"][1][-1] == eos and len(ids["input_ids"][1]) == 3  # <s> a </s>
    assert [len(row) for row in ids["attention_mask"]] == [4, 3]


def test_gradient_checkpointing_gives_the_same_gradients() -> None:
    grads = []
    for checkpointing in (False, True):
        encoder = make_tiny_decoder("mistral", attention="bidirectional").train()
        if checkpointing:
            enable_gradient_checkpointing(encoder.backbone)
        encoder(encoder.tokenize(SENTENCES)).pooled.square().sum().backward()
        grads.append({n: p.grad.clone() for n, p in encoder.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, msg=name)


def test_decoder_options_are_checked_with_one_line(tmp_path: Path, tiny_model_dir: Path) -> None:
    with pytest.raises(CsekitError, match=r"recipe key model\.attention must be causal or bidirectional"):
        load_recipe(None, ["model.attention=sideways"])
    with pytest.raises(CsekitError, match=r"model\.attention causal is for decoder LLM backbones"):
        SentenceEncoder.load(tiny_model_dir, attention="causal")


def test_a_tiny_decoder_trains_evaluates_and_exports_through_the_cli(tmp_path: Path) -> None:
    """As a BERT model does: csekit train, csekit evaluate, and the saved folder in sentence-transformers gives
    csekit's embeddings (the bidirectional attention saved in config.json, the weighted_mean pooling)."""
    st = pytest.importorskip("sentence_transformers")
    model = tiny_decoder_dir(tmp_path / "model", "qwen2")
    make_corpus(tmp_path / "corpus.txt", lines=64)
    data = add_sick_trial(make_data_dir(tmp_path / "data"))
    (tmp_path / "recipe.yaml").write_text(
        f"model:\n  backbone: {model}\n  pooler: weighted_mean\n  attention: bidirectional\n  max_length: 16\n"
        "  dropout: 0.3\ndata:\n  corpus: corpus.txt\ntrain:\n  dev_task: sts\n  batch_size: 8\n  max_steps: 3\n"
        "  eval_every: 2\n  precision: fp32\nrun:\n  gradient_checkpointing: true\n",
        encoding="utf-8",
    )
    trained = run_cli("train", "recipe.yaml", "--output", "run", "--no-progress", "--data-dir", str(data), cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr[-2000:]
    best = tmp_path / "run" / "best"
    evaluated = run_cli(
        "evaluate", str(best), "--tasks", "dev", "--data-dir", str(data), "--precision", "fp32", cwd=tmp_path
    )
    assert evaluated.returncode == 0 and "avg_sts" in evaluated.stdout, evaluated.stderr[-2000:]
    config = json.loads((best / "config.json").read_text())
    assert config["is_causal"] is False and config["attention_dropout"] == 0.3
    encoder = SentenceEncoder.load(best)
    assert encoder.pooler.name == "weighted_mean"
    before = SentenceEncoder.load(model)
    assert not torch.equal(encoder.backbone.norm.weight, before.backbone.norm.weight)  # it trained
    loaded = st.SentenceTransformer(str(best), device="cpu")
    torch.testing.assert_close(
        torch.from_numpy(loaded.encode(SENTENCES)), torch.from_numpy(encoder.encode(SENTENCES)), rtol=0, atol=1e-5
    )


@pytest.mark.parametrize("pooler", ["last_token", "mean"])
def test_a_saved_decoder_loads_in_sentence_transformers_with_the_same_embeddings(pooler: str, tmp_path: Path) -> None:
    st = pytest.importorskip("sentence_transformers")
    encoder = make_tiny_decoder("gemma", pooler=pooler, attention="bidirectional")
    encoder.save(tmp_path / "model")
    loaded = st.SentenceTransformer(str(tmp_path / "model"), device="cpu")
    reloaded = SentenceEncoder.load(tmp_path / "model")
    expected = encoder.encode(SENTENCES)
    torch.testing.assert_close(
        torch.from_numpy(loaded.encode(SENTENCES)), torch.from_numpy(expected), rtol=0, atol=1e-5
    )
    torch.testing.assert_close(torch.from_numpy(reloaded.encode(SENTENCES)), torch.from_numpy(expected), rtol=0, atol=0)
    reloaded.save(tmp_path / "again")  # saved twice: the tokenizer appends one EOS, not two
    again = SentenceEncoder.load(tmp_path / "again")
    ids = again.pooler.encode_ids(again.tokenizer, ["a man"], None)["input_ids"][0]
    assert ids.count(again.tokenizer.eos_token_id) == (pooler == "last_token")
    torch.testing.assert_close(torch.from_numpy(again.encode(SENTENCES)), torch.from_numpy(expected), rtol=0, atol=0)

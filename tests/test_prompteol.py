"""PromptEOL's pooler (`prompteol`) equals a transcription of the authors' evaluation batcher on a tiny decoder: the
template's text tokenised whole, the last token's state read; its sentence-end rule; a long sentence is cut, never
the template; a saved prompteol model reloads as one and refuses sentence-transformers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tiny_decoders import DECODER_WORDS, decoder_config
from transformers import PreTrainedTokenizerFast

from csekit.encoding.encoder import SentenceEncoder
from csekit.encoding.pooling import PROMPTEOL_TEMPLATE, LastTokenPooler, PromptEOLPooler
from csekit.encoding.sentence_end import end_sentences

AUTHORS_TEMPLATE = 'This_sentence_:_"*sent_0*"_means_in_one_word:"'
"""kongds/scaling_sentemb's template as its README and run scripts pass it (`--mask_embedding_sentence_template`)."""
TEMPLATE_WORDS = ["This", "sentence", ":", '"', "means", "in", "one", "word"]
SENTENCES = ["a man plays the guitar .", "the dog runs", "she eats food quickly in the big park ."]


def prompt_tokenizer() -> PreTrainedTokenizerFast:
    """The tests' decoder tokenizer (<s> before each text, no pad token) that knows the template's words and splits
    punctuation off words, as a real decoder's tokenizer splits `word:"`."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    words = ["<unk>", "<s>", "</s>", *dict.fromkeys([*DECODER_WORDS, *TEMPLATE_WORDS])]
    backend = Tokenizer(models.WordLevel({token: i for i, token in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation("isolated")]
    )
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>", model_max_length=64
    )
    tokenizer.model_input_names = ["input_ids", "attention_mask"]
    return tokenizer


def prompteol_decoder(model_type: str = "llama") -> SentenceEncoder:
    """A tiny random decoder of `model_type` with the prompteol pooler, in eval mode (as a loaded model is)."""
    torch.manual_seed(0)
    tokenizer = prompt_tokenizer()
    config = decoder_config(model_type, len(tokenizer))
    if model_type == "opt":  # OPT's widths have their own names (the paper's main family)
        config.word_embed_proj_dim, config.ffn_dim = config.hidden_size, config.intermediate_size
    return SentenceEncoder.from_config(config, tokenizer, pooler="prompteol").eval()


def authors_vectors(encoder: SentenceEncoder, sentences: list[str]) -> torch.Tensor:
    """kongds/scaling_sentemb `evaluation.py` L193-223 (its sentence edit left to the sentence-end rule): the
    template's underscores as spaces, each sentence in it, `batch_encode_plus` padded on the left with pad id 0,
    the last layer at the last position."""
    tokenizer = prompt_tokenizer()
    tokenizer.pad_token = "<unk>"  # the authors' `tokenizer.pad_token_id = 0`
    tokenizer.padding_side = "left"
    template = AUTHORS_TEMPLATE.replace("_", " ")
    texts = [template.replace("*sent 0*", s).strip() for s in sentences]
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    with torch.no_grad():
        hidden_states = encoder.backbone(output_hidden_states=True, return_dict=True, **batch).hidden_states
    return hidden_states[-1][:, -1, :]


@pytest.mark.parametrize("model_type", ["llama", "opt"])
def test_prompteol_equals_the_authors_batcher_on_a_tiny_decoder(model_type: str) -> None:
    encoder = prompteol_decoder(model_type)
    assert PROMPTEOL_TEMPLATE.replace("[X]", "*sent 0*") == AUTHORS_TEMPLATE.replace("_", " ")
    ours = torch.from_numpy(encoder.encode(SENTENCES))
    theirs = authors_vectors(encoder, SENTENCES)
    assert ours.shape == theirs.shape == (3, encoder.dim)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(ours[0], ours[1], atol=1e-3)  # the sentences give different vectors
    # not a plain last_token read (which appends EOS after the bare sentence)
    plain = torch.from_numpy(encoder.with_pooler(LastTokenPooler()).encode(SENTENCES))
    assert not torch.allclose(plain, theirs, atol=1e-3)


def test_the_template_is_tokenised_whole_and_its_closing_quote_is_read() -> None:
    encoder = prompteol_decoder()
    tokenizer = encoder.tokenizer
    inputs = encoder.tokenize(SENTENCES[:2])
    first = inputs["input_ids"][0][inputs["attention_mask"][0].bool()].tolist()
    assert tokenizer.convert_ids_to_tokens(first) == (
        ["<s>", "This", "sentence", ":", '"', *SENTENCES[0].split(), '"', "means", "in", "one", "word", ":", '"']
    )
    read = encoder.pooler.read_positions(inputs["attention_mask"], inputs["input_ids"])
    assert read.tolist() == [int(n) - 1 for n in inputs["attention_mask"].sum(dim=1)]
    assert {int(inputs["input_ids"][row, read[row]]) for row in range(2)} == {tokenizer.convert_tokens_to_ids('"')}


def test_a_long_sentence_is_cut_and_the_template_kept() -> None:
    encoder = prompteol_decoder()
    long = " ".join(["the big dog"] * 30)
    ids = encoder.pooler.encode_ids(encoder.tokenizer, [long, "a cat"], None, max_positions=24)["input_ids"]
    assert len(ids[0]) == 24 and len(ids[1]) < 24
    assert ids[0][-7:] == ids[1][-7:]  # `" means in one word:"` whole
    assert ids[0][:5] == ids[1][:5]  # <s> This sentence : "
    cut = encoder.pooler.encode_ids(encoder.tokenizer, ["a man plays the guitar"], 2)["input_ids"][0]
    assert encoder.tokenizer.convert_ids_to_tokens(cut)[5:7] == ["a", "man"] and len(cut) == 5 + 2 + 7


def test_the_prompteol_sentence_end_is_the_authors_edit() -> None:
    """`if s[-1] not in '.?"\\'': s += '.'`, `s.replace('"', "'")`, a final ? made a period (L198-200)."""
    sentences = ["a dog runs", 'she said "yes"', "is it big?", "", "fine."]
    assert end_sentences(sentences, "prompteol") == ["a dog runs.", "she said 'yes'", "is it big.", "", "fine."]


def test_a_saved_prompteol_model_reloads_as_one_and_refuses_sentence_transformers(tmp_path: Path) -> None:
    encoder = prompteol_decoder()
    encoder.save(tmp_path / "model")
    modules = json.loads((tmp_path / "model" / "modules.json").read_text(encoding="utf-8"))
    assert any(entry["type"].endswith("PromptNotExported") for entry in modules)
    reloaded = SentenceEncoder.load(tmp_path / "model")
    assert isinstance(reloaded.pooler, PromptEOLPooler)
    assert reloaded.encode(SENTENCES[:1]) == pytest.approx(encoder.encode(SENTENCES[:1]), abs=1e-6)

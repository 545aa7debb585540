"""Tiny random decoder LLMs (Llama, Mistral, Qwen2, Gemma layouts) and a decoder-style tokenizer, built offline.

No decoder LLM weights can be downloaded here, so every decoder test runs on these: 2 layers, 32 dimensions,
grouped-query attention, and a word-level tokenizer that adds <s> before a sentence (as Llama's does) and has an
EOS token but NO pad token (csekit must pad with EOS, as LLM2Vec does).
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import PreTrainedTokenizerFast

from csekit.encoding.encoder import SentenceEncoder

DECODER_TYPES = ("llama", "mistral", "qwen2", "gemma")
"""The decoder families the tests build (transformers' model types)."""

DECODER_WORDS = """
a the man woman dog cat is are was plays playing runs running sits on in with guitar ball park
house red blue big small and not of to . , ! ? he she it they eats food music quickly slowly _
""".split()


def make_decoder_tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer with <s> (added before each sentence), </s> and <unk>, and no pad token."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {token: i for i, token in enumerate(["<unk>", "<s>", "</s>", *dict.fromkeys(DECODER_WORDS)])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", 1)]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>", model_max_length=64
    )
    tokenizer.model_input_names = ["input_ids", "attention_mask"]
    assert tokenizer.pad_token is None
    return tokenizer


def decoder_config(model_type: str = "llama", vocab_size: int = 64, attention: str = "causal") -> object:
    """A 2-layer, 32-dimension config of `model_type` with grouped-query attention (4 query heads, 2 key heads)."""
    from conftest import tiny_config  # here, not at the top: the benchmarks that read DECODER_WORDS stay light

    attention_heads = {"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8}
    # initializer_range 0.2: vectors that differ between sentences, as a trained model's do
    config = tiny_config(
        model_type, vocab_size, 32, 0.2, **attention_heads, bos_token_id=1, eos_token_id=2, pad_token_id=None
    )
    config.is_causal = attention == "causal"
    return config


def make_tiny_decoder(
    model_type: str = "llama", pooler: str = "mean", attention: str = "causal", seed: int = 0
) -> SentenceEncoder:
    """A random tiny decoder encoder of `model_type` with the decoder tokenizer."""
    torch.manual_seed(seed)
    tokenizer = make_decoder_tokenizer()
    return SentenceEncoder.from_config(decoder_config(model_type, len(tokenizer), attention), tokenizer, pooler=pooler)


def tiny_decoder_dir(folder: Path, model_type: str = "llama", pooler: str = "mean", attention: str = "causal") -> Path:
    """A saved tiny decoder model folder (a recipe's `model.backbone`)."""
    make_tiny_decoder(model_type, pooler, attention).save(folder)
    return folder

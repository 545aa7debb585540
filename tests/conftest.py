"""Shared fixtures: a tiny randomly initialised BERT with its own WordPiece vocabulary (no downloads)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, BertTokenizerFast

from csekit.encoding.encoder import SentenceEncoder

WORDS = """
a the man woman dog cat is are was plays playing runs running sits on in with guitar ball park
house red blue big small and not of to . , ! ? he she it they eats food music quickly slowly
""".split()

REPO = Path(__file__).resolve().parents[1]


def shared_data_dir() -> Path | None:
    """The SentEval data folder: $CSEKIT_DATA, else ../shared/data beside the repository."""
    env = os.environ.get("CSEKIT_DATA")
    candidates = [Path(env)] if env else []
    candidates.append(REPO.parent / "shared" / "data")
    return next((path for path in candidates if (path / "sts").is_dir()), None)


def make_tokenizer(folder: Path) -> BertTokenizerFast:
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, *"abcdefghijklmnopqrstuvwxyz"]
    vocab += [f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz"]
    vocab = list(dict.fromkeys(vocab))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    try:  # transformers >= 5 takes the vocabulary itself
        tokenizer = BertTokenizerFast(vocab={token: i for i, token in enumerate(vocab)}, do_lower_case=True)
    except TypeError:  # transformers 4
        tokenizer = BertTokenizerFast(vocab_file=str(folder / "vocab.txt"), do_lower_case=True)
    assert tokenizer.vocab_size == len(vocab) and tokenizer.unk_token_id not in tokenizer("the dog")["input_ids"]
    return tokenizer


def make_tiny_encoder(
    folder: Path, pooler: str = "cls", seed: int = 0, model_type: str = "bert", initializer_range: float = 0.02
) -> SentenceEncoder:
    """A 2-layer, 32-dimension model of `model_type` (a transformers model type) with the tiny vocabulary.

    `initializer_range` is the weights' standard deviation (transformers' default, 0.02, makes every
    sentence's [CLS] vector almost the same; about 0.2 makes them differ as a trained model's do).
    """
    torch.manual_seed(seed)
    tokenizer = make_tokenizer(folder)
    config = AutoConfig.for_model(
        model_type,
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        pad_token_id=0,  # the tiny vocabulary's [PAD] (RoBERTa's and MPNet's configs default to 1)
        initializer_range=initializer_range,
    )
    return SentenceEncoder.from_config(config, tokenizer, pooler=pooler)


@pytest.fixture
def tiny_encoder(tmp_path: Path) -> SentenceEncoder:
    return make_tiny_encoder(tmp_path / "tokenizer")


@pytest.fixture
def tiny_model_dir(tmp_path: Path) -> Path:
    """A saved tiny model directory, usable as a recipe's `model.backbone`."""
    path = tmp_path / "tiny-model"
    make_tiny_encoder(tmp_path / "tokenizer").save(path)
    return path


@pytest.fixture
def data_dir() -> Path:
    path = shared_data_dir()
    if path is None:
        pytest.skip("SentEval data folder not found (set CSEKIT_DATA)")
    return path


@pytest.fixture
def test_parts() -> Iterator[None]:
    """The objectives of parts_for_tests, registered for this test (kill_once, raise_once, nan_after)."""
    from parts_for_tests import TEST_PARTS

    import csekit
    from csekit.core.registry import OBJECTIVES

    for name, part in TEST_PARTS.items():
        csekit.register_part("objective", name, part)
    yield
    for name in TEST_PARTS:
        OBJECTIVES.unregister(name)

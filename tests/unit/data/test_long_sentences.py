"""Issue 61 item 6: nothing is cut silently. The share of corpus sentences longer than `model.max_length` tokens,
as training tokenises them, equals a count by hand; a large corpus is measured on a fixed-seed sample of a stated
size; the line is a warning above WARNING_SHARE; the start event gets the figures."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from conftest import WORDS, make_tiny_encoder, tiny_recipe
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from csekit.data.corpus import Corpus
from csekit.encoding.encoder import SentenceEncoder
from csekit.training.long_sentences import (
    SAMPLE_SEED,
    WARNING_SHARE,
    LongSentences,
    announce_long_sentences,
    count_cut,
    measure_long_sentences,
    sample_rows,
)
from csekit.training.train_data import TrainData

SOME = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
SENTENCE = st.lists(st.sampled_from(WORDS), min_size=1, max_size=14).map(" ".join)
"""A sentence of the tiny vocabulary's words: each word is one token, so its tokens can be counted by hand."""


@pytest.fixture(scope="module")
def encoders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, SentenceEncoder]:
    folder = tmp_path_factory.mktemp("tokenizer")
    return {pooler: make_tiny_encoder(folder / pooler, pooler=pooler) for pooler in ("cls", "mask")}


def write_corpus(path: Path, sentences: list[str]) -> Corpus:
    path.write_text("\n".join(sentences) + "\n", encoding="utf-8")
    return Corpus(path)


def by_hand(sentences: list[str], max_length: int, pooler: str) -> int:
    """Sentences training cuts, counted by hand: [CLS] and [SEP] count against the bound of a plain pooler; a prompt
    pooler's bound is on the sentence's own tokens (PromptBERT's budget), its template and special tokens on top."""
    extra = 2 if pooler == "cls" else 0
    return sum(len(sentence.split()) + extra > max_length for sentence in sentences)


@SOME
@given(st.lists(SENTENCE, min_size=1, max_size=40), st.integers(min_value=4, max_value=12))
def test_the_share_equals_a_count_by_hand(
    encoders: dict[str, SentenceEncoder], tmp_path: Path, sentences: list[str], max_length: int
) -> None:
    corpus = write_corpus(tmp_path / "corpus.txt", sentences)
    for pooler, encoder in encoders.items():
        found = measure_long_sentences(corpus, encoder.tokenizer, encoder.pooler, max_length)
        expected = by_hand(sentences, max_length, pooler)
        assert (found.longer, found.measured, found.corpus_sentences) == (expected, len(sentences), len(sentences))
        assert found.share == expected / len(sentences) and not found.sampled


def test_a_sentence_one_token_over_the_bound_is_cut_and_one_at_it_is_not(encoders: dict[str, SentenceEncoder]) -> None:
    encoder = encoders["cls"]
    at_bound, over = " ".join(["dog"] * 6), " ".join(["dog"] * 7)  # 8 and 9 tokens with [CLS] and [SEP]
    assert count_cut(encoder.tokenizer, encoder.pooler, [at_bound, over, "a dog"], 8) == 1


def test_a_large_corpus_is_measured_on_a_fixed_seed_sample_of_the_stated_size(
    encoders: dict[str, SentenceEncoder], tmp_path: Path
) -> None:
    rng = random.Random(3)
    sentences = [" ".join(rng.choices(WORDS, k=rng.randint(1, 14))) for _ in range(300)]
    corpus = write_corpus(tmp_path / "corpus.txt", sentences)
    encoder = encoders["cls"]
    found = measure_long_sentences(corpus, encoder.tokenizer, encoder.pooler, 8, sample_size=50)
    rows = sample_rows(300, 50)
    assert rows == sample_rows(300, 50, SAMPLE_SEED) and len(set(rows)) == 50 and rows == sorted(rows)
    assert (found.measured, found.corpus_sentences, found.sampled) == (50, 300, True)
    assert found.longer == by_hand([sentences[row] for row in rows], 8, "cls")
    assert found.line().startswith(f"csekit: warning: {100 * found.share:.1f}% of 50 sampled sentences are longer")
    record = found.record()["long_sentences"]
    assert (record["measured"], record["sampled"], record["sample_seed"], record["corpus_sentences"]) == (
        50,
        True,
        SAMPLE_SEED,
        300,
    )
    assert sample_rows(40, 50) == list(range(40))  # a corpus no larger than the sample: every sentence


def test_the_line_is_a_warning_only_above_the_stated_share() -> None:
    quiet = LongSentences(max_length=32, longer=5, measured=100, corpus_sentences=100)
    loud = LongSentences(max_length=32, longer=6, measured=100, corpus_sentences=100)
    assert WARNING_SHARE == 0.05
    assert quiet.line() == (
        "csekit: 5.0% of the corpus's 100 sentences are longer than model.max_length 32 tokens and are cut"
    )
    assert loud.line().startswith(
        "csekit: warning: 6.0% of the corpus's 100 sentences are longer than model.max_length 32 tokens and are cut "
        "(more than 5%)"
    )
    assert "raise model.max_length" in loud.line()
    assert LongSentences(32, 1234, 2000, 90_000).line().startswith("csekit: warning: 61.7% of 2,000 sampled")


def test_the_run_start_prints_the_line_and_gives_the_start_events_field(
    tmp_path: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What the trainer calls at the start (`announce_long_sentences`): the recipe's bound, corpus and encoder."""
    corpus = tmp_path / "corpus.txt"
    sentences = ["a man plays the guitar", "the dog runs in the park with the red ball and the blue ball", "a cat"]
    corpus.write_text("\n".join(sentences * 6) + "\n", encoding="utf-8")
    recipe = tiny_recipe(tiny_model_dir, corpus, "model.max_length=8")
    data = TrainData.load(recipe, None)
    field: dict[str, Any] = announce_long_sentences(data, SentenceEncoder.load(tiny_model_dir))
    assert capsys.readouterr().err == (
        "csekit: warning: 33.3% of the corpus's 18 sentences are longer than model.max_length 8 tokens and are cut "
        "(more than 5%): training sees their first 8 tokens only; raise model.max_length or split the corpus's "
        "long lines\n"
    )
    assert announce_long_sentences(data, SentenceEncoder.load(tiny_model_dir, "cls"))["long_sentences"]["longer"] == 6
    capsys.readouterr()
    uncut = TrainData.load(tiny_recipe(tiny_model_dir, corpus, "model.max_length=32"), None)
    assert announce_long_sentences(uncut, SentenceEncoder.load(tiny_model_dir))["long_sentences"]["longer"] == 0
    assert capsys.readouterr().err == ""  # nothing is cut: nothing to say (metrics.jsonl still gets the field)
    assert field == {
        "long_sentences": {
            "max_length": 8,
            "share": 0.333333,
            "longer": 6,
            "measured": 18,
            "sampled": False,
            "sample_seed": None,
            "corpus_sentences": 18,
            "warning_above": WARNING_SHARE,
        }
    }

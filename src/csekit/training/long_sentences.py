"""How much of the corpus `model.max_length` cuts: said at the start of a run, never found out afterwards.

Training tokenises each sentence to at most `model.max_length` tokens and drops the rest without a word.
SimCSE's 32 cuts few sentences (3.9% of the STS and SICK sentences the quickstart trains on, with MiniLM's
tokenizer); on a corpus of paragraphs it cuts most of them, and the model learns from their openings only.
At the start of a run the share of corpus sentences longer than the bound is measured with the run's own
tokenizer and pooler (`Pooler.encode_ids`, as the views tokenise a batch: the special tokens counted as
training counts them, a prompt template's tokens left out as PromptBERT's budget leaves them), printed as one
line on stderr and written into metrics.jsonl's start event.

A corpus of more than `SAMPLE_SIZE` sentences is measured on a fixed-seed sample of that many rows (the same
rows every run): the share's standard error is at most 0.7 percentage points (0.3 near 5%), and measuring costs a
fraction of a second, once. Above `WARNING_SHARE` the line is a warning that says what to change.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from csekit.data.corpus import sentence_text
from csekit.training.train_data import TrainData

SAMPLE_SIZE = 5_000
"""Sentences measured at most: a larger corpus is measured on a sample of this many rows."""
SAMPLE_SEED = 0
"""The sample's seed (fixed: every run of a corpus measures the same rows, whatever train.seed is)."""
WARNING_SHARE = 0.05
"""Above this share of cut sentences the line is a warning: a twentieth of the corpus trained on its openings only
is worth a decision (a corpus of sentences cut at the papers' 32 tokens stays well below it)."""
TOKENIZE_CHUNK = 1_000
"""Sentences tokenised at a time (the ids of a chunk are held, not those of the whole sample)."""


@dataclass(frozen=True)
class LongSentences:
    """Of `measured` corpus sentences (all `corpus_sentences`, or a sample), `longer` are cut at `max_length`."""

    max_length: int
    longer: int
    measured: int
    corpus_sentences: int

    @property
    def share(self) -> float:
        return self.longer / self.measured if self.measured else 0.0

    @property
    def sampled(self) -> bool:
        return self.measured < self.corpus_sentences

    @property
    def warns(self) -> bool:
        return self.share > WARNING_SHARE

    def line(self) -> str:
        """The stderr line: `csekit: 12.3% of 2,000 sampled sentences are longer than model.max_length 32 tokens
        and are cut`, a warning with what to do above WARNING_SHARE."""
        what = f"{self.measured:,} sampled sentences" if self.sampled else f"the corpus's {self.measured:,} sentences"
        text = (
            f"{100 * self.share:.1f}% of {what} are longer than model.max_length {self.max_length} tokens and are cut"
        )
        if not self.warns:
            return f"csekit: {text}"
        return (
            f"csekit: warning: {text} (more than {100 * WARNING_SHARE:.0f}%): training sees their first "
            f"{self.max_length} tokens only; raise model.max_length or split the corpus's long lines"
        )

    def record(self) -> dict[str, Any]:
        """The start event's field (metrics.jsonl)."""
        return {
            "long_sentences": {
                "max_length": self.max_length,
                "share": round(self.share, 6),
                "longer": self.longer,
                "measured": self.measured,
                "sampled": self.sampled,
                "sample_seed": SAMPLE_SEED if self.sampled else None,
                "corpus_sentences": self.corpus_sentences,
                "warning_above": WARNING_SHARE,
            }
        }


def sample_rows(rows: int, size: int = SAMPLE_SIZE, seed: int = SAMPLE_SEED) -> list[int]:
    """Every row when there are at most `size`, else `size` distinct rows drawn with `seed`, in corpus order."""
    if rows <= size:
        return list(range(rows))
    return sorted(np.random.default_rng(seed).choice(rows, size=size, replace=False).tolist())


def count_cut(tokenizer: Any, pooler: Any, sentences: Sequence[str], max_length: int) -> int:
    """How many of `sentences` training cuts at `max_length`: those whose ids, as the pooler makes them, grow when
    the bound is one more (whatever the pooler adds around a sentence: special tokens, a template, an end token).

    One pass at `max_length + 1`, and a second at `max_length` for the rows that could have been cut only: ids cut
    at a bound hold at least that many tokens, so a row of `max_length` tokens or fewer at the wider bound was whole.
    """
    longer = 0
    for start in range(0, len(sentences), TOKENIZE_CHUNK):
        chunk = sentences[start : start + TOKENIZE_CHUNK]
        wider = pooler.encode_ids(tokenizer, chunk, max_length + 1)["input_ids"]
        candidates = [row for row, ids in enumerate(wider) if len(ids) > max_length]
        if not candidates:
            continue
        bounded = pooler.encode_ids(tokenizer, [chunk[row] for row in candidates], max_length)["input_ids"]
        longer += sum(len(wider[row]) > len(ids) for row, ids in zip(candidates, bounded, strict=True))
    return longer


def measure_long_sentences(
    corpus: Any,
    tokenizer: Any,
    pooler: Any,
    max_length: int,
    text_column: str = "text",
    sample_size: int = SAMPLE_SIZE,
) -> LongSentences:
    """The share of `corpus`'s sentences (a sample of `sample_size` rows of a larger one) cut at `max_length`."""
    rows = sample_rows(len(corpus), sample_size)
    sentences = [sentence_text(corpus[row], text_column) for row in rows]
    return LongSentences(max_length, count_cut(tokenizer, pooler, sentences, max_length), len(rows), len(corpus))


def announce_long_sentences(data: TrainData, encoder: Any) -> dict[str, Any]:
    """At a run's start: measure the corpus against `model.max_length` with the run's encoder (its tokenizer and
    pooler), print the line on stderr when some sentence is cut (a run that cuts nothing says nothing), and return
    the field to merge into metrics.jsonl's start event (always)."""
    recipe = data.recipe
    found = measure_long_sentences(
        data.corpus, encoder.tokenizer, encoder.pooler, recipe.model.max_length, recipe.data.text_column
    )
    if found.longer:
        print(found.line(), file=sys.stderr)
    return found.record()

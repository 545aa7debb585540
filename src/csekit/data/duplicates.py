"""Repeated sentences in a corpus: counted, dropped, or kept apart in batches (recipe key `data.duplicates`).

In-batch contrastive learning treats every other row of a batch as a negative, so two copies of a
sentence in one batch push the sentence away from itself. Three modes:

* `keep`: the corpus as it is, shuffled (today's behaviour);
* `drop`: the distinct sentences only, each at its first occurrence, in corpus order otherwise;
* `separate`: every copy, but never two copies of a sentence in one global batch
  (`SeparatingSampler`; under several processes a global batch is their shares together).

Sentences are compared by a 64-bit BLAKE2b digest of their text (optionally normalised first:
case, surrounding whitespace, final punctuation); at a million distinct sentences the chance that
two different ones share a digest is about 3e-8.
"""

from __future__ import annotations

import hashlib
import math
import unicodedata
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch.utils.data import Sampler

from csekit.core.errors import CsekitError

DUPLICATE_MODES = ("keep", "drop", "separate")
"""`data.duplicates` choices."""


def normalise_sentence(text: str) -> str:
    """The sentence as a reader compares it: lower case, without surrounding whitespace or final punctuation.

    "A man is playing a guitar" and "a man is playing a guitar ." both become "a man is playing a guitar".
    """
    text = text.strip().casefold()
    end = len(text)
    while end and (text[end - 1].isspace() or unicodedata.category(text[end - 1]).startswith("P")):
        end -= 1
    return text[:end]


def _digest(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")


@dataclass(frozen=True)
class SentenceGroups:
    """Which rows of a corpus hold the same sentence.

    `group_of[row]` numbers the sentence of each row (the same number for every copy); `counts[group]`
    is how many rows hold it and `first_rows[group]` the row of its first occurrence.
    """

    group_of: np.ndarray
    counts: np.ndarray
    first_rows: np.ndarray

    @classmethod
    def of(cls, texts: Iterable[str], normalise: bool = False) -> SentenceGroups:
        keys = np.fromiter(
            (_digest(normalise_sentence(text) if normalise else text) for text in texts), dtype=np.uint64
        )
        _, first_rows, group_of, counts = np.unique(keys, return_index=True, return_inverse=True, return_counts=True)
        return cls(group_of.reshape(-1).astype(np.int64), counts.astype(np.int64), first_rows.astype(np.int64))

    @property
    def rows(self) -> int:
        return len(self.group_of)

    @property
    def distinct(self) -> int:
        return len(self.counts)

    def distinct_rows(self) -> list[int]:
        """The first occurrence of every sentence, in corpus order (what `drop` trains on)."""
        return sorted(self.first_rows.tolist())

    def most_repeated(self) -> tuple[int, int]:
        """(row of its first occurrence, count) of the most repeated sentence; ties go to the earliest."""
        top = int(self.counts.max())
        return int(self.first_rows[self.counts == top].min()), top


def share_of_batches_with_a_duplicate(counts: Sequence[int] | np.ndarray, batch_size: int) -> float:
    """The exact chance that a uniformly random batch of `batch_size` rows holds two copies of a sentence.

    A shuffled epoch's batch is a uniformly random `batch_size`-subset of the rows. It holds no copies
    when its rows come from distinct sentences: e_B(c_1, ..., c_G) of the C(n, B) subsets, where e_B is
    the elementary symmetric polynomial of degree B in the sentences' counts, i.e. the coefficient of
    x^B in prod_g (1 + c_g x). Sentences with the same count c share the factor (1 + c x)^m, whose
    coefficients are C(m, j) c^j; the product is taken in log space, degree by degree up to B.
    """
    counts = np.asarray(counts, dtype=np.int64)
    rows = int(counts.sum())
    if batch_size > rows:
        return 0.0
    degrees = np.arange(batch_size + 1)
    log_product = np.full(batch_size + 1, -np.inf)
    log_product[0] = 0.0
    values, multiplicities = np.unique(counts, return_counts=True)
    for count, groups in zip(values.tolist(), multiplicities.tolist(), strict=True):
        log_factor = np.full(batch_size + 1, -np.inf)
        usable = degrees <= groups
        j = degrees[usable]
        log_factor[usable] = _log_binomial(groups, j) + j * math.log(count)
        log_product = _log_polynomial_product(log_product, log_factor)
    log_none = log_product[batch_size] - _log_binomial(rows, np.array([batch_size]))[0]
    return min(1.0, max(0.0, float(-np.expm1(log_none)))) if np.isfinite(log_none) else 1.0


def _log_binomial(n: int, k: np.ndarray) -> np.ndarray:
    """log C(n, k) for each k in 0..n."""
    return np.array([math.lgamma(n + 1) - math.lgamma(j + 1) - math.lgamma(n - j + 1) for j in k.tolist()])


def _log_polynomial_product(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """log coefficients of the product of two polynomials given by log coefficients, cut at a's degree."""
    size = len(a)
    shift = np.arange(size)[None, :] - np.arange(size)[:, None]  # [i, k] -> k - i
    terms = np.where(shift >= 0, a[:, None] + b[np.clip(shift, 0, None)], -np.inf)
    top = terms.max(axis=0)
    finite = np.isfinite(top)
    out = np.full(size, -np.inf)
    with np.errstate(invalid="ignore"):
        out[finite] = top[finite] + np.log(np.exp(terms[:, finite] - top[finite]).sum(axis=0))
    return out


@dataclass(frozen=True)
class DuplicateReport:
    """What a run found in its corpus, for the log and metrics.jsonl's start event."""

    mode: str
    normalise: bool
    sentences: int
    distinct: int
    most_repeated: str
    most_repeated_count: int
    batch_size: int
    share_with_duplicate_under_keep: float
    training_rows: int

    @classmethod
    def of(
        cls, groups: SentenceGroups, most_repeated: str, mode: str, normalise: bool, batch_size: int
    ) -> DuplicateReport:
        _, top = groups.most_repeated()
        return cls(
            mode=mode,
            normalise=normalise,
            sentences=groups.rows,
            distinct=groups.distinct,
            most_repeated=most_repeated,
            most_repeated_count=top,
            batch_size=batch_size,
            share_with_duplicate_under_keep=share_of_batches_with_a_duplicate(groups.counts, batch_size),
            training_rows=groups.distinct if mode == "drop" else groups.rows,
        )

    def record(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def summary(self) -> str:
        compared = " after normalisation" if self.normalise else ""
        if self.distinct == self.sentences:
            return f"duplicates: none among {self.sentences:,} sentences{compared} (data.duplicates: {self.mode})"
        shown = self.most_repeated if len(self.most_repeated) <= 80 else self.most_repeated[:77] + "..."
        text = (
            f"duplicates: {self.distinct:,} distinct sentences among {self.sentences:,}{compared}; the most repeated "
            f"({self.most_repeated_count:,} times): {shown!r}; under keep, "
            f"{100 * self.share_with_duplicate_under_keep:.1f}% of random batches of {self.batch_size} hold a "
            f"duplicate pair"
        )
        if self.mode == "drop":
            return text + f"; data.duplicates: drop trains on the {self.distinct:,} distinct sentences"
        if self.mode == "separate":
            return text + "; data.duplicates: separate keeps every copy, never two in one batch"
        return text + " (data.duplicates: keep)"


def check_separable(groups: SentenceGroups, batch_size: int, processes: int, corpus: str, sentence: str) -> None:
    """Refuse, up front, a corpus whose copies cannot be spread over an epoch's batches one per batch.

    An epoch has floor(n / B) batches; a sentence with more copies than that must put two in one batch.
    With at most that many copies `SeparatingSampler`'s construction always succeeds.
    """
    batches = groups.rows // batch_size
    _, top = groups.most_repeated()
    if top <= batches:
        return
    largest = groups.rows // top // processes * processes
    smaller = f"train.batch_size: {largest} or less, " if largest >= processes else ""
    shown = sentence if len(sentence) <= 60 else sentence[:57] + "..."
    raise CsekitError(
        f"data.duplicates: separate cannot keep apart the {top:,} copies of {shown!r} in corpus {corpus}: an "
        f"epoch has only {batches:,} batches of {batch_size} (one copy each); use {smaller}data.duplicates: drop, "
        f"or remove copies from the corpus"
    )


class SeparatingSampler(Sampler[int]):
    """An epoch's row order whose every run of `batch_size` rows (a global batch) holds distinct sentences.

    The construction: the rows in a random order that keeps every sentence's copies next to each
    other, cut to the epoch's `batches * batch_size` rows and dealt round robin into the batches
    (position p goes to batch p mod batches). A sentence's copies are consecutive positions, at most
    `batches` of them (`check_separable`), so they fall into different batches. The batches are then
    shuffled, and the rows within each, so that copies neither follow each other nor sit at a fixed
    place in the batch. The order depends only on the seed and the epoch (`set_epoch`): the same on
    every process and after `--resume`. Under several processes the DataLoader's batches of
    `batch_size / processes` rows are the processes' shares, P consecutive ones one global batch.
    """

    def __init__(self, groups: SentenceGroups, batch_size: int, seed: int) -> None:
        self.groups = groups
        self.batch_size = batch_size
        self.batches = groups.rows // batch_size
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.batches * self.batch_size

    def epoch_batches(self) -> np.ndarray:
        """This epoch's batches of row indices, [batches, batch_size]."""
        rng = np.random.default_rng([self.seed, self.epoch])
        group_of = self.groups.group_of
        group_rank = rng.permutation(self.groups.distinct)
        shuffled_rows = rng.permutation(self.groups.rows)
        together = shuffled_rows[np.argsort(group_rank[group_of[shuffled_rows]], kind="stable")]
        dealt = together[: len(self)].reshape(self.batch_size, self.batches).T
        return rng.permuted(dealt[rng.permutation(self.batches)], axis=1)

    def __iter__(self) -> Iterator[int]:
        return iter(self.epoch_batches().reshape(-1).tolist())

"""Alignment and uniformity (Wang and Isola 2020), as the SimCSE-family papers plot them.

Both are computed on L2-normalised embeddings: alignment is the mean squared distance between
positive pairs (STS-B dev pairs with a gold score of at least 4), uniformity the log of the mean
Gaussian potential exp(-2 ||x - y||^2) over all pairs of distinct sentences. Lower is better for both.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from csekit.evaluation.result import ALIGN_SCORES, ALIGN_TASK
from csekit.evaluation.sts_data import load_sts_task
from csekit.evaluation.task_set import TaskSet
from csekit.evaluation.tasks import StsSubset

Encoder = Callable[[list[str]], np.ndarray]

POSITIVE_THRESHOLD = 4.0


def _normalise(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.where(norms == 0, 1.0, norms)


def alignment(x: np.ndarray, y: np.ndarray) -> float:
    """E ||f(x) - f(x+)||^2 over the rows of `x` and `y` (positive pairs), after L2 normalisation."""
    if len(x) == 0:
        return float("nan")
    return float(np.mean(np.sum((_normalise(x) - _normalise(y)) ** 2, axis=1)))


def uniformity(x: np.ndarray, t: float = 2.0, block: int = 2048) -> float:
    """log E exp(-t ||f(x) - f(y)||^2) over all pairs i < j of rows, after L2 normalisation.

    Computed blockwise with log-sum-exp, so thousands of sentences need little memory.
    """
    from scipy.special import logsumexp  # here: choosing dev tasks (a recipe's check) imports no scipy

    z = _normalise(x)
    n = len(z)
    if n < 2:
        return float("nan")
    parts = []
    for start in range(0, n, block):
        rows = z[start : start + block]
        # squared distance of unit vectors: 2 - 2 cos; keep only columns j > i
        sq = np.maximum(2.0 - 2.0 * rows @ z.T, 0.0)
        i = np.arange(start, start + len(rows))[:, None]
        mask = np.arange(n)[None, :] > i
        if mask.any():
            parts.append(logsumexp(-t * sq[mask]))
    pairs = n * (n - 1) / 2
    return float(logsumexp(parts) - np.log(pairs))


def positive_pairs(subset: StsSubset, threshold: float = POSITIVE_THRESHOLD) -> list[tuple[str, str]]:
    """The pairs that count as positives for alignment: gold score >= `threshold`."""
    return [
        (a, b) for a, b, y in zip(subset.sentences1, subset.sentences2, subset.scores, strict=True) if y >= threshold
    ]


def align_uniform_from_embeddings(index: dict[str, int], emb: np.ndarray, subset: StsSubset) -> dict[str, float]:
    """Alignment over the subset's positive pairs and uniformity over its distinct sentences."""
    pairs = positive_pairs(subset)
    u = emb[[index[a] for a, _ in pairs]] if pairs else np.zeros((0, emb.shape[1]))
    v = emb[[index[b] for _, b in pairs]] if pairs else np.zeros((0, emb.shape[1]))
    distinct = list(dict.fromkeys([*subset.sentences1, *subset.sentences2]))
    return {"align": alignment(u, v), "uniform": uniformity(emb[[index[s] for s in distinct]])}


@dataclass(frozen=True)
class AlignTask:
    """Alignment and uniformity on a dev split (STS-B dev by default; a training's first dev split), task `align`:
    two distances, lower is better, never selected on. It reads what the split's `StsTask` reads (one read)."""

    split: str = "stsb-dev"

    @property
    def name(self) -> str:
        return ALIGN_TASK

    @property
    def kind(self) -> str:
        return "align"

    @property
    def source(self) -> Hashable:
        return ("sts", self.split)

    @property
    def selectable(self) -> tuple[str, ...]:
        return ()

    def read(self, data_dir: str | Path | None) -> list[StsSubset]:
        return load_sts_task(data_dir, self.split)

    def sentences(self, data: list[StsSubset]) -> list[str]:
        return [*data[0].sentences1, *data[0].sentences2]

    def score(self, data: list[StsSubset], encode: Encoder, encode_raw: Encoder) -> dict[str, float]:
        """Alignment and uniformity of the split's first subset: one encode call on its distinct sentences."""
        subset = data[0]
        sentences = list(dict.fromkeys([*subset.sentences1, *subset.sentences2]))
        emb = np.asarray(encode(sentences), dtype=np.float32)
        return align_uniform_from_embeddings({s: i for i, s in enumerate(sentences)}, emb, subset)

    def primary(self, data: list[StsSubset]) -> str:
        return ALIGN_SCORES[0]


def evaluate_align_uniform(encode: Encoder, data_dir: str | Path | None, task: str = "stsb-dev") -> dict[str, float]:
    """Alignment and uniformity of a model on STS-B dev (or SICK trial): one encode call."""
    return TaskSet([AlignTask(task)]).run(encode, data_dir).tasks[ALIGN_TASK]


def pairwise_cosines(x: np.ndarray) -> np.ndarray:
    """Cosine similarity of every pair i < j of rows (the in-batch negatives' similarities of DCLR's Figure 1)."""
    z = _normalise(x)
    sims = z @ z.T
    return sims[np.triu_indices(len(z), k=1)]


def sample_sentences(sentences: Sequence[str], k: int, seed: int = 0) -> list[str]:
    """A reproducible sample of `k` sentences (all when there are fewer)."""
    if len(sentences) <= k:
        return list(sentences)
    rng = np.random.default_rng(seed)
    return [sentences[i] for i in sorted(rng.choice(len(sentences), size=k, replace=False))]

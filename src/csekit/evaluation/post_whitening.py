"""BERT-whitening (Su et al. 2021): a training-free post-processing baseline for any encoder.

The kernel and bias come from the evaluation sentences themselves: mu is their mean embedding,
U S V = SVD(cov), W = U sqrt(S^-1), and an embedding x becomes (x - mu) W[:, :K]. The whitened
embeddings have identity covariance, which removes the anisotropy that makes raw cosines uninformative.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from csekit.core.errors import CsekitError

Encoder = Callable[[list[str]], np.ndarray]


def whitening_transform(emb: np.ndarray, dim: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Kernel W [d, K] and bias -mu [1, d] of Su et al.'s `compute_kernel_bias` (float64).

    Directions with (numerically) zero variance cannot be whitened; they are dropped, so K never
    exceeds the rank of the covariance (fewer sentences than dimensions give a smaller K).
    """
    x = np.asarray(emb, dtype=np.float64)
    if x.ndim != 2 or len(x) < 2:
        raise CsekitError(f"whitening needs at least 2 embeddings, got {len(x)}")
    if dim is not None and dim < 1:
        raise CsekitError(f"--whiten-dim must be at least 1, got {dim}")
    mu = x.mean(axis=0, keepdims=True)
    cov = np.cov(x.T)
    u, s, _ = np.linalg.svd(cov)
    rank = int(np.sum(s > s[0] * 1e-10)) if s[0] > 0 else 0
    if rank == 0:
        raise CsekitError("whitening: all embeddings are identical (zero covariance)")
    keep = rank if dim is None else min(dim, rank)
    kernel = u[:, :keep] / np.sqrt(s[:keep])[None, :]
    return kernel, -mu


def apply_whitening(emb: np.ndarray, kernel: np.ndarray, bias: np.ndarray) -> np.ndarray:
    return ((np.asarray(emb, dtype=np.float64) + bias) @ kernel).astype(np.float32)


def whiten(emb: np.ndarray, dim: int | None = None) -> np.ndarray:
    """Whiten a set of embeddings with statistics from the set itself."""
    kernel, bias = whitening_transform(emb, dim)
    return apply_whitening(emb, kernel, bias)


def whitened(encode: Encoder, dim: int | None = None) -> Encoder:
    """An encoder whose every call whitens its output with statistics of that call's (distinct) sentences.

    Evaluations call their encoder once on all their distinct sentences, so the kernel is computed
    from exactly the evaluation's sentences, as in the paper.
    """

    def encode_whitened(sentences: list[str]) -> np.ndarray:
        unique = list(dict.fromkeys(sentences))
        emb = np.asarray(encode(unique), dtype=np.float32)
        out = whiten(emb, dim)
        position = {s: i for i, s in enumerate(unique)}
        return out[[position[s] for s in sentences]]

    return encode_whitened

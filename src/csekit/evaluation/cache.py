"""An embedding cache, so that one evaluation run encodes every distinct sentence once."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

Encoder = Callable[[list[str]], np.ndarray]


class EmbeddingCache:
    """Wraps an encoder: `prefetch` encodes all sentences of a run in one call, later calls read rows.

    Each task of a `TaskSet` makes its own encode call; in front of them this cache makes the model run once per
    run, on the union of their sentences.
    """

    def __init__(self, encode: Encoder) -> None:
        self._encode = encode
        self._rows: dict[str, np.ndarray] = {}
        self.calls = 0

    def prefetch(self, sentences: Iterable[str]) -> None:
        missing = [s for s in dict.fromkeys(sentences) if s not in self._rows]
        if missing:
            self.calls += 1
            emb = np.asarray(self._encode(missing), dtype=np.float32)
            if emb.ndim != 2 or emb.shape[0] != len(missing):
                raise ValueError(
                    f"encode returned shape {emb.shape} for {len(missing)} sentences; expected one row each"
                )
            self._rows.update(zip(missing, emb, strict=True))

    def __call__(self, sentences: list[str]) -> np.ndarray:
        self.prefetch(sentences)
        if not sentences:
            return np.zeros((0, 0), dtype=np.float32)
        return np.stack([self._rows[s] for s in sentences])

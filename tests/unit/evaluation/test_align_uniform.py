"""Alignment/uniformity against hand computations, whitening, the embedding cache and the training log."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from conftest import TinyTrainer, make_data_dir

from csekit.core.errors import CsekitError
from csekit.evaluation.alignment import alignment, evaluate_align_uniform, pairwise_cosines, uniformity
from csekit.evaluation.cache import EmbeddingCache
from csekit.evaluation.post_whitening import whiten, whitened, whitening_transform
from csekit.evaluation.sts import evaluate_dev


def test_alignment_by_hand() -> None:
    x = np.array([[3.0, 4.0], [1.0, 0.0]])  # normalised: (0.6, 0.8), (1, 0)
    y = np.array([[0.0, 2.0], [1.0, 0.0]])  # normalised: (0, 1), (1, 0)
    # pair 1: (0.6)^2 + (0.2)^2 = 0.4; pair 2: 0 -> mean 0.2
    assert alignment(x, y) == pytest.approx(0.2)


def test_uniformity_by_hand() -> None:
    x = np.array([[1.0, 0.0], [0.0, 5.0], [-2.0, 0.0]])
    # unit vectors e1, e2, -e1: squared distances 2, 4, 2 over the 3 pairs
    expected = math.log((math.exp(-4) + math.exp(-8) + math.exp(-4)) / 3)
    assert uniformity(x) == pytest.approx(expected)
    assert uniformity(x, block=1) == pytest.approx(expected)  # the blockwise path gives the same number


def test_uniformity_blockwise_equals_dense() -> None:
    x = np.random.default_rng(0).standard_normal((50, 6))
    z = x / np.linalg.norm(x, axis=1, keepdims=True)
    sq = ((z[:, None, :] - z[None, :, :]) ** 2).sum(-1)
    dense = math.log(np.exp(-2 * sq[np.triu_indices(50, 1)]).mean())
    assert uniformity(x, block=7) == pytest.approx(dense)
    assert len(pairwise_cosines(x)) == 50 * 49 // 2


def make_dev(root: Path) -> Path:
    folder = root / "sts" / "STSBenchmark"
    folder.mkdir(parents=True)
    rows = [
        ("a dog runs", "a dog is running", 4.5),
        ("a cat sits", "a cat is sitting", 4.0),
        ("a man eats", "the sky is blue", 0.5),
        ("a dog runs", "a man eats", 1.0),
    ]
    lines = [f"g\tx\ty\t{i}\t{s}\t{a}\t{b}" for i, (a, b, s) in enumerate(rows)]
    (folder / "sts-dev.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


VECTORS = {
    "a dog runs": [1.0, 0.0],
    "a dog is running": [1.0, 1.0],
    "a cat sits": [0.0, 1.0],
    "a cat is sitting": [0.0, 2.0],
    "a man eats": [-1.0, 0.0],
    "the sky is blue": [0.0, -1.0],
}


def table_encoder(sentences: list[str]) -> np.ndarray:
    return np.array([VECTORS[s] for s in sentences], dtype=np.float32)


def test_align_uniform_on_dev_split(tmp_path: Path) -> None:
    data = make_dev(tmp_path)
    result = evaluate_align_uniform(table_encoder, data)
    # positives (gold >= 4): (e1, (1,1)/sqrt2) -> 2 - sqrt2 ; (e2, e2) -> 0
    assert result["align"] == pytest.approx((2 - math.sqrt(2)) / 2)
    unit = {s: np.array(v) / np.linalg.norm(v) for s, v in VECTORS.items()}
    names = list(VECTORS)  # the 6 distinct dev sentences
    pots = [math.exp(-2 * float(((unit[a] - unit[b]) ** 2).sum())) for i, a in enumerate(names) for b in names[i + 1 :]]
    assert result["uniform"] == pytest.approx(math.log(np.mean(pots)))
    # the training dev record: Spearman and align/uniform from one encode call
    calls: list[int] = []

    def counting(sentences: list[str]) -> np.ndarray:
        calls.append(len(sentences))
        return table_encoder(sentences)

    dev = evaluate_dev(counting, data, "stsb-dev", align_uniform=True)
    assert calls == [6] and set(dev) == {"stsb-dev", "align", "uniform"}
    assert dev["align"] == pytest.approx(result["align"]) and dev["uniform"] == pytest.approx(result["uniform"])


def test_whitening_gives_identity_covariance() -> None:
    rng = np.random.default_rng(0)
    # anisotropic embeddings: a shared offset and very different scales per direction
    emb = rng.standard_normal((500, 8)) @ np.diag([10, 5, 3, 1, 0.5, 0.2, 0.1, 0.05]) + 7.0
    emb = emb @ np.linalg.qr(rng.standard_normal((8, 8)))[0]
    out = whiten(emb.astype(np.float32))
    assert np.allclose(out.mean(axis=0), 0, atol=1e-4)
    assert np.allclose(np.cov(out.T.astype(np.float64)), np.eye(8), atol=1e-3)
    assert not np.allclose(np.cov(emb.T), np.eye(8), atol=0.5)
    kernel, bias = whitening_transform(emb, dim=3)
    assert kernel.shape == (8, 3) and bias.shape == (1, 8)
    assert np.allclose(np.cov(whiten(emb, 3).T.astype(np.float64)), np.eye(3), atol=1e-3)
    # fewer sentences than dimensions: only the rank can be whitened
    assert whiten(emb[:4]).shape == (4, 3)
    with pytest.raises(CsekitError, match="identical"):
        whiten(np.ones((5, 3)))


def test_whitened_encoder_uses_the_evaluation_sentences() -> None:
    rng = np.random.default_rng(1)
    table = {f"s{i}": rng.standard_normal(4) * [5, 1, 1, 0.2] for i in range(40)}
    encode = whitened(lambda ss: np.array([table[s] for s in ss]))
    sentences = [f"s{i}" for i in range(40)] + ["s0"]  # a duplicate does not count twice in the statistics
    out = encode(sentences)
    assert np.allclose(np.cov(out[:40].T.astype(np.float64)), np.eye(4), atol=1e-3)
    assert np.array_equal(out[0], out[40])


def test_cache_encodes_once() -> None:
    calls: list[list[str]] = []

    def encode(sentences: list[str]) -> np.ndarray:
        calls.append(sentences)
        return np.array([[len(s), 1.0] for s in sentences], dtype=np.float32)

    cache = EmbeddingCache(encode)
    cache.prefetch(["a", "bb", "a"])
    assert cache(["bb", "a"]).tolist() == [[2.0, 1.0], [1.0, 1.0]]
    assert calls == [["a", "bb"]]
    cache(["ccc"])
    assert calls[-1] == ["ccc"] and cache.calls == 2


def test_training_logs_align_uniform(tmp_path: Path, train_tiny: TinyTrainer) -> None:
    run = train_tiny("train.dev_task=stsb-dev", steps=2, eval_every=1, data_dir=make_data_dir(tmp_path / "data"))
    evaluations = [r for r in run.metrics if "stsb-dev" in r]
    assert [r["step"] for r in evaluations] == [0, 1, 2]  # 0: the starting model
    for record in evaluations:
        assert 0 <= record["align"] <= 4 and -4 <= record["uniform"] <= 0

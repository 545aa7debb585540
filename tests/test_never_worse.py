"""A run never ends worse on its selection metric than the model it started from (issue 61 items 1 and 2).

The starting model is scored at step 0 and kept in best/ until an evaluated step beats it. The decisive case is
built so that no step can beat the start: a pairs dev file whose gold scores are the starting model's own cosine
similarities, so the start's Spearman is 1.0, the highest there is (a tie keeps the start).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import WORDS, make_corpus, make_data_dir, read_metrics, run_cli, tiny_recipe
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file

from csekit.core.errors import CsekitError
from csekit.encoding.encoder import SentenceEncoder
from csekit.training.run_folder import read_trainer_state, valid_scores
from csekit.training.trainer import train


def pairs_the_start_ranks_perfectly(model_dir: Path, path: Path, pairs: int = 30) -> Path:
    """A pairs file whose gold score is the model's own cosine similarity of each pair (its Spearman: 1.0)."""
    words = [w for w in WORDS if w.isalpha()]
    rng = np.random.default_rng(3)
    rows = [(" ".join(rng.choice(words, 5)), " ".join(rng.choice(words, 5))) for _ in range(pairs)]
    encoder = SentenceEncoder.load(model_dir, "mean")  # the recipes below train mean pooling
    left = encoder.encode([a for a, _ in rows])
    right = encoder.encode([b for _, b in rows])
    cosines = (left * right).sum(1) / np.linalg.norm(left, axis=1) / np.linalg.norm(right, axis=1)
    lines = ["sentence1\tsentence2\tscore", *(f"{a}\t{b}\t{c:.9f}" for (a, b), c in zip(rows, cosines, strict=True))]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(folder / "model.safetensors")


def test_a_run_no_step_improves_keeps_the_starting_model_bit_for_bit(
    tmp_path: Path, tiny_model_dir: Path, corpus: Path
) -> None:
    dev = pairs_the_start_ranks_perfectly(tiny_model_dir, tmp_path / "own.tsv")
    recipe = tiny_recipe(
        tiny_model_dir,
        corpus,
        "model.pooler=mean",
        "train.lr=5e-3",
        "train.max_steps=4",
        "train.eval_every=2",
        f"train.dev_task=pairs:{dev}",
        "train.select_metric=pairs:own/spearman",
    )
    result = train(recipe, tmp_path / "run", show_progress=False)
    evaluations = [r for r in read_metrics(tmp_path / "run") if "pairs:own/spearman" in r]
    assert [r["step"] for r in evaluations] == [0, 2, 4]
    assert evaluations[0]["pairs:own/spearman"] == pytest.approx(1.0)
    assert result.best_step == 0 and result.best_score == pytest.approx(1.0)
    # The steps did change the model (last/ differs), yet best/ holds the backbone's weights, bit for bit.
    start, best, last = (weights(folder) for folder in (tiny_model_dir, tmp_path / "run/best", tmp_path / "run/last"))
    assert set(best) == set(start)
    assert all(torch.equal(best[name], start[name]) for name in start)
    assert any(not torch.equal(last[name], start[name]) for name in start)
    # ... in a folder sentence-transformers loads, giving the starting model's embeddings.
    from sentence_transformers import SentenceTransformer

    sentences = ["the dog runs", "a man plays music"]
    expected = SentenceEncoder.load(tiny_model_dir, "mean").encode(sentences)
    loaded = SentenceTransformer(str(tmp_path / "run/best"), device="cpu").encode(sentences)
    np.testing.assert_allclose(loaded, expected, atol=1e-6)
    summary = result.summary()
    assert summary[0].startswith("trained 4 steps; no step beat the start on pairs:own/spearman (100.00); ")
    assert "best/ is the starting model" in summary[0]


def test_step_zero_is_logged_and_a_better_step_replaces_the_start(
    tmp_path: Path, tiny_model_dir: Path, corpus: Path
) -> None:
    data = make_data_dir(tmp_path / "data")
    recipe = tiny_recipe(
        tiny_model_dir,
        corpus,
        "model.pooler=mean",
        "train.max_steps=6",
        "train.eval_every=2",
        "train.dev_task=stsb-dev",
    )
    result = train(recipe, tmp_path / "run", data_dir=data, show_progress=False)
    evaluations = [r for r in read_metrics(tmp_path / "run") if "stsb-dev" in r]
    assert [r["step"] for r in evaluations] == [0, 2, 4, 6]
    best = max(evaluations, key=lambda r: r["stsb-dev"])  # the first of equals: a tie keeps the earlier model
    assert result.best_step == best["step"] and result.best_score == pytest.approx(best["stsb-dev"])
    assert result.start_scores == {k: v for k, v in evaluations[0].items() if k != "step"}
    assert result.best_scores == {k: v for k, v in best.items() if k != "step"}


def test_the_end_shows_every_dev_score_at_the_start_and_at_best(
    tmp_path: Path, tiny_model_dir: Path, corpus: Path
) -> None:
    dev = pairs_the_start_ranks_perfectly(tiny_model_dir, tmp_path / "own.tsv")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        f"model:\n  backbone: {tiny_model_dir}\n  pooler: mean\n  max_length: 16\ndata:\n  corpus: {corpus}\n"
        f"train:\n  batch_size: 16\n  max_steps: 2\n  eval_every: 2\n  lr: 5.0e-3\n  dev_task: [pairs:{dev}]\n"
        "  select_metric: pairs:own/spearman\n",
        encoding="utf-8",
    )
    done = run_cli("train", str(recipe), "--output", "run", "--no-progress", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    assert out[0].startswith("trained 2 steps; no step beat the start on pairs:own/spearman (100.00); best/ is the")
    table = out[out.index("| dev score | start (step 0) | best/ (the start) |") :]
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ")[1:] for line in table[2:]}
    assert set(rows) == {"pairs:own/spearman", "pairs:own/pearson"}
    assert rows["pairs:own/spearman"][0] == "100.00"
    card = (tmp_path / "run/best/README.md").read_text(encoding="utf-8")
    assert "## Before and after training" in card and "this is the starting model" in card


def test_patience_does_not_count_the_start(tmp_path: Path, tiny_model_dir: Path, corpus: Path) -> None:
    """With patience 1 and a start no step can beat, the run stops at its first evaluated step, not before it."""
    dev = pairs_the_start_ranks_perfectly(tiny_model_dir, tmp_path / "own.tsv")
    recipe = tiny_recipe(
        tiny_model_dir,
        corpus,
        "model.pooler=mean",
        "train.lr=5e-3",
        "train.max_steps=6",
        "train.eval_every=2",
        "train.patience=1",
        f"train.dev_task=pairs:{dev}",
        "train.select_metric=pairs:own/spearman",
    )
    result = train(recipe, tmp_path / "run", show_progress=False)
    assert result.steps == 2 and result.best_step == 0
    assert (tmp_path / "run/last").is_dir() and (tmp_path / "run/checkpoint").is_dir()


def test_the_start_survives_a_resume(tmp_path: Path, tiny_model_dir: Path) -> None:
    """The start's scores are part of the checkpoint: a resumed run still tells them at its end."""
    data = make_data_dir(tmp_path / "data")
    corpus = make_corpus(tmp_path / "c.txt", lines=64)
    common = ("model.pooler=mean", "train.eval_every=2", "train.dev_task=stsb-dev")
    train(tiny_recipe(tiny_model_dir, corpus, *common, "train.max_steps=2"), tmp_path / "run", data, False)
    state = json.loads((tmp_path / "run/checkpoint/trainer_state.json").read_text())
    assert state["start_scores"]["stsb-dev"] == read_metrics(tmp_path / "run")[1]["stsb-dev"]
    resumed = train(
        tiny_recipe(tiny_model_dir, corpus, *common, "train.max_steps=2"), tmp_path / "run", data, resume=True
    )
    assert resumed.start_scores == state["start_scores"]
    assert [r["step"] for r in read_metrics(tmp_path / "run") if "stsb-dev" in r] == [0, 2]


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    st.one_of(
        st.none(),
        st.dictionaries(st.text(max_size=5), st.floats(allow_nan=True), max_size=4),
        st.dictionaries(st.text(max_size=5), st.one_of(st.booleans(), st.text(), st.none()), min_size=1, max_size=3),
        st.lists(st.floats()),
        st.text(),
        st.integers(),
    )
)
def test_a_checkpoint_start_scores_are_a_table_of_numbers_or_the_file_is_damaged(value: object) -> None:
    expected = value is None or (
        isinstance(value, dict) and all(isinstance(v, float) and not math.isinf(v) for v in value.values())  # type: ignore[union-attr]
    )
    assert valid_scores(value) == expected


def test_a_damaged_start_scores_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "trainer_state.json"
    path.write_text(json.dumps({"step": 1, "batches": 1, "start_scores": {"stsb-dev": "high"}}))
    with pytest.raises(CsekitError, match="start_scores or best_scores is not a table of scores"):
        read_trainer_state(path)

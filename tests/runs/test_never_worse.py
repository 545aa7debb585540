"""A run never ends worse on its selection metric than the model it started from (issue 61 items 1 and 2).

The starting model is scored at step 0 and kept in best/ until an evaluated step beats it. The decisive case is
built so that no step can beat the start: a pairs dev file whose gold scores are the starting model's own cosine
similarities, so the start's Spearman is 1.0, the highest there is (a tie keeps the start).
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import WORDS, TinyTrainer, make_data_dir, read_metrics, run_cli, tiny_recipe
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file

from csekit.core.errors import CsekitError
from csekit.encoding.encoder import SentenceEncoder
from csekit.training.run_folder import read_trainer_state, valid_scores
from csekit.training.trainer import TrainingInterrupted, train


def made_up_pairs(pairs: int = 30, seed: int = 3) -> list[tuple[str, str]]:
    words = [w for w in WORDS if w.isalpha()]
    rng = np.random.default_rng(seed)
    return [(" ".join(rng.choice(words, 5)), " ".join(rng.choice(words, 5))) for _ in range(pairs)]


def write_pairs(path: Path, rows: list[tuple[str, str]], gold: np.ndarray) -> Path:
    lines = ["sentence1\tsentence2\tscore", *(f"{a}\t{b}\t{c:.9f}" for (a, b), c in zip(rows, gold, strict=True))]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def pairs_the_start_ranks_perfectly(model_dir: Path, path: Path, pairs: int = 30) -> Path:
    """A pairs file whose gold score is the model's own cosine similarity of each pair (its Spearman: 1.0)."""
    rows = made_up_pairs(pairs)
    encoder = SentenceEncoder.load(model_dir, "mean")  # the recipes below train mean pooling
    left = encoder.encode([a for a, _ in rows])
    right = encoder.encode([b for _, b in rows])
    cosines = (left * right).sum(1) / np.linalg.norm(left, axis=1) / np.linalg.norm(right, axis=1)
    return write_pairs(path, rows, cosines)


def pairs_with_random_scores(path: Path, pairs: int = 30) -> Path:
    """A pairs file of other sentences with made-up gold scores: steps may rank it better than the start does."""
    return write_pairs(path, made_up_pairs(pairs, seed=5), np.random.default_rng(5).uniform(0, 5, pairs))


def an_unbeatable_start(model_dir: Path, folder: Path) -> tuple[str, ...]:
    """Recipe keys of a run no step can beat: mean pooling, a learning rate large enough to change the model, and
    selection on a pairs dev file (written in `folder`) that the starting model ranks perfectly."""
    dev = pairs_the_start_ranks_perfectly(model_dir, folder / "own.tsv")
    return (
        "model.pooler=mean",
        "train.lr=5e-3",
        f"train.dev_task=pairs:{dev}",
        "train.select_metric=pairs:own/spearman",
    )


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(folder / "model.safetensors")


def test_a_run_no_step_improves_keeps_the_starting_model_bit_for_bit(
    tmp_path: Path, tiny_model_dir: Path, train_tiny: TinyTrainer
) -> None:
    run = train_tiny(*an_unbeatable_start(tiny_model_dir, tmp_path), steps=4, eval_every=2, lines=256)
    result = run.result
    evaluations = [r for r in run.metrics if "pairs:own/spearman" in r]
    assert [r["step"] for r in evaluations] == [0, 2, 4]
    assert evaluations[0]["pairs:own/spearman"] == pytest.approx(1.0)
    assert result.best_step == 0 and result.best_score == pytest.approx(1.0)
    # The steps did change the model (last/ differs), yet best/ holds the backbone's weights, bit for bit.
    start, best, last = (weights(folder) for folder in (tiny_model_dir, run.folder / "best", run.folder / "last"))
    assert set(best) == set(start)
    assert all(torch.equal(best[name], start[name]) for name in start)
    assert any(not torch.equal(last[name], start[name]) for name in start)
    # ... in a folder sentence-transformers loads, giving the starting model's embeddings.
    from sentence_transformers import SentenceTransformer

    sentences = ["the dog runs", "a man plays music"]
    expected = SentenceEncoder.load(tiny_model_dir, "mean").encode(sentences)
    loaded = SentenceTransformer(str(run.folder / "best"), device="cpu").encode(sentences)
    np.testing.assert_allclose(loaded, expected, atol=1e-6)
    summary = result.summary()
    assert summary[0].startswith("trained 4 steps; no step beat the start on pairs:own/spearman (100.00); ")
    assert "best/ is the starting model" in summary[0]


def test_step_zero_is_logged_and_a_better_step_replaces_the_start(tmp_path: Path, train_tiny: TinyTrainer) -> None:
    data = make_data_dir(tmp_path / "data")
    run = train_tiny("model.pooler=mean", "train.dev_task=stsb-dev", steps=6, eval_every=2, lines=256, data_dir=data)
    result = run.result
    evaluations = [r for r in run.metrics if "stsb-dev" in r]
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


def test_patience_does_not_count_the_start(tmp_path: Path, tiny_model_dir: Path, train_tiny: TinyTrainer) -> None:
    """With patience 1 and a start no step can beat, the run stops at its first evaluated step, not before it."""
    unbeatable = an_unbeatable_start(tiny_model_dir, tmp_path)
    run = train_tiny(*unbeatable, "train.patience=1", steps=6, eval_every=2, lines=256)
    assert run.result.steps == 2 and run.result.best_step == 0
    assert (run.folder / "last").is_dir() and (run.folder / "checkpoint").is_dir()


def test_the_start_survives_a_resume(tmp_path: Path, train_tiny: TinyTrainer) -> None:
    """The start's scores are part of the checkpoint: a resumed run still tells them at its end."""
    data = make_data_dir(tmp_path / "data")
    run = train_tiny("model.pooler=mean", "train.dev_task=stsb-dev", steps=2, eval_every=2, data_dir=data)
    state = json.loads((run.folder / "checkpoint/trainer_state.json").read_text())
    assert state["start_scores"]["stsb-dev"] == run.metrics[1]["stsb-dev"]
    resumed = train(run.recipe, run.folder, data, resume=True)
    assert resumed.start_scores == state["start_scores"]
    assert [r["step"] for r in run.metrics if "stsb-dev" in r] == [0, 2]


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


def test_a_resume_that_changes_the_select_metric_compares_on_the_new_one(
    tmp_path: Path, tiny_model_dir: Path, corpus: Path
) -> None:
    """best/ is replaced only by a step that beats best/'s own score on the metric selected now: a run resumed with
    another `train.select_metric` (--allow-changes) compared the new metric's scores with the old metric's best."""
    own = pairs_the_start_ranks_perfectly(tiny_model_dir, tmp_path / "own.tsv")
    other = pairs_with_random_scores(tmp_path / "other.tsv")
    keys = ("model.pooler=mean", "train.lr=5e-3", f"train.dev_task=[pairs:{own}, pairs:{other}]", "train.eval_every=2")
    first = tiny_recipe(tiny_model_dir, corpus, *keys, "train.max_steps=4", "train.select_metric=pairs:other/spearman")
    train(first, tmp_path / "run", show_progress=False)
    state = read_trainer_state(tmp_path / "run/checkpoint/trainer_state.json")
    assert state.best_scores is not None
    kept = {**state.best_scores, "step": state.best_step}  # best/ after the first part, selected on the other file
    second = tiny_recipe(tiny_model_dir, corpus, *keys, "train.max_steps=8", "train.select_metric=pairs:own/spearman")
    result = train(second, tmp_path / "run", resume=True, show_progress=False, allow_changes=True)
    later = [r for r in read_metrics(tmp_path / "run") if r["step"] > 4 and "pairs:own/spearman" in r]
    expected = max([kept, *later], key=lambda r: r["pairs:own/spearman"])  # the first of equals
    assert result.best_score == expected["pairs:own/spearman"]
    assert result.best_step == expected["step"]
    start = result.start_scores["pairs:own/spearman"]  # type: ignore[index]
    below = f"below the start's {100 * start:.2f}" in result.summary()[0]
    assert below == (result.best_score < start)


@pytest.mark.usefixtures("test_parts")
def test_a_resume_without_best_says_so_and_saves_best_again(
    tmp_path: Path, tiny_model_dir: Path, train_tiny: TinyTrainer, capsys: pytest.CaptureFixture[str]
) -> None:
    """best/ gone before a resume (deleted, or the folder copied without it): the run ended saying "best/ is the
    starting model" with no best/ at all; it says best/ is missing, and the next evaluation's model is best/."""
    keys = an_unbeatable_start(tiny_model_dir, tmp_path)
    stop = f"objectives=[{{name: infonce}}, {{name: interrupt_once, at_call: 1, marker: {tmp_path / 'marker'}}}]"
    with pytest.raises(TrainingInterrupted):
        train_tiny(*keys, stop, steps=4, eval_every=2, lines=256)
    shutil.rmtree(tmp_path / "run" / "best")
    run = train_tiny(*keys, stop, steps=4, eval_every=2, lines=256, resume=True)
    assert "run/best is missing (the checkpoint kept the starting model there)" in capsys.readouterr().err
    assert run.result.best_step == 2 and (run.folder / "best").is_dir()
    assert "below the start's 100.00" in run.result.summary()[0]


def test_a_damaged_selected_on_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "trainer_state.json"
    path.write_text(json.dumps({"step": 1, "batches": 1, "selected_on": ["stsb-dev"]}))
    with pytest.raises(CsekitError, match="selected_on is not a metric name"):
        read_trainer_state(path)


def test_a_run_without_a_dev_task_says_at_its_start_and_end_that_nothing_keeps_the_start(
    train_tiny: TinyTrainer, capsys: pytest.CaptureFixture[str]
) -> None:
    """`train.dev_task: none` scores nothing, so best/ is each evaluated model in turn and may be worse than the
    start: the run said only "best stsb-dev: n/a" (a metric it never scored); it warns once at the start and its
    last line says so."""
    capsys.readouterr()
    run = train_tiny(steps=4, eval_every=2)
    warnings = [line for line in capsys.readouterr().err.splitlines() if "train.dev_task is none" in line]
    assert warnings == [
        "csekit: warning: train.dev_task is none: no model is scored, so best/ is the last evaluated model, and "
        "nothing keeps it from being worse than the starting model (name a dev task, e.g. pairs:FILE of your "
        "domain, to keep the start when no step beats it)"
    ]
    evaluations = [r for r in run.metrics if "event" not in r and "loss" not in r]
    assert evaluations == [{"step": 2}, {"step": 4}]  # evaluated (best/ replaced each time), nothing scored
    assert run.result.best_step == 4 and (run.folder / "best").is_dir()
    assert run.result.summary() == [
        f"trained 4 steps; train.dev_task is none: no model is scored, so best/ is the last evaluated model, step 4, "
        "and nothing keeps it from being worse than the starting model (name a dev task, e.g. pairs:FILE of your "
        f"domain, to keep the start when no step beats it) ({run.folder / 'best'})"
    ]


def test_a_pooler_other_than_the_backbones_own_is_warned_about_at_the_start(
    tmp_path: Path, tiny_model_dir: Path, corpus: Path, train_tiny: TinyTrainer, capsys: pytest.CaptureFixture[str]
) -> None:
    """A recipe naming a pooler (cls by default) for a sentence-transformers folder that encodes with mean pooling and
    Normalize started from, scored at step 0 and kept in best/ that folder read another way, and said "best/ is the
    starting model" without a word; `auto` (its own) and a plain transformers model are not warned about."""
    from test_folder_pooling import sentence_transformers_folder

    from csekit.training.model import start_representation_warning

    user_model = sentence_transformers_folder(tmp_path / "user", "mean", normalize=True)
    mean_only = sentence_transformers_folder(tmp_path / "user", "mean", normalize=False)
    plain = tmp_path / "user" / "hf"  # the transformer they were saved from
    cases = [
        (user_model, "cls", "mean pooling, then Normalize"),
        (user_model, "mean", "mean pooling, then Normalize"),  # the same pooler, without the Normalize
        (user_model, "auto", None),
        (mean_only, "mean", None),
        (tiny_model_dir, "mean", "cls pooling"),  # a csekit model's own: csekit.json
        (tiny_model_dir, "cls", None),
        (plain, "mean", None),
    ]
    for backbone, pooler, own in cases:
        warning = start_representation_warning(tiny_recipe(backbone, corpus, f"model.pooler={pooler}"))
        assert (warning is None) == (own is None), (backbone, pooler, warning)
        if own is not None:
            assert f"{backbone} encodes with {own}" in str(warning) and f"model.pooler {pooler} reads it" in str(
                warning
            )
    capsys.readouterr()
    dev = pairs_with_random_scores(tmp_path / "other.tsv")
    run = train_tiny(f"train.dev_task=pairs:{dev}", "train.select_metric=pairs:other/spearman", model=user_model)
    err = capsys.readouterr().err
    assert err.count("csekit: warning: ") == 1 and f"{user_model} encodes with mean pooling, then Normalize" in err
    assert run.result.best_step is not None


def test_a_start_scored_through_a_new_head_is_warned_about_for_any_backbone(
    tmp_path: Path, tiny_model_dir: Path, corpus: Path
) -> None:
    """WhitenedCSE's and the combined recipe's head is kept at test time (MixCSE's code scores dev through it): the
    head is built new, so the start scored at step 0 is the backbone through an untrained head, a start a trained
    model beats easily, and "never worse than the start" said nothing of the backbone the user had."""
    from test_folder_pooling import sentence_transformers_folder

    from csekit.training.model import start_representation_warning

    user_model = sentence_transformers_folder(tmp_path / "user", "mean", normalize=True)
    for backbone in (tiny_model_dir, user_model, tmp_path / "user" / "hf"):
        for head in ("mlp", "none"):
            for keys in ([], ["model.head_at_test=true"], ["train.dev_with_head=true"]):
                if head == "none" and "train.dev_with_head=true" in keys:
                    continue  # refused by the recipe's checks: no head to score through
                pooler = "auto" if backbone == user_model else "cls"
                recipe = tiny_recipe(backbone, corpus, f"model.pooler={pooler}", f"model.head={{name: {head}}}", *keys)
                warning = start_representation_warning(recipe)
                if head == "none" or not keys:
                    assert warning is None, (backbone, head, keys, warning)
                    continue
                key = keys[0].split("=")[0]
                assert warning is not None and f"{key} scores the start through model.head {head}, built new" in warning
                assert f"csekit evaluate {backbone}" in warning

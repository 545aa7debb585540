"""Paths that survive a change of folder: a recipe's relative paths (the corpus, the dev files, a counts file, a
model folder) are resolved once when a run starts and recorded absolute in its recipe.yaml, so `--resume` and
`csekit bench` continue it from any folder (csekit.training.recipe_paths). Before, a run's recipe.yaml kept the
paths as written, read again from whatever folder the resume ran in: a resume from elsewhere failed, or trained
on another folder's file of the same name."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest
import yaml
from conftest import (
    assert_one_line_error,
    assert_same_checkpoint_weights,
    make_corpus,
    make_data_dir,
    read_metrics,
    run_main,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from test_dev_selection import make_pairs
from test_sharding import assert_same_final_weights

from csekit.core.errors import CsekitError
from csekit.training.recipe import Recipe, load_recipe
from csekit.training.trainer import train

CaptureErr = pytest.CaptureFixture[str]


def crashing_recipe(folder: Path, model: Path, marker: Path) -> Path:
    """In `folder`: a corpus, a dev pairs file and a recipe naming both relative to it, with a part that crashes the
    run at its 3rd step unless `marker` exists (a checkpoint is written at step 2)."""
    make_corpus(folder / "corpus.txt", lines=64)
    make_pairs(folder / "dev.tsv")
    recipe = folder / "recipe.yaml"
    recipe.write_text(
        f'model: {{backbone: "{model}", pooler: mean, max_length: 16}}\n'
        "data: {corpus: corpus.txt}\n"
        "train: {batch_size: 16, lr: 5.0e-4, max_steps: 4, eval_every: 2, log_every: 1, precision: fp32,\n"
        "        dev_task: [pairs:dev.tsv], select_metric: pairs:dev/spearman}\n"
        "objectives:\n"
        "  - {name: infonce, temperature: 0.05}\n"
        f"  - {{name: raise_once, weight: 0.0, at_call: 3, marker: '{marker}'}}\n",
        encoding="utf-8",
    )
    return recipe


def straight_and_crashed(start: Path, model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """From `start`: the recipe trained straight into start/straight, and crashed after step 2 in start/run."""
    marker = start / "crashed"
    crashing_recipe(start, model, marker)
    monkeypatch.chdir(start)
    marker.write_text("not this run", encoding="utf-8")
    train(load_recipe("recipe.yaml"), "straight", show_progress=False)
    marker.unlink()
    with pytest.raises(RuntimeError, match="crash for the test"):
        train(load_recipe("recipe.yaml"), "run", show_progress=False)
    assert json.loads((start / "run" / "checkpoint" / "trainer_state.json").read_text())["step"] == 2


def test_a_run_started_in_one_folder_resumes_from_another_to_the_straight_runs_weights(
    tmp_path: Path, tiny_model_dir: Path, test_parts: None, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr
) -> None:
    start, elsewhere = tmp_path / "start", tmp_path / "elsewhere"
    start.mkdir(), elsewhere.mkdir()
    straight_and_crashed(start, tiny_model_dir, monkeypatch)
    saved = yaml.safe_load((start / "run" / "recipe.yaml").read_text())
    assert saved["data"]["corpus"] == str(start / "corpus.txt")  # recorded absolute when the run started
    assert saved["train"]["dev_task"] == [f"pairs:{start / 'dev.tsv'}"]
    (elsewhere / "corpus.txt").write_text("another corpus of the same name\n" * 64, encoding="utf-8")
    monkeypatch.chdir(elsewhere)
    code, err = run_main(monkeypatch, capsys, "train", "--output", str(start / "run"), "--resume", "--no-progress")
    assert code == 0, err
    assert_same_checkpoint_weights(start / "straight", start / "run")
    assert_same_final_weights(start / "straight", start / "run", rtol=0, atol=0)
    losses = [(r["step"], r["loss"]) for r in read_metrics(start / "run") if "loss" in r]
    assert losses == [(r["step"], r["loss"]) for r in read_metrics(start / "straight") if "loss" in r]
    # The recipe file itself, its paths relative, resumes from here too: they name the files the run recorded.
    code, err = run_main(
        monkeypatch, capsys, "train", str(start / "recipe.yaml"), "--output", str(start / "run"), "--resume"
    )
    assert code == 0, err
    checkpoint_recipe = yaml.safe_load((start / "run" / "checkpoint" / "recipe.yaml").read_text())
    assert checkpoint_recipe["data"]["corpus"] == str(start / "corpus.txt")


def test_a_run_folder_of_an_older_csekit_resumes_as_before_and_says_what_to_do_elsewhere(
    tmp_path: Path, tiny_model_dir: Path, test_parts: None, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr
) -> None:
    """An older csekit's recipe.yaml holds the paths as written: they are read from the current folder as before
    (and recorded absolute from then on); from another folder the error says where to resume from."""
    start, elsewhere = tmp_path / "start", tmp_path / "elsewhere"
    start.mkdir(), elsewhere.mkdir()
    straight_and_crashed(start, tiny_model_dir, monkeypatch)
    for saved in (start / "run" / "recipe.yaml", start / "run" / "checkpoint" / "recipe.yaml"):  # as older ones
        text = saved.read_text().replace(f"{start}{os.sep}", "")
        assert "corpus: corpus.txt" in text and "pairs:dev.tsv" in text
        saved.write_text(text, encoding="utf-8")
    monkeypatch.chdir(elsewhere)
    code, err = run_main(monkeypatch, capsys, "train", "--output", str(start / "run"), "--resume")
    assert_one_line_error(
        code, err, f"pairs file {elsewhere / 'dev.tsv'} does not exist", "resume from the folder the run started in"
    )
    monkeypatch.chdir(start)
    code, err = run_main(monkeypatch, capsys, "train", "--output", "run", "--resume", "--no-progress")
    assert code == 0, err
    assert_same_final_weights(start / "straight", start / "run", rtol=0, atol=0)
    assert yaml.safe_load((start / "run" / "recipe.yaml").read_text())["data"]["corpus"] == str(start / "corpus.txt")


def test_a_bench_suite_continues_from_another_folder(
    tmp_path: Path, tiny_model_dir: Path, test_parts: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A suite started in one folder (its recipe's corpus relative to that folder) and run again from another: the
    started run resumes on the corpus it recorded, and its files are the suite's, relative to the suite file."""
    from csekit.bench import load_suite, run_suite

    start, elsewhere, suites = tmp_path / "start", tmp_path / "elsewhere", tmp_path / "suites"
    start.mkdir(), elsewhere.mkdir(), suites.mkdir()
    data = make_data_dir(tmp_path / "data")
    crashing_recipe(start, tiny_model_dir, start / "crashed")
    shutil.move(start / "recipe.yaml", suites / "recipe.yaml")
    make_pairs(suites / "scored.tsv", seed=8)
    suite = suites / "suite.yaml"
    suite.write_text(
        "seeds: [1]\ntasks:\n  - stsb-dev\n  - {pairs: scored.tsv, columns: [sentence1, sentence2, score]}\n"
        "recipes: [{recipe: recipe.yaml, name: run}]\n",
        encoding="utf-8",
    )
    monkeypatch.chdir(start)
    relative_suite = Path("..") / "suites" / "suite.yaml"
    assert load_suite(relative_suite).pairs == [suites / "scored.tsv"]  # held absolute
    (start / "crashed").write_text("not this run", encoding="utf-8")
    run_suite(relative_suite, tmp_path / "straight", data_dir=data, show_progress=False, log=lambda line: None)
    (start / "crashed").unlink()
    with pytest.raises(RuntimeError, match="crash for the test"):
        run_suite(relative_suite, tmp_path / "bench", data_dir=data, show_progress=False, log=lambda line: None)
    monkeypatch.chdir(elsewhere)
    relative_suite = Path("..") / "suites" / "suite.yaml"
    result = run_suite(relative_suite, tmp_path / "bench", data_dir=data, show_progress=False, log=lambda line: None)
    assert result["ran"] == ["run-seed1"]
    assert_same_final_weights(tmp_path / "straight" / "run-seed1", tmp_path / "bench" / "run-seed1", rtol=0, atol=0)
    report = json.loads((tmp_path / "bench" / "run-seed1" / "results.json").read_text())
    assert {"stsb-dev", "pairs:scored"} <= set(report["tasks"])
    recipe = yaml.safe_load((tmp_path / "bench" / "run-seed1" / "recipe.yaml").read_text())
    assert recipe["data"]["corpus"] == str(start / "corpus.txt")


def test_does_not_exist_names_the_full_path_tried(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CSEKIT_DATA", raising=False)
    data = make_data_dir(tmp_path / "data")
    make_corpus(tmp_path / "c.txt")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f'model: {{backbone: "{tiny_model_dir}"}}\ndata: {{corpus: sub/missing.txt}}\n', "utf-8")
    common = ["--output", "run", "--set", "train.dev_task=none"]
    code, err = run_main(monkeypatch, capsys, "train", "recipe.yaml", *common)
    assert_one_line_error(code, err, f"corpus {tmp_path / 'sub' / 'missing.txt'} does not exist")
    code, err = run_main(monkeypatch, capsys, "train", "recipe.yaml", *common, "--data-dir", "data")
    assert_one_line_error(code, err, str(tmp_path / "sub" / "missing.txt"), str(data / "sub" / "missing.txt"))
    code, err = run_main(monkeypatch, capsys, "train", "recipe.yaml", *common, "--data-dir", "no-data")
    assert_one_line_error(code, err, f"data folder {tmp_path / 'no-data'} (from --data-dir) does not exist")
    with pytest.raises(CsekitError, match=re.escape(f"retrieval folder {tmp_path / 'kb'} does not exist")):
        load_recipe(None, ["train.dev_task=retrieval:kb"])
    with pytest.raises(CsekitError, match=re.escape(f"pairs file {tmp_path / 'dev.tsv'} does not exist")):
        load_recipe(None, ["train.dev_task=pairs:./dev.tsv"])
    from csekit.training.recipe_paths import resolve_recipe_paths

    counts = "objectives=[{name: infonce}, {name: slt_fai_at, counts: freq/labels.json}]"
    with pytest.raises(CsekitError, match=re.escape(f"{tmp_path / 'freq' / 'labels.json'} and {data / 'freq'}")):
        resolve_recipe_paths(load_recipe(None, [counts, "train.dev_task=none", "data.corpus=c.txt"]), data)


SEGMENT = st.sampled_from(["a", "b c", ".", "..", "ü", "corpus.txt", "x-1"])
RELATIVE = st.lists(SEGMENT, min_size=1, max_size=5).map(lambda parts: os.path.join(*parts))


@settings(max_examples=100, deadline=None)
@given(relative=RELATIVE)
def test_a_relative_dev_path_is_resolved_from_the_current_folder_and_reused_on_resume(
    relative: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The rule for every relative path: absolute from the current folder when the run starts; on resume, from any
    folder, the recorded path when it ends with the relative one (never one that climbs out of the folder)."""
    from csekit.training.recipe_paths import resolve_recipe_paths

    first, second = tmp_path_factory.mktemp("first"), tmp_path_factory.mktemp("second")
    recipe = Recipe()
    recipe.train.dev_task = ["sts", f"pairs:{relative}", {"retrieval": relative, "split": "dev"}]
    here = os.getcwd()
    try:
        os.chdir(first)
        started = resolve_recipe_paths(recipe, None)
        os.chdir(second)
        resumed = resolve_recipe_paths(recipe, None, recorded=started)
    finally:
        os.chdir(here)
    expected = os.path.abspath(os.path.join(first, relative))
    assert started.train.dev_task == ["sts", f"pairs:{expected}", {"retrieval": expected, "split": "dev"}]
    assert recipe.train.dev_task[1] == f"pairs:{relative}"  # the recipe given is left as it was
    climbs = os.path.normpath(relative).startswith("..") or os.path.normpath(relative) == "."
    from_second = os.path.abspath(os.path.join(second, relative))
    assert resumed.train.dev_task[1] == f"pairs:{from_second if climbs else expected}"

"""Issue #39: what a resume reads from a run folder is bounded (trainer_state.json's counts, ESimCSE's queue
counters), a recipe's queue and worker counts are bounded before anything is built, and an edit to a run's
saved recipe.yaml after its checkpoint is found. Each case continued silently or was a traceback before.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import (
    assert_one_line_error,
    make_corpus,
    make_tiny_encoder,
    run_main,
    tiny_recipe,
    train_finished_run,
    write_recipe,
)
from safetensors.torch import load_file, save_file
from test_untrusted import resume

from csekit.core.errors import CsekitError

CaptureErr = pytest.CaptureFixture[str]
QUEUE = "  max_steps: 2\n  eval_every: 2\nnegatives:\n  - name: momentum_queue\n    queue_size: 12\n"


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-step ESimCSE-style run (a momentum queue of 12) with a checkpoint at step 2 (copy it before changing it)."""
    return train_finished_run(tmp_path_factory.mktemp("finished"), QUEUE)


@pytest.fixture
def run(finished_run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(finished_run / "run", tmp_path / "run"))


@pytest.mark.parametrize("key", ["batches", "step"])
def test_a_huge_count_in_trainer_state_is_one_line(
    key: str, run: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr
) -> None:
    """batches: 1e30 was a traceback (an epoch seed beyond 2^64), step: 1e30 was accepted."""
    path = run / "checkpoint" / "trainer_state.json"
    state = json.loads(path.read_text())
    state[key] = 10**30
    path.write_text(json.dumps(state))
    code, err = resume(monkeypatch, capsys, run)
    assert_one_line_error(code, err, str(path), "damaged")


def test_a_step_beyond_the_runs_length_is_refused(
    run: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr
) -> None:
    """The loop ends when the step reaches total_steps; a checkpoint beyond it would never stop."""
    path = run / "checkpoint" / "trainer_state.json"
    state = json.loads(path.read_text())
    state["step"] = state["batches"] = 50
    path.write_text(json.dumps(state))
    code, err = resume(monkeypatch, capsys, run)
    assert_one_line_error(code, err, str(path), "step 50 is beyond this run's 2 steps")


@pytest.mark.parametrize("counter, value", [("queued", -5), ("queued", 13), ("pointer", 10**9)])
def test_a_tampered_queue_counter_is_refused(
    counter: str, value: int, run: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr
) -> None:
    """A negative or oversized count silently dropped or repeated negatives (the slice clamps it)."""
    path = run / "checkpoint" / "model.safetensors"
    weights = load_file(path)
    [name] = [key for key in weights if key.endswith(f".{counter}")]
    weights[name] = torch.tensor(value, dtype=weights[name].dtype)
    save_file(weights, str(path), metadata={"format": "pt"})
    code, err = resume(monkeypatch, capsys, run)
    assert_one_line_error(code, err, str(path), "momentum queue's counters", f"{counter} {value}")


@pytest.mark.parametrize(
    "option, needle",
    [
        ("queue_size: 1000000000000", "queue_size must be from 1 to 65,536 (vectors in the queue)"),
        ("queue_ratio: 1.0e+15", "queue_ratio must be in (0, 65,536]"),
    ],
)
def test_a_huge_queue_is_one_line_before_the_run_folder(
    option: str, needle: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr
) -> None:
    """queue_size 1e12 / queue_ratio 1e15 were tracebacks (an allocation of terabytes)."""
    model = tmp_path / "tiny-model"
    make_tiny_encoder(tmp_path / "tokenizer").save(model)
    negatives = f"negatives:\n  - name: momentum_queue\n    {option}\n"
    recipe = write_recipe(tmp_path, model, make_corpus(tmp_path / "corpus.txt", lines=32), "  max_steps: 1\n")
    recipe.write_text(recipe.read_text() + negatives)
    code, err = run_main(monkeypatch, capsys, "train", str(recipe), "--output", str(tmp_path / "run"))
    assert_one_line_error(code, err, "recipe key negatives[0]", needle)
    assert not (tmp_path / "run").exists()


def test_num_workers_has_an_upper_bound(tmp_path: Path) -> None:
    with pytest.raises(CsekitError, match=r"recipe key run.num_workers must be from 0 to 64"):
        tiny_recipe(tmp_path / "model", tmp_path / "corpus.txt", "run.num_workers=100000")


@pytest.mark.parametrize("edit", ["batch_size: 8\n|batch_size: 16\n", "lr: 3.0e-05|lr: 0.5"])
def test_an_edit_to_the_saved_recipe_after_the_checkpoint_is_refused_naming_the_keys(
    edit: str, run: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr
) -> None:
    """A changed batch size continued silently; an edited lr was ignored in training but written back."""
    saved = run / "recipe.yaml"
    old, new = edit.split("|")
    assert old in saved.read_text()
    saved.write_text(saved.read_text().replace(old, new))
    before = (run / "checkpoint" / "model.safetensors").read_bytes()
    code, err = resume(monkeypatch, capsys, run, "--set", "train.max_steps=4")
    key = old.split(":")[0]
    assert_one_line_error(
        code, err, f"{saved} was edited after the run's checkpoint", f"train.{key}", "--allow-changes"
    )
    assert (run / "checkpoint" / "model.safetensors").read_bytes() == before


def test_an_unedited_saved_recipe_still_resumes_and_allow_changes_accepts_an_edit(
    run: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr
) -> None:
    """Guard: the check compares with the checkpoint's own copy, which an accepted change then replaces."""
    code, err = resume(monkeypatch, capsys, run, "--set", "train.max_steps=4", "--allow-changes")
    assert code == 0, err
    saved = run / "recipe.yaml"
    saved.write_text(saved.read_text().replace("max_steps: 4", "max_steps: 6"))
    code, err = resume(monkeypatch, capsys, run, "--allow-changes")
    assert code == 0, err
    assert json.loads((run / "checkpoint" / "trainer_state.json").read_text())["step"] == 6
    code, err = resume(monkeypatch, capsys, run)  # nothing edited since: resumes (and has nothing left to do)
    assert code == 0, err


def test_allow_changes_refuses_a_change_the_checkpoint_would_override(
    run: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr
) -> None:
    """With --allow-changes an edited lr was accepted, logged and written back, but the optimizer and schedule
    state loaded from the checkpoint kept the old rate: the change silently did nothing."""
    before = (run / "checkpoint" / "model.safetensors").read_bytes()
    code, err = resume(monkeypatch, capsys, run, "--set", "train.lr=0.5", "--allow-changes")
    assert_one_line_error(code, err, "train.lr", "0.5", "checkpoint's optimizer and schedule state", "new run")
    assert (run / "checkpoint" / "model.safetensors").read_bytes() == before

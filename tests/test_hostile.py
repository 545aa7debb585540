"""Hostile files, signals and races (issue #28): a crafted or damaged file is one line naming it, never a crash,
never code run, never silent loss of work.

Every value csekit reads from a run folder, a model folder, a recipe or a suite may have been written by
someone else; each case here failed (a segmentation fault, a traceback, a hang, a prompt to run code, a
silently overwritten run) before its fix.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import assert_one_line_error, make_corpus, make_tiny_encoder, run_cli, run_main, write_recipe

from csekit.training.recipe import load_recipe
from csekit.training.trainer import train

CaptureErr = pytest.CaptureFixture[str]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-step run with a checkpoint at step 2 (copy it before changing it)."""
    root = tmp_path_factory.mktemp("finished")
    model = root / "tiny-model"
    make_tiny_encoder(root / "tokenizer").save(model)
    recipe = write_recipe(root, model, make_corpus(root / "corpus.txt", lines=64), "  max_steps: 2\n  eval_every: 2\n")
    train(load_recipe(recipe), root / "run", show_progress=False)
    return root


@pytest.fixture
def run(finished_run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(finished_run / "run", tmp_path / "run"))


def resume(monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr, run: Path, *args: str) -> tuple[int, str]:
    return run_main(monkeypatch, capsys, "train", *args, "--output", str(run), "--resume", "--no-progress")


def rewrite(path: Path, change: Any) -> None:
    """Load a checkpoint file, let `change` edit it in place, save it back (only tensors and plain values)."""
    state = torch.load(path, weights_only=True)
    change(state)
    torch.save(state, path)


# --- crafted checkpoint values are checked before torch sees them ------------------------------------


def test_an_optimizer_state_of_the_wrong_shape_is_refused_not_a_segfault(run: Path, tmp_path: Path) -> None:
    """A moment of 368 elements for a larger parameter made the fused AdamW read past it: exit 139, no message."""

    def shrink(state: dict[str, Any]) -> None:
        entry = state["state"][0]
        entry["exp_avg"] = entry["exp_avg"].flatten()[:-16].clone()

    rewrite(run / "checkpoint" / "optimizer.pt", shrink)
    before = (run / "metrics.jsonl").read_text()
    result = run_cli("train", "--output", str(run), "--resume", "--no-progress", cwd=tmp_path)
    assert_one_line_error(result.returncode, result.stderr, str(run / "checkpoint" / "optimizer.pt"), "exp_avg")
    assert (run / "metrics.jsonl").read_text() == before


def _set_group(key: str, value: Any) -> Any:
    return lambda state: [group.__setitem__(key, value) for group in state["param_groups"]]


def _set_moment(key: str, value: Any) -> Any:
    return lambda state: [entry.__setitem__(key, value(entry[key])) for entry in state["state"].values()]


CRAFTED = {
    "lr-text": ("optimizer.pt", _set_group("lr", "fast"), "param_groups[0].lr"),
    "lr-nan": ("optimizer.pt", _set_group("lr", float("nan")), "param_groups[0].lr"),
    "betas-one": ("optimizer.pt", _set_group("betas", (1.0, 0.999)), "betas"),
    "amsgrad-on": ("optimizer.pt", _set_group("amsgrad", True), "amsgrad"),
    "moment-int": ("optimizer.pt", _set_moment("exp_avg", lambda t: t.long()), "exp_avg"),
    "moment-negative": ("optimizer.pt", _set_moment("exp_avg_sq", lambda t: -t - 1), "negative"),
    "moment-inf": ("optimizer.pt", _set_moment("exp_avg", lambda t: t / 0), "not finite"),
    "step-text": ("optimizer.pt", _set_moment("step", lambda t: "one"), "step"),
    "no-parameter": ("optimizer.pt", lambda s: s["state"].__setitem__(999, s["state"][0]), "999"),
    "last-epoch-text": ("scheduler.pt", lambda s: s.__setitem__("last_epoch", "y"), "last_epoch"),
    "last-epoch-huge": ("scheduler.pt", lambda s: s.__setitem__("last_epoch", 10**30), "last_epoch"),
    "base-lrs-short": ("scheduler.pt", lambda s: s.__setitem__("base_lrs", []), "base_lrs"),
    "lambda-attribute": ("scheduler.pt", lambda s: s["lr_lambdas"][0].__setitem__("func", "x"), "lr_lambdas"),
}


@pytest.mark.parametrize("case", CRAFTED)
def test_a_crafted_checkpoint_value_is_one_line_naming_the_file_and_the_value(
    case: str, run: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr
) -> None:
    """Text for a learning rate or an epoch was a TypeError traceback; NaN, betas of 1, int moments trained on."""
    name, change, needle = CRAFTED[case]
    rewrite(run / "checkpoint" / name, change)
    before = (run / "metrics.jsonl").read_text()
    code, err = resume(monkeypatch, capsys, run)
    assert_one_line_error(code, err, str(run / "checkpoint" / name), "does not fit this run", needle)
    assert (run / "metrics.jsonl").read_text() == before


def test_an_unchanged_checkpoint_still_resumes(run: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr) -> None:
    """Guard: the checks accept what csekit itself wrote."""
    code, err = resume(monkeypatch, capsys, run, "--set", "train.max_steps=3", "--allow-changes")
    assert code == 0, err

"""The checks of an exact resume, in one place: a recipe trained straight through, and the same recipe stopped mid-run
then resumed with --resume, must end bit for bit alike.

Three ways to stop a run, parts of parts_for_tests that act once, during call `at_call`, unless their marker file
exists (the straight run is trained with the marker in place, the stopped one without it): kill_once sends SIGKILL
to its own process (`killed_and_resumed`), interrupt_once stops it as Ctrl-C does (`interrupted_and_resumed`),
raise_once raises in this process (`crashed_and_resumed`, through the `train_tiny` fixture).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import TinyRun, TinyTrainer, assert_same_checkpoint_weights, read_metrics, run_cli_with_test_parts


def run_train(recipe: Path, output: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """`csekit train RECIPE --output OUTPUT --no-progress EXTRA` in a fresh process that has the tests' parts."""
    args = ("train", str(recipe), "--output", str(output), "--no-progress", *extra)
    return run_cli_with_test_parts(*args, plugin_dir=output.parent / "plugin")


def step_losses(run: Path) -> list[tuple[int, float]]:
    """Each training step's loss in the run's metrics.jsonl, in the order logged."""
    return [(record["step"], record["loss"]) for record in read_metrics(run) if "loss" in record]


def killed_and_resumed(
    tmp_path: Path, recipe_text: Callable[[Path], str], inspect_killed: Callable[[Path], None] | None = None
) -> tuple[Path, Path]:
    """The recipe `recipe_text(marker)` trained straight into tmp_path/straight, and into tmp_path/resumed killed
    by kill_once, then resumed: the two run folders.

    Checks that the straight run and the resume exit 0 and the killed run by SIGKILL, that the two checkpoints
    hold the same tensors bit for bit, and that both metrics.jsonl log the same loss at every step.
    `inspect_killed` sees the killed run's folder (its last checkpoint) before the resume.
    """
    marker = tmp_path / "killed"
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(recipe_text(marker), encoding="utf-8")
    marker.write_text("not this run", encoding="utf-8")
    straight = run_train(recipe, tmp_path / "straight")
    assert straight.returncode == 0, straight.stderr
    marker.unlink()
    killed = run_train(recipe, tmp_path / "resumed")
    assert killed.returncode == -9 and marker.exists()  # SIGKILL during step `at_call`
    if inspect_killed is not None:
        inspect_killed(tmp_path / "resumed")
    resumed = run_train(recipe, tmp_path / "resumed", "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert_same_checkpoint_weights(tmp_path / "straight", tmp_path / "resumed")
    assert dict(step_losses(tmp_path / "resumed")) == dict(step_losses(tmp_path / "straight"))
    return tmp_path / "straight", tmp_path / "resumed"


def interrupted_and_resumed(
    tmp_path: Path, recipe: Path, model_dir: Path, corpus: Path, objectives: list[dict[str, Any]], *settings: str
) -> tuple[Path, Path]:
    """`recipe` with `objectives`, `settings` and an 8-step schedule (fp32, batches of 16, 16 tokens, a checkpoint
    every 4 steps) on `model_dir` and `corpus`, trained straight into tmp_path/straight, and into tmp_path/run
    stopped by Ctrl-C during step 3 then resumed: the two run folders.

    Checks that the straight run and the resume exit 0 and the interrupted run 130, that metrics.jsonl logs the same
    losses in the same order, and that the two checkpoints hold the same tensors bit for bit.
    """
    marker = tmp_path / "interrupted"
    stop = {"name": "interrupt_once", "weight": 0.0, "at_call": 3, "marker": str(marker)}
    keys = [
        f"model.backbone={model_dir}",
        "model.max_length=16",
        f"data.corpus={corpus}",
        "train.batch_size=16",
        "train.max_steps=8",
        "train.eval_every=4",
        "train.log_every=1",
        "train.dev_task=none",
        "train.precision=fp32",
        f"objectives={json.dumps([*objectives, stop])}",
        *settings,
    ]
    overrides = [item for key in keys for item in ("--set", key)]

    def csekit(*args: str) -> subprocess.CompletedProcess[str]:
        return run_cli_with_test_parts(*args, "--no-progress", plugin_dir=tmp_path / "plugin", cwd=tmp_path)

    marker.write_text("not this run", encoding="utf-8")
    straight = csekit("train", str(recipe), *overrides, "--output", "straight")
    assert straight.returncode == 0, straight.stderr
    marker.unlink()
    assert csekit("train", str(recipe), *overrides, "--output", "run").returncode == 130
    resumed = csekit("train", "--output", "run", "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert step_losses(tmp_path / "run") == step_losses(tmp_path / "straight")
    assert_same_checkpoint_weights(tmp_path / "straight", tmp_path / "run")
    return tmp_path / "straight", tmp_path / "run"


def crashed_and_resumed(train_tiny: TinyTrainer, *overrides: str, steps: int, eval_every: int) -> TinyRun:
    """`train_tiny` with `overrides` for `steps` steps, a checkpoint every `eval_every`, trained straight into
    tmp_path/straight, and into tmp_path/resumed crashed by raise_once during step 3 then resumed: the resumed run.

    Checks that the crash is raise_once's and that the two checkpoints hold the same tensors bit for bit.
    """
    marker = train_tiny.tmp_path / "raised"
    crash = f"objectives=[{{name: infonce}}, {{name: raise_once, weight: 0.0, at_call: 3, marker: '{marker}'}}]"
    marker.write_text("not this run", encoding="utf-8")
    straight = train_tiny(*overrides, crash, steps=steps, eval_every=eval_every, name="straight")
    marker.unlink()
    with pytest.raises(RuntimeError, match="crash for the test"):
        train_tiny(*overrides, crash, steps=steps, eval_every=eval_every, name="resumed")
    resumed = train_tiny(*overrides, crash, steps=steps, eval_every=eval_every, name="resumed", resume=True)
    assert_same_checkpoint_weights(straight.folder, resumed.folder)
    return resumed

"""Checkpoints, exact resume after SIGKILL, and the non-finite-step guard."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import assert_same_checkpoint_weights, make_corpus, read_metrics, run_cli_with_test_parts, tiny_recipe
from safetensors.torch import load_file

from csekit.core.errors import CsekitError
from csekit.training.trainer import train


def recipe_file(path: Path, model_dir: Path, corpus: Path, marker: Path) -> Path:
    path.write_text(
        f"""
model: {{backbone: "{model_dir}", pooler: mean, max_length: 16}}
data: {{corpus: "{corpus}"}}
train: {{batch_size: 16, lr: 1.0e-3, max_steps: 12, eval_every: 4, log_every: 1, dev_task: none, seed: 7}}
objectives:
  - {{name: infonce, temperature: 0.05}}
  - {{name: kill_once, weight: 0.0, at_call: 7, marker: "{marker}"}}
""",
        encoding="utf-8",
    )
    return path


def run_train(recipe: Path, output: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    args = ("train", str(recipe), "--output", str(output), "--no-progress", *extra)
    return run_cli_with_test_parts(*args, plugin_dir=output.parent / "plugin")


def test_resume_after_sigkill_gives_the_weights_of_an_uninterrupted_run(tmp_path: Path, tiny_model_dir: Path) -> None:
    corpus = make_corpus(tmp_path / "corpus.txt", lines=128)  # 8 steps per epoch: the run crosses an epoch
    marker = tmp_path / "killed"
    marker.write_text("not this run", encoding="utf-8")
    straight = run_train(recipe_file(tmp_path / "a.yaml", tiny_model_dir, corpus, marker), tmp_path / "straight")
    assert straight.returncode == 0, straight.stderr
    marker.unlink()

    recipe = recipe_file(tmp_path / "b.yaml", tiny_model_dir, corpus, marker)
    killed = run_train(recipe, tmp_path / "resumed")
    assert killed.returncode == -9 and marker.exists()  # SIGKILL during step 7; the checkpoint is from step 4
    state = json.loads((tmp_path / "resumed" / "checkpoint" / "trainer_state.json").read_text())
    assert state["step"] == 4
    resumed = run_train(recipe, tmp_path / "resumed", "--resume")
    assert resumed.returncode == 0, resumed.stderr

    assert_same_checkpoint_weights(tmp_path / "straight", tmp_path / "resumed")
    # metrics.jsonl holds each step once, with the same losses as the uninterrupted run
    losses = {r["step"]: r["loss"] for r in read_metrics(tmp_path / "straight") if "loss" in r}
    again = [r for r in read_metrics(tmp_path / "resumed") if "loss" in r]
    assert [r["step"] for r in again] == list(range(1, 13))
    assert {r["step"]: r["loss"] for r in again} == losses


def test_resume_of_a_finished_run_does_nothing(tmp_path: Path, tiny_model_dir: Path) -> None:
    corpus = make_corpus(tmp_path / "corpus.txt", lines=64)
    recipe = tiny_recipe(tiny_model_dir, corpus, "train.max_steps=3")
    train(recipe, tmp_path / "run", show_progress=False)
    before = (tmp_path / "run" / "metrics.jsonl").read_text()
    result = train(recipe, tmp_path / "run", resume=True, show_progress=False)
    assert result.steps == 3 and (tmp_path / "run" / "metrics.jsonl").read_text() == before


@pytest.mark.parametrize("gradient_only", [False, True])
def test_non_finite_steps_are_skipped_then_stop_the_run(
    tmp_path: Path, tiny_model_dir: Path, gradient_only: bool, test_parts: None
) -> None:
    corpus = make_corpus(tmp_path / "corpus.txt", lines=64)
    spec = f"{{name: nan_after, after: 3, gradient_only: {str(gradient_only).lower()}}}"
    recipe = tiny_recipe(
        tiny_model_dir,
        corpus,
        "train.max_steps=40",
        "train.eval_every=2",
        f"objectives=[{{name: infonce}}, {spec}]",
    )
    with pytest.raises(CsekitError, match="in a row had a non-finite"):
        train(recipe, tmp_path / "run", show_progress=False)
    records = read_metrics(tmp_path / "run")
    skipped = [r for r in records if r.get("event") == "non_finite_step"]
    assert len(skipped) == 20 and skipped[-1]["skipped_steps"] == 20
    assert [r["step"] for r in records if "loss" in r] == [1, 2]  # steps 1-2 trained, then only skips
    assert {r["reason"] for r in skipped} == {"gradient" if gradient_only else "loss"}
    best = load_file(tmp_path / "run" / "best" / "model.safetensors")
    assert all(torch.isfinite(t).all() for t in best.values())

"""Checkpoints, exact resume after SIGKILL, and the non-finite-step guard."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import TinyTrainer, make_corpus, read_metrics
from resumed_runs import killed_and_resumed
from safetensors.torch import load_file

from csekit.core.errors import CsekitError
from csekit.training.trainer import train


def recipe_text(model_dir: Path, corpus: Path, marker: Path) -> str:
    """SimCSE on the tiny model, 12 steps with a checkpoint every 4, killed during step 7 unless `marker` exists."""
    return f"""
model: {{backbone: "{model_dir}", pooler: mean, max_length: 16}}
data: {{corpus: "{corpus}"}}
train: {{batch_size: 16, lr: 1.0e-3, max_steps: 12, eval_every: 4, log_every: 1, dev_task: none, seed: 7}}
objectives:
  - {{name: infonce, temperature: 0.05}}
  - {{name: kill_once, weight: 0.0, at_call: 7, marker: "{marker}"}}
"""


def test_resume_after_sigkill_gives_the_weights_of_an_uninterrupted_run(tmp_path: Path, tiny_model_dir: Path) -> None:
    corpus = make_corpus(tmp_path / "corpus.txt", lines=128)  # 8 steps per epoch: the run crosses an epoch

    def killed_at_step_7_with_the_checkpoint_of_step_4(run: Path) -> None:
        assert json.loads((run / "checkpoint" / "trainer_state.json").read_text())["step"] == 4

    _, resumed = killed_and_resumed(
        tmp_path,
        lambda marker: recipe_text(tiny_model_dir, corpus, marker),
        killed_at_step_7_with_the_checkpoint_of_step_4,
    )
    # metrics.jsonl holds each step once (the same losses as the uninterrupted run: killed_and_resumed)
    assert [r["step"] for r in read_metrics(resumed) if "loss" in r] == list(range(1, 13))


def test_resume_of_a_finished_run_does_nothing(train_tiny: TinyTrainer) -> None:
    run = train_tiny()
    before = (run.folder / "metrics.jsonl").read_text()
    result = train(run.recipe, run.folder, resume=True, show_progress=False)
    assert result.steps == 3 and (run.folder / "metrics.jsonl").read_text() == before


@pytest.mark.parametrize("gradient_only", [False, True])
def test_non_finite_steps_are_skipped_then_stop_the_run(
    tmp_path: Path, train_tiny: TinyTrainer, gradient_only: bool, test_parts: None
) -> None:
    spec = f"{{name: nan_after, after: 3, gradient_only: {str(gradient_only).lower()}}}"
    with pytest.raises(CsekitError, match="in a row had a non-finite"):
        train_tiny(f"objectives=[{{name: infonce}}, {spec}]", steps=40, eval_every=2)
    records = read_metrics(tmp_path / "run")
    skipped = [r for r in records if r.get("event") == "non_finite_step"]
    assert len(skipped) == 20 and skipped[-1]["skipped_steps"] == 20
    assert [r["step"] for r in records if "loss" in r] == [1, 2]  # steps 1-2 trained, then only skips
    assert {r["reason"] for r in skipped} == {"gradient" if gradient_only else "loss"}
    best = load_file(tmp_path / "run" / "best" / "model.safetensors")
    assert all(torch.isfinite(t).all() for t in best.values())

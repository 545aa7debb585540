"""Stopping a run by a signal loses no work: SIGTERM as Ctrl-C, and a signal to the whole process group.

Schedulers, `timeout`, Docker and systemd send SIGTERM; a terminal's Ctrl-C and `timeout` signal the whole
process group, the loader's worker processes included. Each stop checkpoints the step, says one line and
exits with 128 + the signal's number; the run resumes exactly.
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest
from conftest import make_corpus


def interrupt_recipe(
    path: Path, model: Path, corpus: Path, marker: Path, signal_name: str, workers: int = 0, to_group: bool = False
) -> Path:
    path.write_text(
        f"""
model: {{backbone: "{model}", pooler: mean, max_length: 16}}
data: {{corpus: "{corpus}"}}
train: {{batch_size: 16, lr: 5.0e-4, max_steps: 6, eval_every: 4, log_every: 1, dev_task: none, precision: fp32}}
run: {{num_workers: {workers}}}
objectives:
  - {{name: infonce, temperature: 0.05}}
  - {{name: interrupt_once, weight: 0.0, at_call: 3, marker: "{marker}", signal_name: {signal_name},
      to_group: {str(to_group).lower()}}}
""",
        encoding="utf-8",
    )
    return path


def test_sigterm_checkpoints_the_step_and_the_run_resumes_exactly(tmp_path: Path, tiny_model_dir: Path) -> None:
    """SIGTERM (schedulers, timeout, Docker, systemd) killed training with no message, losing the steps since the
    last checkpoint; now it is Ctrl-C: the step is checkpointed, one line, exit status 143."""
    from conftest import assert_same_checkpoint_weights, read_metrics, run_cli_with_test_parts

    marker = tmp_path / "terminated"
    corpus = make_corpus(tmp_path / "corpus.txt", lines=128)
    recipe = interrupt_recipe(tmp_path / "recipe.yaml", tiny_model_dir, corpus, marker, "SIGTERM")

    def csekit(*args: str) -> subprocess.CompletedProcess[str]:
        return run_cli_with_test_parts(*args, "--no-progress", plugin_dir=tmp_path / "plugin", cwd=tmp_path)

    marker.write_text("not this run", encoding="utf-8")
    assert csekit("train", str(recipe), "--output", "straight").returncode == 0
    marker.unlink()
    stopped = csekit("train", str(recipe), "--output", "run")
    assert stopped.returncode == 143, stopped.stderr
    unscored = "csekit: warning: train.dev_task is none"  # said at the start of a run without a dev task
    assert [line for line in stopped.stderr.splitlines() if not line.startswith(unscored)] == [
        "csekit: interrupted by SIGTERM at step 3; resume with: csekit train --output run --resume"
    ]
    assert json.loads((tmp_path / "run" / "checkpoint" / "trainer_state.json").read_text())["step"] == 3
    resumed = csekit("train", "--output", "run", "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert_same_checkpoint_weights(tmp_path / "straight", tmp_path / "run")
    losses = [(r["step"], r["loss"]) for r in read_metrics(tmp_path / "run") if "loss" in r]
    assert losses == [(r["step"], r["loss"]) for r in read_metrics(tmp_path / "straight") if "loss" in r]


@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGINT"])
def test_a_signal_to_the_process_group_with_loader_workers_checkpoints_the_step(
    tmp_path: Path, tiny_model_dir: Path, signal_name: str
) -> None:
    """Ctrl-C in a terminal and `timeout` signal the whole process group, loader workers (a GPU's default) too: the
    workers died of it, and PyTorch's SIGCHLD handler raised "DataLoader worker ... killed by signal" in the middle
    of the checkpoint, a traceback and the step lost (seen on an H200). The workers now leave the signal to the
    training process, which stops after the step as with no workers."""
    from conftest import read_metrics, run_cli_with_test_parts

    marker = tmp_path / "signalled"
    corpus = make_corpus(tmp_path / "corpus.txt", lines=128)
    recipe = interrupt_recipe(
        tmp_path / "r.yaml", tiny_model_dir, corpus, marker, signal_name, workers=2, to_group=True
    )

    def csekit(*args: str) -> subprocess.CompletedProcess[str]:
        return run_cli_with_test_parts(
            *args, "--no-progress", plugin_dir=tmp_path / "plugin", cwd=tmp_path, own_group=True
        )

    stopped = csekit("train", str(recipe), "--output", "run")
    number = int(signal.Signals[signal_name])
    assert stopped.returncode == 128 + number, stopped.stderr
    said = "" if signal_name == "SIGINT" else f" by {signal_name}"
    unscored = "csekit: warning: train.dev_task is none"  # said at the start of a run without a dev task
    assert [line for line in stopped.stderr.splitlines() if not line.startswith(unscored)] == [
        f"csekit: interrupted{said} at step 3; resume with: csekit train --output run --resume"
    ]
    assert json.loads((tmp_path / "run" / "checkpoint" / "trainer_state.json").read_text())["step"] == 3
    resumed = csekit("train", "--output", "run", "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert [r["step"] for r in read_metrics(tmp_path / "run") if "loss" in r] == [1, 2, 3, 4, 5, 6]

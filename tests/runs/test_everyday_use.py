"""Everyday use of `csekit train` (issue #22): early stopping, Ctrl-C, plain logs in files, trackers."""

from __future__ import annotations

import io
import json
import subprocess
from pathlib import Path

import pytest
from conftest import (
    TinyTrainer,
    add_sick_trial,
    assert_one_line_error,
    assert_same_checkpoint_weights,
    make_data_dir,
    read_metrics,
    run_cli_with_test_parts,
    run_main,
    tiny_recipe,
)

from csekit.core.errors import CsekitError
from csekit.core.progress import progress
from csekit.encoding.encoder import SentenceEncoder
from csekit.training.recipe import load_recipe
from csekit.training.trainer import train

TESTS = Path(__file__).resolve().parents[1]

FROZEN = "train.lr=1e-12"
"""A learning rate too small to change any fp32 weight: every dev score equals the first (no improvement)."""


def patience_recipe(model_dir: Path, corpus: Path, *extra: str):  # type: ignore[no-untyped-def]
    return tiny_recipe(
        model_dir,
        corpus,
        FROZEN,
        "train.max_steps=10",
        "train.eval_every=1",
        "train.dev_task=stsb-dev",
        "model.pooler=mean",
        *extra,
    )


def test_patience_stops_the_run_and_keeps_the_best_model(
    tmp_path: Path, tiny_model_dir: Path, corpus: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = make_data_dir(tmp_path / "data")
    recipe = patience_recipe(tiny_model_dir, corpus, "train.patience=2")
    result = train(recipe, tmp_path / "run", data_dir=data, show_progress=False)
    assert (result.steps, result.best_step) == (2, 0)  # the start (step 0) is the best; steps 1 and 2 do not beat it
    records = read_metrics(tmp_path / "run")
    assert [r["step"] for r in records if "stsb-dev" in r] == [0, 1, 2]
    stop = records[-1]
    assert stop == {
        "event": "early_stop",
        "step": 2,
        "best_step": 0,
        "best_score": pytest.approx(result.best_score),
        "patience": 2,
    }
    lines = [line for line in capsys.readouterr().err.splitlines() if "early stop" in line]
    assert len(lines) == 1
    assert (
        f"early stop at step 2: stsb-dev did not improve in 2 evaluations; best {100 * result.best_score:.2f} "
        "at step 0 (the starting model)" in lines[0]
    )
    assert (tmp_path / "run" / "best" / "model.safetensors").exists()
    state = json.loads((tmp_path / "run" / "checkpoint" / "trainer_state.json").read_text())
    assert (state["step"], state["evaluations_without_improvement"]) == (2, 2)

    # Resuming a run that stopped early does not train on.
    again = train(recipe, tmp_path / "run", data_dir=data, resume=True, show_progress=False)
    assert again.steps == 2


def test_patience_counts_on_across_a_resume(
    tmp_path: Path, tiny_model_dir: Path, corpus: Path, test_parts: None
) -> None:
    """Crash at step 3 (checkpoint of step 2: two evaluations without improvement, as the start at step 0 is the
    best), resume: it stops at step 3."""
    data = make_data_dir(tmp_path / "data")
    marker = tmp_path / "raised"
    recipe = patience_recipe(
        tiny_model_dir,
        corpus,
        "train.patience=3",
        f"objectives=[{{name: infonce}}, {{name: raise_once, weight: 0.0, at_call: 3, marker: '{marker}'}}]",
    )
    with pytest.raises(RuntimeError, match="crash for the test"):
        train(recipe, tmp_path / "run", data_dir=data, show_progress=False)
    state = json.loads((tmp_path / "run" / "checkpoint" / "trainer_state.json").read_text())
    assert (state["step"], state["evaluations_without_improvement"]) == (2, 2)
    result = train(recipe, tmp_path / "run", data_dir=data, resume=True, show_progress=False)
    assert (result.steps, result.best_step) == (3, 0)
    assert read_metrics(tmp_path / "run")[-1]["event"] == "early_stop"


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["train.dev_task=none", "train.patience=2"], "recipe key train.patience needs a dev task"),
        (["train.patience=0"], "recipe key train.patience must be from 1 to"),
        (["run.report_to=tensorbord"], 'recipe key run.report_to: unknown tracker "tensorbord" (did you mean'),
        (["run.report_to=all"], 'unknown tracker "all"'),
    ],
)
def test_bad_new_train_keys_are_one_line_errors(overrides: list[str], needle: str) -> None:
    with pytest.raises(CsekitError) as error:
        load_recipe(None, overrides)
    assert needle in str(error.value) and "\n" not in str(error.value)


def test_a_tracker_that_is_not_installed_is_refused_before_anything_is_written(
    tmp_path: Path, train_tiny: TinyTrainer
) -> None:
    from accelerate.tracking import get_available_trackers
    from accelerate.utils import LoggerType

    available = {str(getattr(t, "value", t)) for t in get_available_trackers()}
    missing = [t.value for t in LoggerType if t != LoggerType.ALL and t.value not in available]
    if not missing:
        pytest.skip("every tracker accelerate knows is installed")
    with pytest.raises(CsekitError, match=f"recipe key run.report_to: {missing[0]} is not installed"):
        train_tiny(f"run.report_to={missing[0]}", steps=1, lines=256)
    assert not (tmp_path / "run").exists()


def test_tensorboard_event_files_are_written_in_the_run_folder(tmp_path: Path, train_tiny: TinyTrainer) -> None:
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    data = make_data_dir(tmp_path / "data")
    dev_and_tracker = ("train.dev_task=stsb-dev", "run.report_to=tensorboard")
    run = train_tiny(*dev_and_tracker, steps=4, eval_every=2, lines=256, data_dir=data)
    run_logs = run.folder / "logs" / run.recipe.name  # accelerate's TensorBoard tracker: logging_dir/project
    assert list(run_logs.glob("events.out.tfevents.*"))
    scalars = event_accumulator.EventAccumulator(str(run_logs))
    scalars.Reload()
    tags = set(scalars.Tags()["scalars"])
    assert {"train/loss", "train/infonce", "train/lr", "train/sentences_per_second", "dev/tasks/stsb-dev"} <= tags
    assert [event.step for event in scalars.Scalars("train/loss")] == [1, 2, 3, 4]
    logged = {r["step"]: r["loss"] for r in run.losses}
    assert [event.value for event in scalars.Scalars("train/loss")] == pytest.approx([logged[s] for s in (1, 2, 3, 4)])
    assert [event.step for event in scalars.Scalars("dev/tasks/stsb-dev")] == [0, 2, 4]


def test_loading_and_saving_models_prints_no_library_progress_bars(
    train_tiny: TinyTrainer, capfd: pytest.CaptureFixture[str]
) -> None:
    from transformers.utils import logging as hf_logging

    bars_before, verbosity_before = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    capfd.readouterr()
    train_tiny(steps=2, lines=256)
    err = capfd.readouterr().err
    assert "Loading weights" not in err and "Writing model shards" not in err, err
    # the libraries' settings are as they were (csekit quiets them only while it loads or saves)
    assert (hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()) == (bars_before, verbosity_before)


def write_recipe_file(path: Path, model_dir: Path, corpus: Path, train_keys: str, objectives: str = "") -> Path:
    path.write_text(
        f"""
model: {{backbone: "{model_dir}", pooler: mean, max_length: 16}}
data: {{corpus: "{corpus}"}}
train: {{batch_size: 16, lr: 1.0e-3, dev_task: none, seed: 7, precision: fp32, {train_keys}}}
objectives:
  - {{name: infonce, temperature: 0.05}}
{objectives}""",
        encoding="utf-8",
    )
    return path


def run_csekit(*args: str, cwd: Path, stderr: Path | None = None) -> subprocess.CompletedProcess[str]:
    return run_cli_with_test_parts(*args, plugin_dir=cwd / "plugin", cwd=cwd, stderr=stderr)


def test_ctrl_c_checkpoints_the_step_and_the_run_resumes_exactly(
    tmp_path: Path, tiny_model_dir: Path, corpus: Path
) -> None:
    """SIGINT during step 3: checkpoint of step 3, one line, exit status 130; `--resume` ends as a straight run."""
    marker = tmp_path / "interrupted"
    keys = "max_steps: 6, eval_every: 4, log_every: 1"
    part = f'  - {{name: interrupt_once, weight: 0.0, at_call: 3, marker: "{marker}"}}\n'
    recipe = write_recipe_file(tmp_path / "recipe.yaml", tiny_model_dir, corpus, keys, part)
    marker.write_text("not this run", encoding="utf-8")
    straight = run_csekit("train", str(recipe), "--output", "straight", "--no-progress", cwd=tmp_path)
    assert straight.returncode == 0, straight.stderr
    marker.unlink()

    interrupted = run_csekit("train", str(recipe), "--output", "run", "--no-progress", cwd=tmp_path)
    assert interrupted.returncode == 130, interrupted.stderr
    unscored = "csekit: warning: train.dev_task is none"  # said at the start of a run without a dev task
    assert [line for line in interrupted.stderr.splitlines() if not line.startswith(unscored)] == [
        "csekit: interrupted at step 3; resume with: csekit train --output run --resume"
    ]
    state = json.loads((tmp_path / "run" / "checkpoint" / "trainer_state.json").read_text())
    assert state["step"] == 3 and not (tmp_path / "run" / ".lock").exists()

    resumed = run_csekit("train", "--output", "run", "--resume", "--no-progress", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert_same_checkpoint_weights(tmp_path / "straight", tmp_path / "run")
    losses = [(r["step"], r["loss"]) for r in read_metrics(tmp_path / "run") if "loss" in r]
    assert losses == [(r["step"], r["loss"]) for r in read_metrics(tmp_path / "straight") if "loss" in r]


def test_a_log_written_to_a_file_is_short_and_plain(tmp_path: Path, tiny_model_dir: Path, corpus: Path) -> None:
    """stderr to a file: no carriage-return redraws, no library bars; a plain line at each log record."""
    recipe = write_recipe_file(tmp_path / "recipe.yaml", tiny_model_dir, corpus, "max_steps: 6, log_every: 2")
    result = run_csekit("train", str(recipe), "--output", "run", cwd=tmp_path, stderr=tmp_path / "log.txt")
    raw = (tmp_path / "log.txt").read_bytes()  # bytes: reading text would turn each \r into \n
    log = raw.decode("utf-8")
    assert result.returncode == 0, log
    assert b"\r" not in raw and "Loading weights" not in log and "Writing model shards" not in log, log
    progress = [line for line in log.splitlines() if line.startswith("step ")]
    assert [line.split()[1] for line in progress] == ["2/6", "4/6", "6/6"]
    assert all(" loss " in line and " sent/s, " in line and line.endswith(" left") for line in progress), progress
    unscored = "csekit: warning: train.dev_task is none"  # said at the start of a run without a dev task
    assert [line for line in log.splitlines() if not line.startswith(unscored)] == progress, log


def test_bench_encodes_without_progress_bars(
    tmp_path: Path, tiny_model_dir: Path, corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every encode call of a bench run (dev scores in training, evaluation, corpus cosines) shows no bar."""
    from csekit.bench import run_suite
    from csekit.encoding.encoder import SentenceEncoder

    suite = tmp_path / "suite.yaml"
    smoke_recipe = TESTS.parent / "benchmarks" / "suites" / "smoke-recipe.yaml"
    suite.write_text(f"seeds: [1]\ntasks: stsb-dev,align\nrecipes:\n  - recipe: {smoke_recipe}\n", encoding="utf-8")
    asked: list[bool | None] = []
    encode = SentenceEncoder.encode

    def spy(self: SentenceEncoder, sentences: list[str], *args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        asked.append(kwargs.get("show_progress_bar"))  # type: ignore[arg-type]
        return encode(self, sentences, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(SentenceEncoder, "encode", spy)
    overrides = [f"model.backbone={tiny_model_dir}", f"data.corpus={corpus}", "train.max_steps=1"]
    data = make_data_dir(tmp_path / "data")
    run_suite(suite, tmp_path / "bench", data_dir=data, overrides=overrides, show_progress=False, log=lambda _: None)
    assert len(asked) >= 2 and set(asked) == {False}, asked


def test_ctrl_c_in_python_raises_training_interrupted_after_the_step(
    tmp_path: Path, tiny_model_dir: Path, corpus: Path, test_parts: None
) -> None:
    """SIGINT during an evaluation step (4 of 6, eval_every 2): a checkpoint of step 4; the old handler is back."""
    import signal

    from csekit.training.trainer import TrainingInterrupted

    marker = tmp_path / "interrupted"
    part = f"{{name: interrupt_once, weight: 0.0, at_call: 4, marker: '{marker}'}}"
    recipe = tiny_recipe(
        tiny_model_dir, corpus, "train.max_steps=6", "train.eval_every=2", f"objectives=[{{name: infonce}}, {part}]"
    )
    handler = signal.getsignal(signal.SIGINT)
    with pytest.raises(TrainingInterrupted) as stop:
        train(recipe, tmp_path / "run", show_progress=False)
    assert isinstance(stop.value, KeyboardInterrupt) and stop.value.step == 4
    assert stop.value.resume_command() == f"csekit train --output {tmp_path / 'run'} --resume"
    assert signal.getsignal(signal.SIGINT) is handler
    state = json.loads((tmp_path / "run" / "checkpoint" / "trainer_state.json").read_text())
    assert state["step"] == 4
    assert train(recipe, tmp_path / "run", resume=True, show_progress=False).steps == 6


def test_encoding_progress_is_plain_lines_off_a_terminal(
    tiny_encoder: SentenceEncoder, capsys: pytest.CaptureFixture[str]
) -> None:
    """Evaluate, diagnose and probe encode through `SentenceEncoder.encode`: with stderr in a file its bar was
    hundreds of carriage-return redraws; now one line at each tenth of the batches."""
    capsys.readouterr()
    tiny_encoder.encode([f"sentence number {i}" for i in range(25)], batch_size=1, show_progress_bar=True)
    err = capsys.readouterr().err
    assert "\r" not in err, err
    lines = err.splitlines()
    assert [line.split()[1] for line in lines] == [f"{n}/25" for n in (3, 5, 8, 10, 13, 15, 18, 20, 23, 25)], lines
    assert all(line.startswith("encoding: ") and " batches (" in line for line in lines), lines


def test_progress_is_a_bar_on_a_terminal_and_silent_when_off() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal, log = Terminal(), io.StringIO()
    assert list(progress(range(4), "work", "items", stream=terminal)) == [0, 1, 2, 3]
    assert "\r" in terminal.getvalue() and "work" in terminal.getvalue()  # tqdm's redraws
    assert list(progress(range(4), "work", "items", enabled=False, stream=log)) == [0, 1, 2, 3]
    assert log.getvalue() == ""
    assert list(progress([], "work", "items", stream=log)) == [] and log.getvalue() == ""


def test_evaluate_dev_prints_and_writes_the_dev_average(tmp_path: Path, tiny_model_dir: Path) -> None:
    """`--tasks dev` gave stsb-dev and sick-dev but not their mean, the `avg_sts` DCLR's recipes select on."""
    from typer.testing import CliRunner

    from csekit.cli import app

    data = add_sick_trial(make_data_dir(tmp_path / "data"))
    out = tmp_path / "dev.json"
    args = ["evaluate", str(tiny_model_dir), "--tasks", "dev", "--data-dir", str(data), "--output", str(out)]
    result = CliRunner().invoke(app, [*args, "--precision", "fp32"])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text(encoding="utf-8"))
    expected = (report["tasks"]["stsb-dev"] + report["tasks"]["sick-dev"]) / 2
    assert report["averages"]["avg_sts"] == pytest.approx(expected) and "avg_sts" not in report["tasks"]
    assert f"avg_sts: {100 * expected:.2f} (the mean of stsb-dev and sick-dev)" in result.output


def test_encode_writes_npy_or_tab_separated_text_by_the_name_and_refuses_another(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--output x.txt` wrote .npy bytes into a .txt file; now .txt/.tsv is text that reads back exactly."""
    import numpy as np

    (tmp_path / "in.txt").write_text("a man plays the guitar .\na dog runs .\n", encoding="utf-8")
    args = ["encode", str(tiny_model_dir), "-i", str(tmp_path / "in.txt"), "-o"]
    assert run_main(monkeypatch, capsys, *args, str(tmp_path / "e.npy"))[0] == 0
    assert run_main(monkeypatch, capsys, *args, str(tmp_path / "e.txt"))[0] == 0
    text = (tmp_path / "e.txt").read_text(encoding="utf-8")
    assert len(text.splitlines()) == 2 and all(len(line.split("\t")) == 32 for line in text.splitlines())
    np.testing.assert_array_equal(np.loadtxt(tmp_path / "e.txt", dtype=np.float32), np.load(tmp_path / "e.npy"))
    code, err = run_main(monkeypatch, capsys, *args, str(tmp_path / "e.csv"))
    assert_one_line_error(code, err, "e.csv", ".npy", ".txt/.tsv")
    assert not (tmp_path / "e.csv").exists()


def test_a_pooler_in_capitals_gets_the_closest_name(tmp_path: Path, tiny_model_dir: Path) -> None:
    with pytest.raises(CsekitError, match='unknown pooler "CLS" \\(did you mean "cls"\\?\\)'):
        SentenceEncoder.load(str(tiny_model_dir), pooler="CLS")


def test_the_probe_table_says_what_its_columns_are() -> None:
    from csekit.evaluation.probes import BIAS_TABLE_LEGEND, format_bias_table

    row = {"dataset": "STS12", "cont": 3, "oppn": 5, "median_score": 2.5, "median_mer": 0.4}
    table = format_bias_table({"datasets": [{**row, "spearman_cont": 0.5, "spearman_oppn": 0.25}]})
    lines = table.splitlines()
    assert "pairs (paper)" in lines[0] and "medians" in lines[0] and "Spearman x 100" in lines[0]
    assert lines[-1] == BIAS_TABLE_LEGEND and lines[-1].startswith("Cont.: pairs whose gold score")

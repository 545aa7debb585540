"""What a killed run leaves behind is cleaned up or repaired by the next start in its folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import assert_one_line_error, make_corpus, run_main, write_recipe

from csekit.core.atomic import STAGING_MARKER
from csekit.core.errors import CsekitError
from csekit.training.run_folder import MetricsLog

LEFTOVERS = (".best.1a2b3c4d.tmp", ".last.5e6f7a8b.tmp", ".checkpoint.tmp")


def finished_run(tmp_path: Path, model: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):  # type: ignore[no-untyped-def]
    """A finished 2-step run in tmp_path/run; returns the arguments that (re)start it."""
    recipe = write_recipe(tmp_path, model, make_corpus(tmp_path / "c.txt", lines=32))
    args = ["train", str(recipe), "--output", str(tmp_path / "run"), "--set", "train.max_steps=2", "--no-progress"]
    code, err = run_main(monkeypatch, capsys, *args)
    assert code == 0, err
    return args


def test_resume_removes_staging_leftovers_and_repairs_a_cut_off_metrics_line(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    args = finished_run(tmp_path, tiny_model_dir, monkeypatch, capsys)
    run = tmp_path / "run"
    metrics_before = (run / "metrics.jsonl").read_text(encoding="utf-8")
    best_before = (run / "best" / "model.safetensors").read_bytes()
    for name in LEFTOVERS:  # a run killed while saving a model or the checkpoint (csekit marks its staging folders)
        (run / name).mkdir()
        (run / name / "model.safetensors").write_bytes(b"half a model")
        (run / name / STAGING_MARKER).write_bytes(b"")
    (run / ".metrics.jsonl.0a1b2c3d.tmp").write_text('{"step": 1}\n', encoding="utf-8")
    with open(run / "metrics.jsonl", "a", encoding="utf-8") as handle:
        handle.write('{"step": 3, "loss": 0.12')  # killed in the middle of a write
    code, err = run_main(monkeypatch, capsys, *args, "--resume")
    assert code == 0, err
    assert f"{run / 'metrics.jsonl'}:" in err and "dropped a cut-off last line" in err
    assert (run / "metrics.jsonl").read_text(encoding="utf-8") == metrics_before
    assert (run / "best" / "model.safetensors").read_bytes() == best_before
    assert not [p.name for p in run.iterdir() if p.name.endswith(".tmp")]


def test_a_broken_line_before_the_last_is_an_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0}\nnot json\n{"step": 1}\n', encoding="utf-8")
    with pytest.raises(CsekitError, match=f"{path}:2: not a metrics record"):
        MetricsLog(path, enabled=True).truncate_after(5)
    assert path.read_text(encoding="utf-8") == '{"step": 0}\nnot json\n{"step": 1}\n'  # nothing lost


def test_a_complete_last_line_that_is_not_a_record_is_an_error(tmp_path: Path) -> None:
    """Only a line cut off before its newline is a crash's leftover; a whole bad line was written by someone."""
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0}\nnot json\n', encoding="utf-8")
    with pytest.raises(CsekitError, match=f"{path}:2: not a metrics record"):
        MetricsLog(path, enabled=True).truncate_after(5)


def test_a_complete_last_line_without_its_newline_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0}\n{"step": 1}\n{"step": 2}', encoding="utf-8")
    MetricsLog(path, enabled=True).truncate_after(1)
    assert [json.loads(line)["step"] for line in path.read_text(encoding="utf-8").splitlines()] == [0, 1]


def test_resume_from_a_damaged_checkpoint_is_one_line_naming_the_file(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    args = finished_run(tmp_path, tiny_model_dir, monkeypatch, capsys)
    checkpoint = tmp_path / "run" / "checkpoint"
    for path in checkpoint.rglob("*"):
        if path.is_file():
            path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    code, err = run_main(monkeypatch, capsys, *args, "--resume")
    assert_one_line_error(code, err, str(checkpoint))

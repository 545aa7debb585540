"""Hostile files III (issue #49), the writing side: what libraries write for csekit (a tracker's logs, a model's
files) goes into a folder csekit created and holds open, never through a link put there before or after; a new
run removes only the leftovers csekit can tell it made; every command that writes a result holds a lock; odd
paths and huge counts are one line. Each test failed before its fix.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from conftest import assert_one_line_error, make_corpus, run_main, write_recipe

from csekit.core.errors import CsekitError

CaptureErr = pytest.CaptureFixture[str]


def _private_folder(path: Path) -> Path:
    """A folder of the user's with a 0600 file in a 0700 folder: what a link could expose or change."""
    path.mkdir()
    (path / "secret.txt").write_text("mine", encoding="utf-8")
    os.chmod(path / "secret.txt", 0o600)
    os.chmod(path, 0o700)
    return path


def _assert_untouched(path: Path) -> None:
    assert sorted(p.name for p in path.iterdir()) == ["secret.txt"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o700
    assert stat.S_IMODE((path / "secret.txt").stat().st_mode) == 0o600


# --- defect 2: a staging folder replaced by a link after csekit made it ----------------------------------------


def _replace_by_link(staging: Path, elsewhere: Path) -> None:
    staging.rename(staging.with_name(staging.name + ".moved"))
    staging.symlink_to(elsewhere)


def test_a_model_staging_folder_replaced_by_a_link_is_not_written_through(tmp_path: Path) -> None:
    from csekit.core.atomic import atomic_directory

    elsewhere = _private_folder(tmp_path / "elsewhere")
    target = tmp_path / "out" / "best"
    with pytest.raises(CsekitError, match="was replaced"), atomic_directory(target) as staging:
        (names,) = [p for p in target.parent.iterdir() if p.name.startswith(".best.")]
        _replace_by_link(names, elsewhere)
        (staging / "model.safetensors").write_text("weights", encoding="utf-8")  # a library writing by path
    _assert_untouched(elsewhere)
    assert not target.exists() and not target.is_symlink()


def test_a_checkpoint_staging_folder_replaced_by_a_link_is_one_line_and_not_written_through(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr
) -> None:
    """`.checkpoint.tmp` became a link between its mkdir and the first write: the weights went to the link's
    target, its modes became 0755/0644, and the link was renamed into place as checkpoint/."""
    import csekit.training.trainer as trainer

    elsewhere = _private_folder(tmp_path / "elsewhere")
    run = tmp_path / "run"
    save = trainer.save_shared_state

    def replaced_first(folder: Path, *args: object) -> None:
        _replace_by_link(run / ".checkpoint.tmp", elsewhere)
        save(folder, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(trainer, "save_shared_state", replaced_first)
    recipe = write_recipe(tmp_path, tiny_model_dir, make_corpus(tmp_path / "c.txt", lines=32))
    args = ["train", str(recipe), "--output", str(run), "--set", "train.max_steps=2", "--set", "train.precision=fp32"]
    code, err = run_main(monkeypatch, capsys, *args, "--no-progress")
    assert_one_line_error(code, err, ".checkpoint.tmp", "was replaced")
    _assert_untouched(elsewhere)
    assert not (run / "checkpoint").is_symlink()


def test_swap_in_never_changes_modes_through_a_link_inside(tmp_path: Path) -> None:
    from csekit.core.atomic import swap_in

    elsewhere = _private_folder(tmp_path / "elsewhere")
    staged = tmp_path / ".staged"
    staged.mkdir()
    (staged / "linked").symlink_to(elsewhere)
    (staged / "linked-file").symlink_to(elsewhere / "secret.txt")
    swap_in(staged, tmp_path / "best")
    _assert_untouched(elsewhere)


# --- defect 1: the TensorBoard tracker's folder ----------------------------------------------------------------

TENSORBOARD = "  report_to: tensorboard\n  max_steps: 2\n"


@pytest.mark.parametrize("name", ["../../x", "ABSOLUTE", "a/b"])
def test_a_recipe_name_cannot_lead_the_tracker_outside_the_run(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr, name: str
) -> None:
    pytest.importorskip("tensorboard")
    name = str(tmp_path / "absolute") if name == "ABSOLUTE" else name
    recipe = write_recipe(tmp_path, tiny_model_dir, make_corpus(tmp_path / "c.txt", lines=32), TENSORBOARD)
    recipe.write_text(f'name: "{name}"\n' + recipe.read_text(encoding="utf-8"), encoding="utf-8")
    run = tmp_path / "deep" / "er" / "run"
    code, err = run_main(monkeypatch, capsys, "train", str(recipe), "--output", str(run), "--no-progress")
    assert_one_line_error(code, err, "recipe key name", repr(name))
    assert not run.exists() and not (tmp_path / "deep" / "x").exists() and not (tmp_path / "absolute").exists()


@pytest.mark.parametrize("where", ["logs", "logs/unnamed"])
def test_a_logs_link_in_a_run_folder_is_not_followed_on_resume(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr, where: str
) -> None:
    pytest.importorskip("tensorboard")
    recipe = write_recipe(tmp_path, tiny_model_dir, make_corpus(tmp_path / "c.txt", lines=32), TENSORBOARD)
    run = tmp_path / "run"
    args = ["train", str(recipe), "--output", str(run), "--no-progress"]
    code, err = run_main(monkeypatch, capsys, *args)
    assert code == 0, err
    elsewhere = _private_folder(tmp_path / "elsewhere")
    os.rename(run / where, tmp_path / "old-logs")
    (run / where).symlink_to(elsewhere)
    code, err = run_main(monkeypatch, capsys, *args, "--set", "train.max_steps=4", "--allow-changes", "--resume")
    assert_one_line_error(code, err, str(run / "logs"), "link")
    _assert_untouched(elsewhere)

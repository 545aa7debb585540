"""Hostile files III (issue #49), the writing side: what libraries write for csekit (a tracker's logs, a model's
files) goes into a folder csekit created and holds open, never through a link put there before or after; a new
run removes only the leftovers csekit can tell it made; every command that writes a result holds a lock; odd
paths and huge counts are one line. Each test failed before its fix.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

import pytest
from conftest import assert_one_line_error, make_corpus, run_main, write_recipe

from csekit.core.errors import CsekitError
from csekit.training.recipe import load_recipe

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
    import csekit.training.checkpoint as checkpoint

    elsewhere = _private_folder(tmp_path / "elsewhere")
    run = tmp_path / "run"
    save = checkpoint.save_shared_state

    def replaced_first(folder: Path, *args: object) -> None:
        _replace_by_link(run / ".checkpoint.tmp", elsewhere)
        save(folder, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(checkpoint, "save_shared_state", replaced_first)
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

TENSORBOARD = "  max_steps: 2\nrun:\n  report_to: tensorboard\n"


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


@pytest.mark.parametrize("tracker", ["mlflow", "comet_ml", "clearml", "swanlab", "trackio"])
def test_a_tracker_that_writes_outside_the_run_folder_is_refused_at_load(tracker: str) -> None:
    """mlflow writes `./mlruns`, trackio its cache, ...: where their own configuration says, outside csekit's rules."""
    with pytest.raises(CsekitError, match=f"run.report_to: {tracker} writes its local files .* outside the run"):
        load_recipe(None, [f"run.report_to={tracker}"])


def test_a_tracker_that_takes_a_folder_option_gets_the_held_run_folder(tmp_path: Path) -> None:
    """wandb and dvclive ignore accelerate's logging_dir (wandb wrote `./wandb` in the working folder): each gets
    the held `logs/<name>` through its own init option; TensorBoard and Aim take logging_dir."""
    from csekit.training.trackers import hold_tracker_logs, tracker_options

    recipe = load_recipe(None, ["name=probe", "run.report_to=tensorboard,wandb,dvclive"])
    with contextlib.ExitStack() as held:
        logs = hold_tracker_logs(tmp_path / "run", recipe, held)
        options = tracker_options(logs, recipe)
        assert set(options) == {"wandb", "dvclive"}
        for folder in (options["wandb"]["dir"], options["dvclive"]["dir"]):
            assert Path(folder).resolve() == (tmp_path / "run" / "logs" / "probe").resolve()


# --- defect 10: every command that writes a result holds its lock ----------------------------------------------

LOCKED_COMMANDS = {
    "augment": ["augment", "--corpus", "c.txt", "--output", "{out}.jsonl", "--engine", "none"],
    "evaluate": ["evaluate", "model", "--output", "{out}.json"],
    "encode": ["encode", "model", "--input", "c.txt", "--output", "{out}.npy"],
    "probe": ["probe", "model", "--output", "{out}.json"],
    "diagnose": ["diagnose", "model", "--output", "{out}.json"],
    "freq": ["freq", "--corpus", "c.txt", "--tokenizer", "model", "--output", "{out}.json"],
    "bench": ["bench", "suite.yaml", "--output", "{out}"],
    "download-data": ["download-data", "{out}"],
}


@pytest.mark.parametrize("command", sorted(LOCKED_COMMANDS))
def test_a_command_refuses_a_result_another_command_is_writing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr, command: str
) -> None:
    """Two `csekit augment` into one output appended to it at once, silently; every writing command is locked."""
    fcntl = pytest.importorskip("fcntl")
    out = tmp_path / "out" / "result"
    args = [arg.replace("{out}", str(out)) for arg in LOCKED_COMMANDS[command]]
    result = Path(args[args.index("--output") + 1] if "--output" in args else args[-1])
    result.parent.mkdir()
    lock = result.with_name(f".{result.name}.lock")
    with open(lock, "w", encoding="utf-8") as holder:  # another csekit writing the same result
        fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
        holder.write('{"pid": 4242, "host": "elsewhere", "command": "augment"}')
        holder.flush()
        monkeypatch.chdir(tmp_path)
        code, err = run_main(monkeypatch, capsys, *args)
    assert_one_line_error(code, err, str(result), "in use by a running csekit augment (pid 4242 on elsewhere)")
    assert sorted(p.name for p in result.parent.iterdir()) == [lock.name]


def test_a_result_lock_is_released_and_leaves_no_folder_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr
) -> None:
    out = tmp_path / "new" / "deeper" / "e.json"
    code, err = run_main(monkeypatch, capsys, "evaluate", str(tmp_path / "no-model"), "--output", str(out))
    assert code == 2, err
    assert sorted(p.name for p in tmp_path.iterdir()) == []


# --- defect 12: paths that are not UTF-8; counts beyond int64 ---------------------------------------------------


def test_paths_that_are_not_utf8_train_and_save(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr
) -> None:
    """A corpus and an --output whose names hold the byte 0xff: the model card named the corpus, and its write was
    a UnicodeEncodeError traceback at the first save after training."""
    from conftest import make_data_dir

    odd = Path(os.fsdecode(os.fsencode(tmp_path) + b"/odd\xff"))
    odd.mkdir()
    corpus = make_corpus(odd / "c.txt", lines=32)
    recipe = write_recipe(tmp_path, tiny_model_dir, tmp_path / "elsewhere.txt", "  max_steps: 2\n  eval_every: 2\n")
    args = ["train", str(recipe), "--output", str(odd / "run"), "--set", f"data.corpus={corpus}"]
    args += ["--set", "train.dev_task=stsb-dev", "--set", "train.precision=fp32", "--no-progress"]
    code, err = run_main(monkeypatch, capsys, *args, "--data-dir", str(make_data_dir(tmp_path / "data")))
    assert code == 0, err
    card = (odd / "run" / "best" / "README.md").read_bytes()
    assert b"odd\\udcff" in card and card.decode("utf-8")


# --- defect 4: a new run removes only what csekit made -------------------------------------------------------


def train_two_steps(
    run: Path, tmp_path: Path, model: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr
) -> tuple[int, str]:
    """`csekit train` of 2 fp32 steps of `model` on a 32-line corpus into `run`: (exit status, stderr)."""
    recipe = write_recipe(tmp_path, model, make_corpus(tmp_path / "c.txt", lines=32), "  max_steps: 2\n")
    args = ["train", str(recipe), "--output", str(run), "--set", "train.precision=fp32", "--no-progress"]
    return run_main(monkeypatch, capsys, *args)


def test_a_new_run_keeps_the_hidden_tmp_files_it_did_not_make(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr
) -> None:
    run = tmp_path / "run"
    (run / ".scratch.tmp").mkdir(parents=True)
    (run / ".scratch.tmp" / "notes.txt").write_text("mine", encoding="utf-8")
    (run / ".draft.tmp").write_text("mine", encoding="utf-8")
    code, err = train_two_steps(run, tmp_path, tiny_model_dir, monkeypatch, capsys)
    assert code == 0, err
    assert (run / ".scratch.tmp" / "notes.txt").is_file() and (run / ".draft.tmp").is_file()
    assert "removed" not in err


def test_a_checkpoint_staging_name_csekit_did_not_make_is_refused_before_training(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr
) -> None:
    run = tmp_path / "run"
    (run / ".checkpoint.tmp").mkdir(parents=True)
    (run / ".checkpoint.tmp" / "notes.txt").write_text("mine", encoding="utf-8")
    code, err = train_two_steps(run, tmp_path, tiny_model_dir, monkeypatch, capsys)
    assert_one_line_error(code, err, str(run / ".checkpoint.tmp"), "did not make it")
    assert sorted(p.name for p in run.iterdir()) == [".checkpoint.tmp"]
    assert (run / ".checkpoint.tmp" / "notes.txt").read_text(encoding="utf-8") == "mine"


def test_a_result_whose_folder_cannot_be_made_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x", encoding="utf-8")
    code, err = run_main(monkeypatch, capsys, "evaluate", "model", "--output", str(blocker / "sub" / "e.json"))
    assert_one_line_error(code, err, str(blocker / "sub" / "e.json"))


def test_the_lock_of_a_result_named_by_dots_is_beside_the_folder_it_names(tmp_path: Path) -> None:
    from csekit.core.run_lock import result_lock

    (tmp_path / "a" / "b").mkdir(parents=True)
    assert result_lock(tmp_path / "a" / "b" / "..") == tmp_path / ".a.lock"
    assert result_lock(tmp_path / "a" / ".") == tmp_path / ".a.lock"
    assert result_lock(Path("/")) == Path("/.lock")

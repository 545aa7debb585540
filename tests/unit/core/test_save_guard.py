"""Mechanism 4 of issue #39: every failure of a save is one line naming the folder, and the last good checkpoint
is intact. A real file-size limit (`ulimit -f`), not a faked OSError: torch.save then raises RuntimeError and
safetensors SafetensorError, which a handler of OSError alone let through as a traceback.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_csekit, train_finished_run

UNDER_A_FILE_SIZE_LIMIT = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails with EFBIG instead of killing
limit = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
sys.argv = ["csekit", *sys.argv[2:]]
from csekit.cli import main
main()
"""


def run_under_file_size_limit(limit: int, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`csekit ARGS` in a fresh interpreter where no file may grow beyond `limit` bytes."""
    command = [sys.executable, "-c", UNDER_A_FILE_SIZE_LIMIT, str(limit), *args]
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-step run with a checkpoint at step 2 (copy it before changing it)."""
    return train_finished_run(tmp_path_factory.mktemp("finished"))


def checkpoint_bytes(run: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted((run / "checkpoint").iterdir())}


@pytest.mark.parametrize("writer", ["safetensors", "torch.save"])
def test_a_real_file_size_limit_while_saving_is_one_line_and_keeps_the_last_good_checkpoint(
    finished_run: Path, tmp_path: Path, writer: str
) -> None:
    """safetensors: best/'s weights are the first file past the limit (SafetensorError); torch.save: the limit lets
    every weight file through and stops the optimizer state, twice their size. Both were tracebacks. torch.save
    now writes into core/atomic's handle, so its failure reaches the guard as the OSError of that handle (EFBIG,
    "File too large"); torch's own RuntimeError of a path-based save is the next test's case."""
    run = Path(shutil.copytree(finished_run / "run", tmp_path / "run"))
    weights = (run / "checkpoint" / "model.safetensors").stat().st_size
    limit = weights // 2 if writer == "safetensors" else weights + weights // 2
    assert (run / "checkpoint" / "optimizer.pt").stat().st_size > limit  # the limit stops what the case names
    before = checkpoint_bytes(run)
    more = ("--set", "train.max_steps=4", "--allow-changes")
    result = run_under_file_size_limit(limit, "train", "--output", str(run), "--resume", *more, cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("csekit: error: cannot write "), result.stderr
    assert str(run) in last and f"the last good checkpoint ({run / 'checkpoint'}, step 2) is intact" in last
    assert "--resume" in last and ("File too large" if writer == "torch.save" else "SafetensorError") in last
    assert checkpoint_bytes(run) == before  # intact, and it is
    assert not (run / ".checkpoint.tmp").exists()  # no half-written staging folder left taking the space
    finished = run_csekit("train", "--output", str(run), "--resume", *more, cwd=tmp_path)
    assert finished.returncode == 0, finished.stderr  # the intact checkpoint resumes once there is space
    assert json.loads((run / "checkpoint" / "trainer_state.json").read_text())["step"] == 4


def test_only_save_failures_are_reworded_around_a_training_loop() -> None:
    """A RuntimeError of a forward pass inside the loop is not a full disk: it passes through unchanged."""
    from csekit.core.save_guard import SaveFailed, guarded_save, saves_keep

    with pytest.raises(RuntimeError, match="size of tensor"), saves_keep("the checkpoint is intact"):
        raise RuntimeError("The size of tensor a (88) must match the size of tensor b (64)")
    expected = r"cannot write x.pt in /run \(File too large\); the checkpoint is intact"
    loop, save = saves_keep("the checkpoint is intact"), guarded_save("x.pt", "/run", "the previous x.pt is kept")
    with pytest.raises(SaveFailed, match=expected), loop, save:
        raise OSError(27, "File too large")


def test_torch_saves_own_failure_is_one_line_too() -> None:
    """torch.save to a path fails inside its zip writer with a RuntimeError, not an OSError (a full disk)."""
    from csekit.core.save_guard import SaveFailed, guarded_save

    message = "[enforce fail at inline_container.cc:595] . unexpected pos 576 vs 534"
    expected = r"cannot write x.pt in /run \(.*unexpected pos 576 vs 534"
    with pytest.raises(SaveFailed, match=expected), guarded_save("x.pt", "/run", "the previous x.pt is kept"):
        raise RuntimeError(message)

"""Atomic writes: a failure never leaves a half-written file or model directory."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from csekit.core.atomic import atomic_directory, atomic_write_text, recover_directory, swap_in, write_by_name


def test_failed_directory_write_leaves_the_old_one_intact(tmp_path: Path) -> None:
    target = tmp_path / "best"
    with atomic_directory(target) as tmp:
        (tmp / "weights").write_text("v1", encoding="utf-8")
    with pytest.raises(RuntimeError), atomic_directory(target) as tmp:
        (tmp / "weights").write_text("half", encoding="utf-8")
        raise RuntimeError("killed mid-write")
    assert (target / "weights").read_text(encoding="utf-8") == "v1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best"]  # no temporary left behind


def test_successful_write_replaces_the_whole_directory(tmp_path: Path) -> None:
    target = tmp_path / "best"
    with atomic_directory(target) as tmp:
        (tmp / "old-only").write_text("x", encoding="utf-8")
    with atomic_directory(target) as tmp:
        (tmp / "weights").write_text("v2", encoding="utf-8")
    assert sorted(p.name for p in target.iterdir()) == ["weights"]


def test_recover_finishes_a_swap_interrupted_between_renames(tmp_path: Path) -> None:
    old = tmp_path / "best.old"
    old.mkdir()
    (old / "weights").write_text("v1", encoding="utf-8")
    recover_directory(tmp_path / "best")
    assert (tmp_path / "best" / "weights").read_text(encoding="utf-8") == "v1"


def test_atomic_text_write(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "r.json"
    atomic_write_text(path, "{}")
    atomic_write_text(path, '{"a": 1}')
    assert path.read_text(encoding="utf-8") == '{"a": 1}'
    assert [p.name for p in path.parent.iterdir()] == ["r.json"]


@pytest.fixture(params=[0o022, 0o077, 0o002], ids=["umask022", "umask077", "umask002"])
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    """Run the test under this umask (restored afterwards)."""
    previous = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(previous)


def modes(root: Path) -> dict[str, int]:
    """Permission bits of `root` and everything below it, by relative path."""
    found = {".": stat.S_IMODE(root.stat().st_mode)}
    for path in root.rglob("*"):
        found[str(path.relative_to(root))] = stat.S_IMODE(path.stat().st_mode)
    return found


def test_model_folder_files_follow_the_umask(tmp_path: Path, umask: int) -> None:
    """What a plain mkdir/open gives under the umask, also for files written 0600 (safetensors)."""
    from conftest import make_tiny_encoder

    make_tiny_encoder(tmp_path / "tok").save(tmp_path / "best")
    found = modes(tmp_path / "best")
    folders = {name for name in found if (tmp_path / "best" / name).is_dir()}
    assert {"model.safetensors", "1_Pooling", "csekit.json"} <= set(found)
    assert {name: mode for name, mode in found.items() if name in folders} == dict.fromkeys(folders, 0o777 & ~umask)
    files = {name: mode for name, mode in found.items() if name not in folders}
    assert files == dict.fromkeys(files, 0o666 & ~umask)


def test_atomic_text_file_follows_the_umask(tmp_path: Path, umask: int) -> None:
    atomic_write_text(tmp_path / "r.json", "{}")
    assert stat.S_IMODE((tmp_path / "r.json").stat().st_mode) == 0o666 & ~umask


def test_a_file_a_saver_writes_by_name_follows_the_umask(tmp_path: Path, umask: int) -> None:
    """safetensors makes its own file, 0600 whatever the umask; what lands under the name gets the umask's modes."""
    import torch
    from safetensors.torch import save_file

    write_by_name(tmp_path / "w.safetensors", lambda name: save_file({"x": torch.zeros(2)}, name))
    assert stat.S_IMODE((tmp_path / "w.safetensors").stat().st_mode) == 0o666 & ~umask


def test_committing_a_staged_file_refuses_a_link_at_the_target(tmp_path: Path) -> None:
    """As every rename into place here: a link at the target is refused, not replaced (a resumable download's end)."""
    from csekit.core.atomic import commit_staged_file
    from csekit.core.errors import CsekitError

    staged, mine = tmp_path / ".corpus.txt.part", tmp_path / "mine.txt"
    staged.write_bytes(b"downloaded\n")
    mine.write_bytes(b"mine\n")
    (tmp_path / "corpus.txt").symlink_to(mine)
    with pytest.raises(CsekitError, match="symbolic link"):
        commit_staged_file(staged, tmp_path / "corpus.txt")
    assert (tmp_path / "corpus.txt").is_symlink() and mine.read_bytes() == b"mine\n"
    (tmp_path / "corpus.txt").unlink()
    commit_staged_file(staged, tmp_path / "corpus.txt")
    assert (tmp_path / "corpus.txt").read_bytes() == b"downloaded\n" and not staged.exists()


def test_swap_in_gives_staged_files_the_umask_modes(tmp_path: Path, umask: int) -> None:
    staging = tmp_path / ".checkpoint.tmp"
    (staging / "sub").mkdir(parents=True)
    for name, mode in (("private", 0o600), ("sub/tool", 0o700)):
        (staging / name).write_text("x", encoding="utf-8")
        os.chmod(staging / name, mode)
    os.chmod(staging, 0o700)
    swap_in(staging, tmp_path / "checkpoint")
    assert modes(tmp_path / "checkpoint") == {
        ".": 0o777 & ~umask,
        "sub": 0o777 & ~umask,
        "private": 0o666 & ~umask,
        "sub/tool": 0o777 & ~umask,  # an executable stays executable, as far as the umask allows
    }


def test_current_umask_reads_the_process_umask(umask: int) -> None:
    from csekit.core.atomic import current_umask

    assert current_umask() == umask


def test_staging_leftovers_are_removed_and_nothing_else(tmp_path: Path) -> None:
    """Only what csekit can tell it made: a hidden *.tmp folder holding its marker, a staging file of one of the
    folder's own files. Issue #49 defect 4: every hidden *.tmp file and folder was removed (someone's own)."""
    from csekit.core.atomic import STAGING_MARKER, remove_staging_leftovers

    for folder in (".best.1a2b3c4d.tmp", ".checkpoint.tmp", "best", ".git", ".mine.tmp", ".last.0a1b2c3d.tmp"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "model.safetensors").write_text("x", encoding="utf-8")
    for folder in (".best.1a2b3c4d.tmp", ".checkpoint.tmp"):  # what a killed csekit left
        (tmp_path / folder / STAGING_MARKER).write_text("", encoding="utf-8")
    names = (".metrics.jsonl.9f8e7d6c.tmp", "metrics.jsonl", "notes.tmp", ".lock", ".notes.tmp", ".x.9f8e7d6c.tmp")
    for name in names:
        (tmp_path / name).write_text("x", encoding="utf-8")
    removed = remove_staging_leftovers(tmp_path, ("metrics.jsonl", "recipe.yaml"))
    assert removed == [".best.1a2b3c4d.tmp", ".checkpoint.tmp", ".metrics.jsonl.9f8e7d6c.tmp"]
    kept = [".git", ".last.0a1b2c3d.tmp", ".lock", ".mine.tmp", ".notes.tmp", ".x.9f8e7d6c.tmp", "best"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [*kept, "metrics.jsonl", "notes.tmp"]

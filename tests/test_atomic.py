"""Atomic writes: a failure never leaves a half-written file or model directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from csekit.atomic import atomic_directory, atomic_write_text, recover_directory


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

"""No project file names a path of a development machine (issue 50).

A path such as a user's home folder, a shared work folder or a Windows user folder in a docstring, a
recipe, a benchmark or a document works on one machine only, and tells a reader where someone once
ran something instead of how to run it. The check reads every file git tracks (binary files aside).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

_NAME = r"[A-Za-z0-9_.-]+"
_SEP = r"(?:\\\\|\\|/)"  # a Windows separator as written in text, in a string literal or in JSON
MACHINE_PATH = re.compile(
    # A Unix path starts a word: not inside a URL, `$HOME/work/...`, `~/...` or a relative `runs/work/...`.
    rf"(?<![\w.~$/-])/(?:home|Users|work|root|mnt|media)/{_NAME}"
    rf"|(?<![\w.~$/-])/(?:private/)?var/folders/"
    rf"|(?<![\w.~$/-])/tmp/pytest-of-{_NAME}"
    rf"|\b[A-Za-z]:{_SEP}(?:Users|Documents and Settings){_SEP}"
)
"""Absolute paths that name a user's machine: home folders (Linux, macOS, root's), a machine's work or
mount folders, macOS's and pytest's per-user temporary folders, Windows user folders."""

ALLOWED: frozenset[tuple[str, str]] = frozenset()
"""(file, path) pairs written on purpose; none today. `/tmp/gpu-check-site` in benchmarks/gpu_check* is a scratch
folder on the GPU machine, which this check does not look for."""


def tracked_text_files(repo: Path) -> list[Path]:
    """Every file git tracks in `repo` whose bytes are text (UTF-8, no NUL byte)."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=repo, capture_output=True, check=True).stdout
    files = []
    for name in filter(None, listed.decode("utf-8").split("\0")):
        path = repo / name
        if not path.is_file():  # deleted in the work tree, not yet in the index
            continue
        data = path.read_bytes()
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        if b"\0" not in data:
            files.append(path)
    return files


def machine_paths(repo: Path) -> list[str]:
    """`file:line: path` for each machine path in a tracked text file of `repo`, the allowed ones aside."""
    found = []
    for path in tracked_text_files(repo):
        name = path.relative_to(repo).as_posix()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for match in MACHINE_PATH.finditer(line):
                if (name, match.group()) not in ALLOWED:
                    found.append(f"{name}:{number}: {match.group()}")
    return found


def test_no_tracked_file_names_a_path_of_a_development_machine() -> None:
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout: no list of tracked files")
    found = machine_paths(REPO)
    assert not found, "machine paths in project files (say how to run it instead):\n" + "\n".join(found)


def test_the_check_finds_a_planted_machine_path_and_only_machine_paths(tmp_path: Path) -> None:
    # Written in pieces so that this file does not hold the paths it plants.
    home, work, windows = "/" + "home/alice/csekit", "/" + "work/shared/data", "C:" + "\\\\Users\\\\alice"
    (tmp_path / "notes.md").write_text(f"ran in {home}\n\nCSEKIT_DATA={work} csekit evaluate\n", encoding="utf-8")
    (tmp_path / "run.json").write_text(f'{{"output": "{windows}\\\\runs"}}\n', encoding="utf-8")
    (tmp_path / "clean.md").write_text(
        "https://example.org/home/page, $HOME/work/x, ~/data, runs/work/best, /tmp/site\n", encoding="utf-8"
    )
    (tmp_path / "weights.bin").write_bytes(f"\0{home}".encode())  # binary: not read
    (tmp_path / "untracked.md").write_text(home, encoding="utf-8")  # not tracked: not a project file
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run(["git", "add", "notes.md", "run.json", "clean.md", "weights.bin"], cwd=tmp_path, check=True)

    assert machine_paths(tmp_path) == [
        "notes.md:1: /" + "home/alice",  # the path up to the user's name is enough to show
        "notes.md:3: /" + "work/shared",
        "run.json:1: C:" + "\\\\Users\\\\",
    ]

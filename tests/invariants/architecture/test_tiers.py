"""The tests' tiers (issue 66 item 4): every test file sits in a tier folder, is marked by it, and is importable by
name from any folder; the fast tier (`make test-fast`, conftest.FAST_FOLDERS) imports every module of src/csekit.

A test file directly in tests/ or in a folder that is no tier would run in `make test` but in no tier, and one in a
folder missing from pytest's `pythonpath` could not be imported by another test file run alone: both fail here.

A module counts as imported by a fast test file when the file imports it, or imports a module that imports
it when it is loaded (module-level imports, followed through; a function's own imports run only when it is
called, so they do not count). A new module that no fast test file reaches fails here, naming it.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from conftest import FAST_FOLDERS, REPO, TESTS, TIERS, slow_first, tier_markers

SOURCE = REPO / "src"


def collected_files(root: Path) -> list[Path]:
    """The files pytest collects under `root` (its default `python_files`: test_*.py and *_test.py)."""
    return sorted({*root.rglob("test_*.py"), *root.rglob("*_test.py")})


def outside_the_tiers(root: Path) -> list[str]:
    """The test files under `root` that sit directly in it or in a folder that is no tier (no tier marker)."""
    return [
        path.relative_to(root).as_posix()
        for path in collected_files(root)
        if len(path.relative_to(root).parts) < 2 or path.relative_to(root).parts[0] not in TIERS
    ]


def fast_files(root: Path) -> list[Path]:
    """The test files of the fast tier: those `tier_markers` marks `fast`."""
    return [path for path in collected_files(root) if "fast" in tier_markers(path, root)]


def csekit_modules() -> dict[str, Path]:
    """Every module under src/csekit by dotted name (a package by its own name)."""
    modules = {}
    for path in sorted((SOURCE / "csekit").rglob("*.py")):
        parts = path.relative_to(SOURCE).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def imported_names(path: Path, module_level_only: bool) -> set[str]:
    """The dotted names a file imports (`from a import b` gives a and a.b), at module level or anywhere."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = tree.body if module_level_only else list(ast.walk(tree))
    if module_level_only:  # `if TYPE_CHECKING:` blocks never run; `try:` bodies do
        nodes = [n for node in nodes for n in ([*node.body, *node.finalbody] if isinstance(node, ast.Try) else [node])]
    names: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
    return names


def with_parents(name: str) -> set[str]:
    """Importing a.b.c loads a and a.b first."""
    parts = name.split(".")
    return {".".join(parts[: i + 1]) for i in range(len(parts))}


def reached_by(test_files: list[Path]) -> set[str]:
    """The csekit modules loaded by importing `test_files`: their imports, followed through module-level imports."""
    modules = csekit_modules()
    pending = {name for path in test_files for name in imported_names(path, module_level_only=False)}
    reached: set[str] = set()
    while pending:
        for name in with_parents(pending.pop()):
            if name in modules and name not in reached:
                reached.add(name)
                pending |= imported_names(modules[name], module_level_only=True)
    return reached


def test_every_test_file_is_in_a_tier_folder() -> None:
    misplaced = outside_the_tiers(TESTS)
    assert not misplaced, f"move {', '.join(misplaced)} into a tier folder of tests/ ({', '.join(TIERS)})"


def test_a_test_file_outside_the_tiers_is_found(tmp_path: Path) -> None:
    loose = ["check_test.py", "data/test_in_data.py", "misc/test_elsewhere.py", "test_loose.py"]
    for name in [*loose, "unit/core/test_kept.py", "runs/check_test.py", "invariants/helper.py"]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("", encoding="utf-8")
    assert outside_the_tiers(tmp_path) == loose


def test_each_folder_gives_its_markers() -> None:
    assert tier_markers(TESTS / "unit" / "core" / "test_x.py", TESTS) == ["unit", "fast"]
    assert tier_markers(TESTS / "methods" / "test_x.py", TESTS) == ["methods"]
    assert tier_markers(TESTS / "runs" / "test_x.py", TESTS) == ["runs"]
    assert tier_markers(TESTS / "invariants" / "test_x.py", TESTS) == ["invariants"]
    assert tier_markers(TESTS / "invariants" / "architecture" / "test_x.py", TESTS) == ["invariants", "fast"]
    assert tier_markers(TESTS / "test_x.py", TESTS) == [] and tier_markers(TESTS / "misc" / "test_x.py", TESTS) == []
    assert tier_markers(REPO / "benchmarks" / "test_x.py", TESTS) == []


def test_this_files_tests_carry_its_folders_markers(request: pytest.FixtureRequest) -> None:
    markers = {marker.name for marker in request.node.iter_markers()}
    assert {"invariants", "fast"} <= markers and not markers & {"unit", "methods", "runs"}


class _Item:
    """A collected test as slow_first sees it: a name and its markers."""

    def __init__(self, name: str, slow: bool) -> None:
        self.name, self.slow = name, slow

    def get_closest_marker(self, name: str) -> object | None:
        return object() if name == "slow" and self.slow else None


def test_slow_tests_run_first_and_each_group_keeps_its_order() -> None:
    items = [_Item(name, slow=name.startswith("s")) for name in ["a", "s1", "b", "s2", "c"]]
    slow_first(items)  # type: ignore[arg-type]
    assert [item.name for item in items] == ["s1", "s2", "a", "b", "c"]


def test_every_marker_is_declared(pytestconfig: pytest.Config) -> None:
    declared = {line.split(":")[0].strip() for line in pytestconfig.getini("markers")}
    assert not {*TIERS, "fast", "slow"} - declared, "declare the markers in pyproject.toml's [tool.pytest.ini_options]"
    assert all(folder.split("/")[0] in TIERS for folder in FAST_FOLDERS)


def test_every_test_folder_is_on_the_pythonpath(pytestconfig: pytest.Config) -> None:
    """Test files import each other by name (`from test_architecture import SRC`) across folders."""
    pythonpath = {Path(entry).resolve() for entry in pytestconfig.getini("pythonpath")}
    folders = {path.parent for path in collected_files(TESTS)}
    missing = sorted(folder.relative_to(REPO).as_posix() for folder in folders - pythonpath)
    assert not missing, f"add {', '.join(missing)} to pythonpath in pyproject.toml's [tool.pytest.ini_options]"
    assert TESTS in pythonpath  # the shared helpers (conftest, resumed_runs, ...) stay in tests/


def test_no_two_test_files_share_a_name() -> None:
    """pytest imports a test file by its name (the default import mode): two of one name cannot both load."""
    shared = [name for name, count in Counter(path.name for path in collected_files(TESTS)).items() if count > 1]
    assert not shared, f"test files of one name in two folders: {', '.join(shared)}"


def test_the_fast_tier_imports_every_module() -> None:
    fast = fast_files(TESTS)
    assert len(fast) > len(FAST_FOLDERS), fast
    missing = sorted(set(csekit_modules()) - reached_by(fast))
    assert not missing, f"no test file of the fast tier ({', '.join(FAST_FOLDERS)}) imports {', '.join(missing)}"


def test_the_check_follows_module_level_imports_only(tmp_path: Path) -> None:
    test_file = tmp_path / "test_x.py"
    test_file.write_text("from csekit.core.errors import CsekitError\n", encoding="utf-8")
    reached = reached_by([test_file])
    assert {"csekit", "csekit.core", "csekit.core.errors"} <= reached
    assert "csekit.training.trainer" not in reached and "csekit.cli" not in reached
    lazy = tmp_path / "test_lazy.py"
    lazy.write_text("def test():\n    from csekit.cli import app\n", encoding="utf-8")
    reached = reached_by([lazy])
    assert "csekit.cli" in reached and "csekit.bench" not in reached  # cli imports bench inside a function


def test_no_test_file_is_ignored_by_git_or_ruff() -> None:
    """An ignore pattern that matches a tier folder (`runs/` matched tests/runs/) hides new test files from git and
    every test file there from ruff, which reads .gitignore: each file is checked against the patterns git reads."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    files = [str(path.relative_to(REPO)) for path in sorted(TESTS.rglob("*.py"))]
    ignored = subprocess.run(
        ["git", "check-ignore", "--no-index", "--stdin"],
        input="\n".join(files),
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    ).stdout.split()
    assert not ignored, f"ignored by .gitignore, so unseen by git and ruff: {', '.join(ignored)}"

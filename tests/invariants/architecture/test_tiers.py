"""`make test-quick`: the tests of conftest.QUICK_FILES, marked `quick`, import every module of src/csekit.

A module counts as imported by a quick test file when the file imports it, or imports a module that imports
it when it is loaded (module-level imports, followed through; a function's own imports run only when it is
called, so they do not count). A new module that no quick test file reaches fails here, naming it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from conftest import QUICK_FILES

TESTS = Path(__file__).resolve().parent
SOURCE = TESTS.parent / "src"


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


def test_the_quick_subset_imports_every_module() -> None:
    quick = sorted(TESTS / name for name in QUICK_FILES)
    assert all(path.is_file() for path in quick), [path.name for path in quick if not path.is_file()]
    missing = sorted(set(csekit_modules()) - reached_by(quick))
    assert not missing, f"no quick test file (conftest.QUICK_FILES) imports {', '.join(missing)}"


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


def test_quick_tests_are_marked(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("quick") is not None

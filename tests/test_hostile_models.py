"""Issue #49 ("Hostile files III"): YAML that skipped the bounded parser (defect 3), model-folder config values
outside the checked list (5), half-precision checkpoints (6, = #47 item 3) and the files transformers reads in a
model folder by itself (7). Each test here failed (a hang, a traceback or a silent wrong model) before the fix.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import assert_one_line_error, run_main, write_recipe

from csekit.core.errors import CsekitError
from csekit.training.recipe import load_recipe

CaptureErr = pytest.CaptureFixture[str]

# --- 3: every YAML value goes through the bounded parser ------------------------------------------------------

FLOW_ALIAS_BOMB = (
    "[&a [x, x, x, x, x, x, x, x, x, x], "
    + ", ".join(
        f"&{name} [{', '.join([f'*{previous}'] * 10)}]" for previous, name in zip("abcdefgh", "bcdefghi", strict=True)
    )
    + "]"
)
"""One line of nine levels of ten aliases (about 400 bytes, 10^9 values): OmegaConf expanded it (a hang)."""


def test_an_alias_bomb_in_a_set_value_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr
) -> None:
    recipe = write_recipe(tmp_path, tmp_path / "model", tmp_path / "corpus.txt")
    args = ("train", str(recipe), "--output", str(tmp_path / "run"), "--set", f"model.templates={FLOW_ALIAS_BOMB}")
    code, err = run_main(monkeypatch, capsys, *args)
    assert_one_line_error(code, err, "--set model.templates", "expands to more than")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("depth", [40, 5000])
def test_a_deeply_nested_set_value_is_one_line(depth: int) -> None:
    """5,000 levels was a RecursionError traceback; 40 passed PyYAML and reached recursive code further on."""
    with pytest.raises(CsekitError, match=r"--set model\.templates.*(nests more than 32 levels|nests too deeply)"):
        load_recipe(None, [f"model.templates={'[' * depth}x{']' * depth}"])


def test_a_set_value_that_is_not_yaml_is_still_its_text() -> None:
    """Guard: a value PyYAML cannot parse is the text itself, as before (`a: b` is a mapping, `a: b: c` not)."""
    assert load_recipe(None, ["model.backbone=a: b: c"]).model.backbone == "a: b: c"


def test_an_alias_bomb_in_a_suite_set_string_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr
) -> None:
    """The suite file itself is small and passes the bounds; its `set:` string was parsed by yaml.safe_load."""
    recipe = write_recipe(tmp_path, tmp_path / "model", tmp_path / "corpus.txt")
    suite = tmp_path / "suite.yaml"
    entry = {"recipe": str(recipe), "name": "bomb", "set": [f"model.templates={FLOW_ALIAS_BOMB}"]}
    suite.write_text(yaml.safe_dump({"recipes": [entry], "seeds": [0], "tasks": ["STSBenchmark"]}), encoding="utf-8")
    assert suite.stat().st_size < 600
    code, err = run_main(monkeypatch, capsys, "bench", str(suite), "--output", str(tmp_path / "out"))
    assert_one_line_error(code, err, "--set model.templates", "expands to more than")

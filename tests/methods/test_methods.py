"""One method list: `csekit.methods` is what `csekit --help`, the README, pyproject.toml, docs/architecture.md and
`csekit recipes` say, and every shipped recipe says what it has been checked against."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from csekit.cli import app
from csekit.commands.recipes import NOT_LISTED, default_recipes_dir, recipe_rows
from csekit.evaluation.published import load_published
from csekit.methods import METHODS, RECIPE_CHECKS, STATUSES, method_names, methods_table, recipes_of

REPO = Path(__file__).resolve().parents[2]
RECIPES = REPO / "recipes"
PUBLISHED = REPO / "benchmarks" / "published"


def unlisted_recipes(folder: Path) -> list[str]:
    """The recipe files of `folder` that csekit.methods.RECIPE_CHECKS has no entry for."""
    return [path.stem for path in sorted(folder.glob("*.yaml")) if path.stem not in RECIPE_CHECKS]


def test_every_shipped_recipe_says_what_it_has_been_checked_against() -> None:
    missing = unlisted_recipes(RECIPES)
    entries = "\n".join(f'    "{name}": _check("METHOD", "never-run", _OFFLINE),' for name in missing)
    assert not missing, (
        f"add to RECIPE_CHECKS in src/csekit/methods.py (METHOD: a name of METHODS, or several joined by ' + '; "
        f"status: {', '.join(STATUSES)}; the last argument: where it was measured, or why never):\n{entries}"
    )
    gone = sorted(set(RECIPE_CHECKS) - {path.stem for path in RECIPES.glob("*.yaml")})
    assert not gone, f"RECIPE_CHECKS in src/csekit/methods.py names recipes that recipes/ no longer has: {gone}"


def test_the_completeness_check_finds_a_recipe_without_an_entry(tmp_path: Path) -> None:
    (tmp_path / "quickstart.yaml").write_text("model: {backbone: minilm-l6}\n", encoding="utf-8")
    (tmp_path / "my-new-method.yaml").write_text("model: {backbone: minilm-l6}\n", encoding="utf-8")
    assert unlisted_recipes(tmp_path) == ["my-new-method"]
    rows = {row.name: row for row in recipe_rows(tmp_path, PUBLISHED)}
    assert rows["my-new-method"].status == NOT_LISTED and rows["quickstart"].status == "measured"


def test_each_check_names_known_methods_a_status_and_a_source_that_exists() -> None:
    names = set(method_names())
    published = {name for path in PUBLISHED.glob("*.yaml") for name, row in load_published(path).items() if row.scores}
    for recipe, check in RECIPE_CHECKS.items():
        assert check.methods and set(check.methods) <= names, (recipe, check.methods)
        assert check.status in STATUSES, (recipe, check.status)
        assert check.source.strip(), recipe
        for page in re.findall(r"docs/[\w-]+\.md", check.source):
            assert (REPO / page).is_file(), (recipe, page)
        if check.status == "measured":
            assert re.search(r"docs/[\w-]+\.md", check.source), f"{recipe}: a measurement names its page"
        if check.status == "reproduced":
            assert recipe in published, f"{recipe}: reproduced, but benchmarks/published has no row to compare with"


def test_the_measured_sources_name_sections_their_pages_have() -> None:
    """`docs/PAGE.md, Section ...`: the page has a heading that starts with that section's name."""
    for recipe, check in [*RECIPE_CHECKS.items(), *((m.name, m) for m in METHODS if m.measured_in)]:
        text = getattr(check, "source", None) or check.measured_in
        for page, section in re.findall(r"(docs/[\w-]+\.md), ([A-Z][^:(;]*)", text):
            headings = re.findall(r"^#+ (.*)$", (REPO / page).read_text(encoding="utf-8"), flags=re.MULTILINE)
            assert any(h.startswith(section.strip()) for h in headings), (recipe, page, section)


def test_each_method_has_its_recipe_or_says_how_to_use_it() -> None:
    assert len(METHODS) == len(set(method_names())) == 17
    for method in METHODS:
        assert re.fullmatch(r"[^,]+, (19|20)\d\d", method.paper), method
        if method.recipe is None:
            assert method.usage and method.measured_in, method.name
            continue
        stem = method.recipe.removesuffix(".yaml")
        assert (RECIPES / method.recipe).is_file(), method.recipe
        assert method.name in RECIPE_CHECKS[stem].methods, method
        assert recipes_of(method.name), method.name


def test_csekit_help_names_every_method() -> None:
    result = CliRunner().invoke(app, ["--help"], terminal_width=400)
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    missing = [name for name in method_names() if name not in text]
    assert not missing, missing


def test_the_readme_methods_table_is_the_method_list() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## The methods\n", 1)[1].split("\n## ", 1)[0]
    table = "\n".join(line for line in section.splitlines() if line.startswith("|"))
    assert table == methods_table(), (
        "README.md's methods table differs from src/csekit/methods.py; paste the output of\n"
        "PYTHONPATH=src python -c 'from csekit.methods import methods_table; print(methods_table())'"
    )


def _in_order(text: str, names: list[str]) -> bool:
    positions = [text.find(name) for name in names]
    return -1 not in positions and positions == sorted(positions)


def test_pyproject_description_names_every_method_in_order() -> None:
    pyproject = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    (description,) = re.findall(r'^description = "(.*)"$', pyproject, flags=re.MULTILINE)  # tomllib: Python 3.11+
    assert _in_order(description, method_names()), description
    assert not _in_order("SimCSE, DCLR", ["DCLR", "SimCSE"])  # the check sees the order


def test_architecture_names_every_method_and_its_parts_table_follows_the_list() -> None:
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    intro = text.split("\n## ", 1)[0]
    assert _in_order(" ".join(intro.split()), method_names()), "docs/architecture.md's opening names the methods"
    section = text.split("\n## Where each method's parts live\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1].strip() for line in section.splitlines() if line.startswith("| ")]
    assert rows[1:] == method_names(), rows


def test_architecture_names_every_module() -> None:
    """The map of docs/architecture.md names each module file of src/csekit by its file name."""
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    modules = sorted((REPO / "src" / "csekit").rglob("*.py"))
    missing = [str(p.relative_to(REPO / "src")) for p in modules if p.name != "__init__.py" and p.name not in text]
    assert not missing, f"docs/architecture.md's map does not name: {missing}"


def test_csekit_recipes_lists_every_recipe_with_its_backbone_status_and_published_average() -> None:
    result = CliRunner().invoke(app, ["recipes", "--dir", str(RECIPES)])
    assert result.exit_code == 0, result.output
    lines = {line.split()[0]: line.split() for line in result.output.splitlines() if line.strip()}
    for path in RECIPES.glob("*.yaml"):
        assert path.stem in lines, path.stem
    assert lines["simcse-bert-base"][-3:] == ["bert-base-uncased", "never-run", "76.25"]
    assert lines["quickstart"][-3:] == ["minilm-l6", "measured", "-"]
    assert "LLM2Vec + SimCSE" in " ".join(lines["llm2vec-simcse-sheared-llama"])
    assert all(f"{status}:" in result.output for status in STATUSES)


def test_csekit_recipes_finds_the_checkout_from_another_folder_and_says_where_each_status_comes_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert default_recipes_dir() == RECIPES
    result = CliRunner().invoke(app, ["recipes", "--sources"])
    assert result.exit_code == 0 and RECIPE_CHECKS["tsdae-minilm"].source in result.output
    result = CliRunner().invoke(app, ["recipes", "--dir", str(tmp_path / "none")])
    assert result.exit_code != 0 and "no recipes folder" in str(result.exception)

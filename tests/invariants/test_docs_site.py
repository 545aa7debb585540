"""docs/ builds as a site with strict warnings: a broken link or anchor, a page left out of the navigation or a
docstring the API reference cannot read fails here, as it would fail `mkdocs build --strict`.

mkdocs and mkdocstrings are development dependencies (pyproject.toml's dev extras, installed by `make test`'s
set-up), so this test fails rather than skips without them.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "mkdocs.yml"


def nav_pages(nav: list) -> list[str]:
    """Every page file a mkdocs navigation names, at any depth."""
    pages = []
    for entry in nav:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        pages += nav_pages(value) if isinstance(value, list) else [value]
    return pages


def site_config() -> dict:
    """mkdocs.yml as plain YAML (it has no tags)."""
    return yaml.safe_load(CONFIG.read_text(encoding="utf-8"))


def test_the_site_builds_with_strict_warnings_and_has_the_api_reference(tmp_path: Path) -> None:
    site = tmp_path / "site"
    command = [
        sys.executable,
        "-m",
        "mkdocs",
        "build",
        "--strict",
        "--config-file",
        str(CONFIG),
        "--site-dir",
        str(site),
    ]
    built = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, check=False)
    assert built.returncode == 0, built.stderr[-3000:]
    api = (site / "api" / "index.html").read_text(encoding="utf-8")
    assert "SentenceEncoder" in api and "RECIPE_CHECKS" in api and "register_part" in api
    assert (site / "results" / "training_curves.png").is_file()  # the pages' images come along


def test_every_page_is_in_the_navigation_and_every_warning_fails() -> None:
    """Cheap checks of what the build above relies on: strict mode, each validation a warning, each page listed."""
    config = site_config()
    assert config["strict"] is True
    for group in ("nav", "links"):
        assert set(config["validation"][group].values()) == {"warn"}, group
    pages = nav_pages(config["nav"])
    assert sorted(pages) == sorted(path.name for path in (REPO / "docs").glob("*.md")), pages
    assert nav_pages([{"A": "a.md"}, {"B": [{"C": "c.md"}, "d.md"]}]) == ["a.md", "c.md", "d.md"]


def test_the_readme_and_the_home_page_point_at_every_page() -> None:
    """The README's "Where the rest lives" and the site's home page each name every page of docs/."""
    readme = (REPO / "README.md").read_text(encoding="utf-8").split("\n## Where the rest lives\n", 1)[1]
    home = (REPO / "docs" / "index.md").read_text(encoding="utf-8")
    pages = sorted(path.name for path in (REPO / "docs").glob("*.md") if path.name != "index.md")
    assert not [page for page in pages if f"docs/{page}" not in readme], "README.md, Where the rest lives"
    assert not [page for page in pages if f"]({page})" not in home], "docs/index.md"

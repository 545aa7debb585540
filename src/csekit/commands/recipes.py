"""`csekit recipes`: every shipped recipe with its method, backbone, status and published STS average.

The method and status come from `csekit.methods.RECIPE_CHECKS`, the backbone from the recipe file itself,
the published average from `benchmarks/published/*.yaml` (the rows `csekit bench` compares with). Nothing
heavy is imported: the list answers as fast as `--help`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from csekit.core.bounded_read import read_yaml_file
from csekit.core.errors import CsekitError
from csekit.methods import RECIPE_CHECKS, STATUSES

NOT_LISTED = "not listed"
"""The status of a recipe file csekit.methods does not know (a user's own, or one added without its entry)."""


@dataclass(frozen=True)
class RecipeRow:
    """One line of `csekit recipes`."""

    name: str
    method: str
    backbone: str
    status: str
    published: str
    source: str


def default_recipes_dir(cwd: Path | None = None) -> Path:
    """`recipes/` in the current folder, else the checkout's that csekit is installed from (editable install)."""
    here = (cwd or Path.cwd()) / "recipes"
    checkout = Path(__file__).resolve().parents[3] / "recipes"
    return here if here.is_dir() or not checkout.is_dir() else checkout


def published_averages(folder: Path) -> dict[str, float]:
    """Recipe name -> the published STS average, from every published-numbers file in `folder`."""
    from csekit.evaluation.published import STS_AVERAGE, load_published

    averages: dict[str, float] = {}
    for path in sorted(folder.glob("*.yaml")) if folder.is_dir() else []:
        for name, row in load_published(path).items():
            if STS_AVERAGE in row.scores:
                averages[name] = row.scores[STS_AVERAGE]
    return averages


def _backbone(path: Path) -> str:
    """The recipe's `model.backbone` as written (`-` when it names none)."""
    raw, _ = read_yaml_file(path, "recipe")
    model = raw.get("model") if isinstance(raw, dict) else None
    backbone = model.get("backbone") if isinstance(model, dict) else None
    return str(backbone) if backbone is not None else "-"


def recipe_rows(folder: Path, published: Path) -> list[RecipeRow]:
    """One row per recipe file of `folder`, by name; a file csekit.methods does not list is shown as such."""
    if not folder.is_dir():
        raise CsekitError(f"no recipes folder at {folder}: run from a csekit checkout or pass --dir")
    averages = published_averages(published)
    rows = []
    for path in sorted(folder.glob("*.yaml")):
        check = RECIPE_CHECKS.get(path.stem)
        method = " + ".join(check.methods) if check else "-"
        status, source = (check.status, check.source) if check else (NOT_LISTED, "not in csekit.methods")
        average = f"{averages[path.stem]:.2f}" if path.stem in averages else "-"
        rows.append(RecipeRow(path.stem, method, _backbone(path), status, average, source))
    return rows


def format_rows(rows: Sequence[RecipeRow], sources: bool) -> str:
    """The rows as aligned columns, then what each status means."""
    header = ("recipe", "method", "backbone", "status", "published STS avg.")
    table = [header, *((r.name, r.method, r.backbone, r.status, r.published) for r in rows)]
    widths = [max(len(line[column]) for line in table) for column in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip() for line in table]
    if sources:
        lines = [lines[0], *(f"{line}\n    {row.source}" for line, row in zip(lines[1:], rows, strict=True))]
    legend = [f"{status}: {meaning}" for status, meaning in STATUSES.items()]
    return "\n".join([*lines, "", *legend])


def recipes_command(
    folder: Annotated[
        Path | None, typer.Option("--dir", help="Recipes folder (default: ./recipes, else the checkout's).")
    ] = None,
    sources: Annotated[
        bool, typer.Option("--sources", help="Under each recipe, where its status comes from (default: off).")
    ] = False,
) -> None:
    """List the shipped recipes: method, backbone, what each was checked against, the published STS average."""
    folder = folder or default_recipes_dir()
    typer.echo(format_rows(recipe_rows(folder, folder.parent / "benchmarks" / "published"), sources))

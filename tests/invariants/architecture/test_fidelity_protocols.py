"""docs/fidelity.md says, for every shipped recipe, how its published numbers were computed (issue 53).

The protocol table's first column names recipes by pattern (`simcse-*`, `*-minilm.yaml`, a full name); a recipe
added without a row there fails here, so the table cannot fall behind the recipes folder.
"""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
HEADER = "| recipes | how the published numbers were computed | how csekit computes them |"


def protocol_patterns() -> list[str]:
    lines = (REPO / "docs" / "fidelity.md").read_text(encoding="utf-8").splitlines()
    start = lines.index(HEADER) + 2  # past the header and its rule
    patterns: list[str] = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        first = line.split("|")[1]
        patterns += [name.removesuffix(".yaml") for name in re.findall(r"`([^`]+)`", first)]
    return patterns


def test_every_shipped_recipe_has_a_protocol_row() -> None:
    patterns = protocol_patterns()
    assert len(patterns) >= 10
    recipes = sorted(path.stem for path in (REPO / "recipes").glob("*.yaml"))
    missing = [name for name in recipes if not any(fnmatch.fnmatch(name, pattern) for pattern in patterns)]
    assert not missing, f"recipes without a row in docs/fidelity.md's protocol table: {missing}"


def test_a_recipe_without_a_row_is_found() -> None:
    assert not any(fnmatch.fnmatch("newmethod-bert-base", pattern) for pattern in protocol_patterns())

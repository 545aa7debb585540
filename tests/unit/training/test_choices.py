"""The recipe keys whose value is one of a list (`recipe_schema.KEY_CHOICES`): one list a key, declared in the
schema, and exactly what the checks accept, the commands' `--precision` help and the docs name."""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.main import get_command

from csekit.cli import app
from csekit.commands.options import PRECISION_MEANINGS
from csekit.core.errors import CsekitError
from csekit.core.precision import DTYPES, resolve_precision
from csekit.training.recipe import load_recipe
from csekit.training.recipe_schema import COMPILE_MODES, KEY_CHOICES, OPTIMIZERS, PRECISIONS, SYNC_FREE_CHOICES

REPO = Path(__file__).resolve().parents[3]
SRC = REPO / "src" / "csekit"


def test_the_schema_lists_the_four_execution_and_method_choices_of_issue_66() -> None:
    """run.compile, run.sync_free, train.precision and train.optimizer have their list in the schema (and
    train.keep, which was there already); no other module declares one of them."""
    assert KEY_CHOICES["run.compile"] is COMPILE_MODES and KEY_CHOICES["run.sync_free"] is SYNC_FREE_CHOICES
    assert KEY_CHOICES["train.precision"] is PRECISIONS and KEY_CHOICES["train.optimizer"] is OPTIMIZERS
    names = ("COMPILE_MODES", "SYNC_FREE_CHOICES", "PRECISIONS", "OPTIMIZERS", "KEEPS")
    declared = {
        f"{path.relative_to(SRC)}: {name}"
        for path in SRC.rglob("*.py")
        for name in names
        if re.search(rf"^{name}\b.*=", path.read_text(encoding="utf-8"), re.MULTILINE)
    }
    assert declared == {f"training/recipe_schema.py: {name}" for name in names}


def test_the_precisions_are_auto_and_those_the_core_computes_in() -> None:
    """The core resolves a precision without the schema (it is below it): its dtypes and `auto` are the list."""
    assert set(PRECISIONS) == {"auto", *DTYPES}
    for name in PRECISIONS:
        assert resolve_precision(name, "cpu")[0] in DTYPES
    with pytest.raises(CsekitError, match=r'unknown precision "fp8"; choose one of auto, fp32, bf16, fp16'):
        resolve_precision("fp8", "cpu")


def accepted(key: str, value: str) -> bool:
    """What a recipe may give `key`: one of its choices, `run.sync_free`'s in any case (YAML's true is "True")."""
    choices = KEY_CHOICES[key]
    return value in choices or (key == "run.sync_free" and value.lower() in choices)


VALUES = st.one_of(
    st.sampled_from(sorted({value for choices in KEY_CHOICES.values() for value in choices})),
    st.sampled_from(sorted({value for choices in KEY_CHOICES.values() for value in choices})).map(str.upper),
    st.sampled_from(sorted({value for choices in KEY_CHOICES.values() for value in choices})).map(str.title),
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_", min_size=1, max_size=14),
)


@given(key=st.sampled_from(sorted(KEY_CHOICES)), value=VALUES)
@settings(max_examples=120, deadline=None, derandomize=True)
def test_the_checks_accept_exactly_the_schemas_choices(key: str, value: str) -> None:
    """A recipe file giving `key` a value: loaded when it is one of the schema's choices, else one line naming the
    file, the key's line and every choice."""
    section, name = key.split(".")
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "choice.yaml"
        path.write_text(f"# one key\n{section}:\n  {name}: {json.dumps(value)}\n", encoding="utf-8")
        try:
            recipe = load_recipe(path)
        except CsekitError as error:
            message = str(error)
            assert not accepted(key, value), message
            assert message.startswith(f"{path}:3: recipe key {key} must be") and "\n" not in message
            assert all(choice in message for choice in KEY_CHOICES[key])
        else:
            assert accepted(key, value)
            assert getattr(getattr(recipe, section), name) == value


def test_every_precision_option_names_the_schemas_precisions_with_their_meaning() -> None:
    """The encoding commands' `--precision` help is made from the schema's list (a precision without a meaning
    stops the command line from loading)."""
    assert list(PRECISION_MEANINGS) == list(PRECISIONS)
    group = get_command(app)
    helps = [
        param.help
        for command in group.commands.values()  # type: ignore[attr-defined]
        for param in command.params
        if "--precision" in getattr(param, "opts", [])
    ]
    assert len(helps) >= 4  # evaluate, encode, probe, diagnose
    for text in helps:
        for name, meaning in PRECISION_MEANINGS.items():
            assert f"{name} ({meaning})" in text


LISTED = re.compile(r"`((?:train|run)\.\w+): ([\w-]+(?: \| [\w-]+)+)`")
"""An inline listing of a key's values in the docs: `run.sync_free: auto | true | false`."""
TABLE_ROW = re.compile(r"^\| `((?:train|run)\.\w+)` \| (.+) \|$", re.MULTILINE)


def doc_pages() -> dict[str, str]:
    pages = {str(path.relative_to(REPO)): path for path in sorted((REPO / "docs").glob("*.md"))}
    pages["README.md"] = REPO / "README.md"
    return {name: path.read_text(encoding="utf-8") for name, path in pages.items()}


def listings_that_differ(pages: dict[str, str]) -> list[str]:
    """Each inline listing of a schema key's values that is not the schema's list (in its order)."""
    found = []
    for name, text in pages.items():
        for key, values in LISTED.findall(text):
            if key in KEY_CHOICES and tuple(values.split(" | ")) != KEY_CHOICES[key]:
                found.append(f"{name}: {key}: {values}")
    return found


def test_the_docs_list_each_keys_values_as_the_schema_does() -> None:
    pages = doc_pages()
    assert listings_that_differ(pages) == []
    table = {
        key: tuple(re.findall(r"`([\w-]+)`", values)) for key, values in TABLE_ROW.findall(pages["docs/recipes.md"])
    }
    assert table == KEY_CHOICES  # docs/recipes.md, "Keys with a list of values": every key, every value


def test_the_docs_check_finds_a_listing_the_schema_does_not_have() -> None:
    page = "`run.compile: none | default | reduce-overhead | max-autotune` and `run.sync_free: auto | true | false`"
    assert listings_that_differ({"page.md": page}) == [
        "page.md: run.compile: none | default | reduce-overhead | max-autotune"
    ]

"""Recipes: loading, overrides, and one-line errors that name the file, line or key."""

from __future__ import annotations

from pathlib import Path

import pytest

from csekit.core.errors import CsekitError
from csekit.core.registry import Registry
from csekit.parts.objectives import BUILTIN, OBJECTIVES, InfoNCE
from csekit.training.part_building import build_part
from csekit.training.recipe import Recipe, load_recipe
from csekit.training.recipe_checks import validate_recipe

REPO = Path(__file__).resolve().parents[3]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_every_shipped_recipe_loads() -> None:
    recipes = sorted((REPO / "recipes").glob("*.yaml"))
    assert {"quickstart.yaml", "simcse-bert-base.yaml", "simcse-roberta-base.yaml"} <= {p.name for p in recipes}
    for path in recipes:
        recipe = load_recipe(path)
        # Without overrides the schema's merge is typed once; with one, the resolved tree is typed again: a no-op
        # override must give the same recipe, so neither path drops or changes a value.
        assert load_recipe(path, [f"train.seed={recipe.train.seed}"]) == recipe, path.name


def test_paper_defaults_in_the_simcse_recipes() -> None:
    bert = load_recipe(REPO / "recipes" / "simcse-bert-base.yaml")
    assert (bert.train.batch_size, bert.train.lr, bert.model.max_length, bert.train.eval_every) == (64, 3e-5, 32, 125)
    assert bert.objectives == [{"name": "infonce", "temperature": 0.05}]
    roberta = load_recipe(REPO / "recipes" / "simcse-roberta-base.yaml")
    assert (roberta.train.batch_size, roberta.train.lr) == (512, 1e-5)


def test_required_key_names_exist() -> None:
    recipe = load_recipe(
        None,
        [
            "model.backbone=x",
            "model.pooler=mean",
            "data.corpus=c.txt",
            "train.batch_size=8",
            "train.max_steps=5",
            "train.eval_every=2",
            "train.precision=bf16",
            "train.seed=3",
        ],
    )
    assert recipe.model.backbone == "x" and recipe.train.batch_size == 8 and recipe.train.precision == "bf16"


def test_typo_in_file_names_line_and_closest_key(tmp_path: Path) -> None:
    path = write(tmp_path, "model:\n  backbone: minilm-l6\ntrain:\n  batch_size: 8\n  lerning_rate: 1\n")
    with pytest.raises(CsekitError) as error:
        load_recipe(path)
    message = str(error.value)
    assert f"{path}:5" in message and "train.lerning_rate" in message
    assert "\n" not in message


def test_typo_in_section_name(tmp_path: Path) -> None:
    with pytest.raises(CsekitError, match='did you mean "train"'):
        load_recipe(write(tmp_path, "trian:\n  batch_size: 8\n"))


def test_typo_in_override_suggests_full_key() -> None:
    with pytest.raises(CsekitError, match=r'--set train\.batchsize.*did you mean "train\.batch_size"'):
        load_recipe(None, ["train.batchsize=3"])


def test_wrong_type_names_the_key(tmp_path: Path) -> None:
    with pytest.raises(CsekitError, match=r"recipe\.yaml:2.*train\.batch_size"):
        load_recipe(write(tmp_path, "train:\n  batch_size: many\n"))


def test_invalid_yaml_names_the_line(tmp_path: Path) -> None:
    with pytest.raises(CsekitError, match=r"recipe\.yaml:\d+: invalid YAML"):
        load_recipe(write(tmp_path, "train:\n  batch_size: [8\n"))


def test_out_of_range_value_is_rejected() -> None:
    with pytest.raises(CsekitError, match=r"train\.precision"):
        load_recipe(None, ["train.precision=fp8"])


def test_override_replaces_a_part_when_its_name_changes() -> None:
    recipe = load_recipe(None, ["model.head.name=none"])
    assert recipe.model.head == {"name": "none"}


def test_unknown_part_name_and_option_are_explained() -> None:
    with pytest.raises(
        CsekitError, match=r'objectives\[0\]\.name: unknown objective "infonse".*did you mean "infonce"'
    ):
        build_part(OBJECTIVES, {"name": "infonse"}, "objectives[0]")
    with pytest.raises(CsekitError, match=r'has no option "temprature".*did you mean "temperature"'):
        build_part(OBJECTIVES, {"name": "infonce", "temprature": 0.1}, "objectives[0]")


def test_a_part_is_never_built_from_an_import_path() -> None:
    """A recipe names parts; a Python path in it is refused (a user's part is registered: test_untrusted.py)."""
    with pytest.raises(
        CsekitError, match=r'recipe key objectives\[0\]\.name: unknown objective "csekit.parts.objectives.infonce:'
    ):
        build_part(OBJECTIVES, {"name": "csekit.parts.objectives.infonce:InfoNCE", "temperature": 0.1}, "objectives[0]")
    own = Registry("objective", BUILTIN, "objective")  # a fresh registry: nothing leaks
    own.register("mine", InfoNCE)
    part = build_part(own, {"name": "mine", "temperature": 0.1}, "objectives[0]")
    assert part.temperature == 0.1


def test_resolved_recipe_round_trips(tmp_path: Path) -> None:
    recipe = load_recipe(REPO / "recipes" / "quickstart.yaml", ["train.max_steps=7"])
    again = load_recipe(write(tmp_path, recipe.to_yaml()))
    assert again == recipe


def test_override_a_list_item_by_index() -> None:
    recipe = load_recipe(REPO / "recipes" / "quickstart.yaml", ["objectives.0.temperature=0.1"])
    assert recipe.objectives == [{"name": "infonce", "temperature": 0.1}]


def test_bad_list_and_section_overrides_are_one_line_errors() -> None:
    with pytest.raises(CsekitError, match=r"--set objectives\.3\.temperature: objectives has 1 items"):
        load_recipe(REPO / "recipes" / "quickstart.yaml", ["objectives.3.temperature=1"])
    with pytest.raises(CsekitError, match=r"--set train\.batch_size\.x: train\.batch_size is a value"):
        load_recipe(REPO / "recipes" / "quickstart.yaml", ["train.batch_size.x=1"])


def test_setting_a_part_name_drops_the_old_parts_options() -> None:
    recipe = load_recipe(REPO / "recipes" / "whitenedcse-minilm.yaml", ["model.head.name=mlp"])
    assert recipe.model.head == {"name": "mlp"}
    recipe = load_recipe(None, ["weighting.name=dclr", "weighting.phi=0.8"])
    assert recipe.weighting == {"name": "dclr", "phi": 0.8}


def test_whole_part_and_list_overrides_apply_completely_and_in_order() -> None:
    head = "model.head={name: whitening, whitening: shuffled_group, group_size: 8, num_positives: 3}"
    recipe = load_recipe(None, [head, "objectives=[{name: infonce}]", "objectives.0.temperature=0.3"])
    assert recipe.model.head == {
        "name": "whitening",
        "whitening": "shuffled_group",
        "group_size": 8,
        "num_positives": 3,
    }
    assert recipe.objectives == [{"name": "infonce", "temperature": 0.3}]


def test_part_options_are_checked_when_the_recipe_is_loaded() -> None:
    """An unknown option or one of the wrong type is refused by load_recipe (so `csekit bench` finds it in a suite's
    ninth recipe before the first training), not only when the model is built."""
    with pytest.raises(CsekitError, match=r'objectives\[0\]\.temprature: "infonce" has no option.*"temperature"'):
        load_recipe(None, ["objectives=[{name: infonce, temprature: 0.1}]"])
    with pytest.raises(CsekitError, match=r"objectives\[0\]\.temperature: expected a finite number"):
        load_recipe(None, ["objectives=[{name: infonce, temperature: warm}]"])
    with pytest.raises(CsekitError, match=r"model\.head\.num_groups: expected an integer"):
        load_recipe(None, ["model.head={name: whitening, num_groups: many}"])


def test_the_value_checks_are_apart_from_the_schema_and_name_the_key() -> None:
    """recipe_checks.py checks what the schema (recipe_schema.py) cannot: load_recipe runs it after the keys, so a
    mistyped key is refused before the parts (and torch) are imported (tests/test_cli_startup.py)."""
    recipe = Recipe()
    validate_recipe(recipe)  # the defaults are a valid recipe
    recipe.train.batch_size = 1
    with pytest.raises(CsekitError, match=r"^here: recipe key train.batch_size must be from 2 to 65,536"):
        validate_recipe(recipe, lambda key: "here")

"""Issue #64 ("Hostile files IV") defects 2 and 3: every number a recipe gives is bounded when it is loaded
(`training/recipe_bounds.py`), and LoRA's `target_modules` is a list of module names, never a pattern.

`data.views.num_views: 100000` was killed at 19.8 GB after the run folder existed; a `target_modules` string was a
regular expression to peft, which could backtrack for hours; a LoRA rank of 2^30 asked for hundreds of GB.
"""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest
from conftest import assert_one_line_error, run_main, write_recipe
from hypothesis import given, settings
from hypothesis import strategies as st

from csekit.core.errors import CsekitError
from csekit.training.recipe import DataConfig, ModelConfig, Recipe, RunConfig, TrainConfig, load_recipe
from csekit.training.recipe_bounds import DEFAULT_OPTION_BOUND, OPTION_BOUNDS, SCHEMA_BOUNDS

CaptureErr = pytest.CaptureFixture[str]


def _numeric_schema_keys(kinds: tuple[type, ...] = (int, float)) -> list[str]:
    """Every key of the recipe's schema whose type admits one of `kinds` (an int or a float)."""
    keys = []
    for section, schema in (("model", ModelConfig), ("data", DataConfig), ("train", TrainConfig), ("run", RunConfig)):
        hints = typing.get_type_hints(schema)
        for field in dataclasses.fields(schema):
            hint = hints[field.name]
            options = typing.get_args(hint) or (hint,)
            if any(option in kinds for option in options):
                keys.append(f"{section}.{field.name}")
    return keys


def test_every_numeric_key_of_the_schema_has_bounds() -> None:
    """The rule as a mechanism: a numeric key added to the schema without a range fails here."""
    keys = _numeric_schema_keys()
    assert "data.max_chars" in keys and "train.lr" in keys  # the listing sees ints and floats
    assert set(keys) == set(SCHEMA_BOUNDS), set(keys) ^ set(SCHEMA_BOUNDS)
    whole = set(_numeric_schema_keys((int,))) - set(_numeric_schema_keys((float,)))
    assert all(SCHEMA_BOUNDS[key].high <= 2**32 for key in whole)  # no count is a memory request
    assert all(bound.high <= 2**32 for bound in (*OPTION_BOUNDS.values(), DEFAULT_OPTION_BOUND))
    assert {field.name for field in dataclasses.fields(Recipe)} >= {"model", "data", "train", "run"}


@pytest.mark.parametrize(
    "setting",
    [
        "data.views.num_views=100000",
        "data.views={name: consert, augmentations: [" + ", ".join(["shuffle"] * 40) + "]}",
        "model.head={name: whitening, num_positives: 100000}",
        "negatives=[{name: momentum_queue, queue_size: 1000000000000}]",
        "train.batch_size=65536",  # within its range, but 65,536 x 2 views x 512 tokens a step is not
        "train.eval_every=10000000000",
        "model.max_length=1000000",
        "run.eval_batch_size=10000000",
    ],
)
def test_a_huge_count_is_one_line_before_anything_is_written(
    setting: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr
) -> None:
    recipe = write_recipe(tmp_path, tmp_path / "model", tmp_path / "corpus.txt")
    extra = ["--set", "model.max_length=512"] if setting.startswith("train.batch_size") else []
    output = tmp_path / "run"
    code, err = run_main(monkeypatch, capsys, "train", str(recipe), "--output", str(output), *extra, "--set", setting)
    key = setting.split("=")[0]
    assert_one_line_error(code, err, "recipe key", key if "." in key else "")
    assert not output.exists()


HUGE = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([2**31, 2**63, -(2**63), 10**100]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([1e308, -1e308, 1e-308]),
)
OPTION_KEYS = [
    ("data.views", "{name: dropout, num_views: V}", "num_views"),
    ("data.views", "{name: cropping, num_views: 2, min_tokens: V}", "min_tokens"),
    ("model.head", "{name: whitening, num_positives: V}", "num_positives"),
    ("model.head", "{name: whitening, num_groups: V}", "num_groups"),
    ("negatives", "[{name: momentum_queue, queue_size: V}]", "queue_size"),
    ("objectives", "[{name: infonce, anchor_view: V}]", "anchor_view"),
    ("objectives", "[{name: matryoshka, dims: [V], objective: {name: infonce}}]", "dims"),
]


@settings(max_examples=80, deadline=None, derandomize=True)
@given(st.sampled_from(sorted(SCHEMA_BOUNDS) + [f"option:{i}" for i in range(len(OPTION_KEYS))]), HUGE)
def test_any_number_for_a_numeric_key_loads_within_its_bounds_or_is_one_line(key: str, value: float) -> None:
    """Generated values for every numeric schema key and for part options: the recipe loads only with a value in
    the key's range, otherwise one line names the key."""
    text = repr(value) if isinstance(value, float) else str(value)
    if key.startswith("option:"):
        section, spec, option = OPTION_KEYS[int(key.split(":")[1])]
        setting, named, bound = f"{section}={spec.replace('V', text)}", option, OPTION_BOUNDS.get(option)
        bound = bound or DEFAULT_OPTION_BOUND
    else:
        setting, named, bound = f"{key}={text}", key, SCHEMA_BOUNDS[key]
    try:
        load_recipe(None, [setting])
    except CsekitError as error:
        assert "\n" not in str(error) and named in str(error)
        return
    assert bound.holds(value)


# --- 3: LoRA's target_modules is a list of module names; its rank is bounded ------------------------------------


@pytest.mark.parametrize(
    ("lora", "needle"),
    [
        ("{target_modules: '(a+)+$'}", "regular expression"),
        ("{target_modules: 'q_proj|v_proj'}", "regular expression"),
        ("{target_modules: ['.*attn.*']}", "module names"),
        ("{target_modules: q_proj}", "module names"),
        ("{r: 1073741824}", "model.lora.r must be a whole number from 1 to"),
    ],
)
def test_a_lora_pattern_or_a_huge_rank_is_one_line_at_load(lora: str, needle: str) -> None:
    with pytest.raises(CsekitError, match=r"--set model\.lora: recipe key model\.lora\.") as error:
        load_recipe(None, [f"model.lora={lora}"])
    assert needle in str(error.value)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.one_of(st.text(max_size=20), st.lists(st.text(max_size=12), max_size=4)))
def test_target_modules_are_taken_only_as_plain_module_names(targets: str | list[str]) -> None:
    """No regex metacharacter reaches peft: whatever is accepted is all-linear or a list of dotted names."""
    from csekit.encoding.lora import lora_options

    try:
        options = lora_options({"target_modules": targets})
    except CsekitError as error:
        assert "\n" not in str(error) and "target_modules" in str(error)
        return
    accepted = options["target_modules"]
    assert accepted == "all-linear" or (
        isinstance(accepted, list)
        and all(
            name and set(name) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.")
            for name in accepted
        )
    )


def test_the_recipes_lora_settings_still_load() -> None:
    """Guard: all-linear and lists of projection names, as the LLM2Vec recipes and the tests give them."""
    from csekit.encoding.lora import lora_options

    assert lora_options({})["target_modules"] == "all-linear"
    assert lora_options({"r": 64, "target_modules": ["q_proj", "self_attn.v_proj"]})["r"] == 64

"""Part building (`csekit.training.part_building`): parts take plain build arguments, never the recipe.

A part that dug in the whole recipe (`recipe.train.batch_size`) could only be built from a recipe and hid what
it read; the build arguments (`BUILD_CONTEXT`) are plain values, the same from `build_model` and from a user's
own code, and a recipe cannot set them.
"""

from __future__ import annotations

import ast
import inspect
import math
import re
import warnings
from pathlib import Path

import pytest
from conftest import make_tiny_encoder
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from csekit.core.errors import CsekitError
from csekit.core.registry import Registry
from csekit.parts import heads, negatives, objectives, views, weighting
from csekit.parts.heads.mlp import MLPHead
from csekit.parts.heads.whitening import SingularWhiteningWarning, WhiteningHead
from csekit.parts.negatives.momentum import MomentumQueue
from csekit.parts.objectives import InfoNCE
from csekit.training.model import build_model
from csekit.training.part_building import build_part, check_part_options
from csekit.training.recipe import load_recipe

PARTS = Path(__file__).resolve().parents[3] / "src" / "csekit" / "parts"
BUILT_IN = [
    (kind.__name__.rsplit(".", 1)[-1], name, factory)
    for kind in (views, heads, negatives, weighting, objectives)
    for name, factory in kind.BUILTIN.items()
]


def functions_taking(parameter: str, source: str, filename: str) -> list[str]:
    """`file:line name` of every function in `source` with a parameter called `parameter`."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            arguments = node.args
            names = [a.arg for a in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]]
            if parameter in names:
                found.append(f"{filename}:{node.lineno} {getattr(node, 'name', 'lambda')}")
    return found


def test_no_part_takes_the_recipe() -> None:
    """No function under src/csekit/parts has a `recipe` parameter, and no built-in part's constructor takes it."""
    found = [
        hit for path in sorted(PARTS.rglob("*.py")) for hit in functions_taking("recipe", path.read_text(), str(path))
    ]
    assert not found, f"parts take the build arguments they read, not the recipe: {found}"
    taking = [f"{kind} {name}" for kind, name, factory in BUILT_IN if "recipe" in inspect.signature(factory).parameters]
    assert not taking
    assert len(BUILT_IN) >= 20  # every kind's table was read


def test_the_check_for_recipe_parameters_can_fail() -> None:
    source = "class Head:\n    def __init__(self, dim: int, recipe=None) -> None:\n        self.rows = recipe.train\n"
    assert functions_taking("recipe", source, "head.py") == ["head.py:2 __init__"]


def test_parts_are_built_outside_a_recipe_with_explicit_arguments(tmp_path: Path) -> None:
    with pytest.warns(SingularWhiteningWarning, match=r"model\.head\.group_size: .*rank at most 63"):
        WhiteningHead(768, "shuffled_group", group_size=384, batch_size=64, input_view_count=2)
    with pytest.raises(ValueError, match=r"num_positives=2 is smaller than the 3 views data\.views makes"):
        WhiteningHead(32, "shuffled_group", num_groups=4, num_positives=2, input_view_count=3)
    encoder = make_tiny_encoder(tmp_path / "tok")
    head = MLPHead(encoder.dim)
    assert MomentumQueue(encoder, head, batch_size=64).queue.shape[0] == math.floor(2.5 * 64)
    with pytest.raises(ValueError, match="give queue_size, or the batch_size"):
        MomentumQueue(encoder, head)
    with pytest.raises(ValueError, match="training-only"):
        MLPHead(encoder.dim, through_backbone_pooler=True, encoder=encoder, head_at_test=True)


def test_build_model_gives_the_parts_the_recipe_values(tmp_path: Path) -> None:
    encoder = make_tiny_encoder(tmp_path / "tok")
    recipe = load_recipe(
        None,
        [
            "train.batch_size=12",
            "train.seed=7",
            "data.views={name: repetition}",
            "negatives=[{name: momentum_queue}]",
        ],
    )
    model, made = build_model(recipe, encoder)
    assert made.seed == 7
    assert model.negatives[0].queue.shape[0] == math.floor(2.5 * 12)
    wide = load_recipe(None, ["data.views.num_views=3", "model.head={name: whitening, num_positives: 2}"])
    with pytest.raises(CsekitError, match=r"model\.head: num_positives=2 is smaller than the 3 views"):
        build_model(wide, encoder)
    kept = load_recipe(None, ["model.head={name: mlp, through_backbone_pooler: true}", "model.head_at_test=true"])
    with pytest.raises(CsekitError, match=r"model\.head: through_backbone_pooler is a training-only head"):
        build_model(kept, encoder)


def test_a_build_argument_is_not_a_recipe_option() -> None:
    """Given by csekit: a recipe that sets one is refused when it is loaded, not with a traceback-like
    "multiple values" line when the model is built after the backbone loaded."""
    with pytest.raises(CsekitError, match=r'data\.views\.seed: "repetition" is given seed by csekit \(train\.seed\)'):
        load_recipe(None, ["data.views={name: repetition, seed: 3}"])
    with pytest.raises(CsekitError, match=r"objectives\[1\]\.max_length: .*given max_length by csekit"):
        load_recipe(None, ["objectives=[{name: infonce}, {name: margin, max_length: 40}]"])
    with pytest.raises(CsekitError, match=r"model\.head\.batch_size: .*given batch_size by csekit"):
        load_recipe(None, ["model.head={name: whitening, batch_size: 32}"])


def test_a_views_option_named_like_a_later_build_argument_stays_an_option() -> None:
    """DropoutViews' own num_views is an option (the later parts' build argument is input_view_count)."""
    assert load_recipe(None, ["data.views.num_views=3"]).data.views["num_views"] == 3
    with pytest.raises(CsekitError, match=r'"num_view".*did you mean "num_views"'):
        load_recipe(None, ["data.views={name: dropout, num_view: 3}"])


def test_an_option_error_can_name_the_file_and_line() -> None:
    with pytest.raises(CsekitError, match=r'^r\.yaml:7: recipe key objectives\[0\]\.temprature: "infonce" has no'):
        check_part_options(InfoNCE, {"name": "infonce", "temprature": 1}, "objectives[0]", where=lambda k: "r.yaml:7")
    with pytest.raises(CsekitError, match=r"^r\.yaml:8: recipe key objectives\[0\]\.temperature: expected"):
        check_part_options(
            InfoNCE, {"name": "infonce", "temperature": "x"}, "objectives[0]", where=lambda k: "r.yaml:8"
        )


class OldStylePart(nn.Module):
    """A user's part written when csekit passed the whole recipe."""

    def __init__(self, recipe: object = None, scale: float = 1.0) -> None:
        super().__init__()
        self.recipe = recipe
        self.scale = scale


def test_a_users_part_that_names_recipe_still_gets_it_with_a_deprecation_warning() -> None:
    registry: Registry[object] = Registry("objective", {"old": OldStylePart}, "objective")
    recipe = load_recipe(None)
    with pytest.warns(FutureWarning, match=r'objectives\[1\]: part "old" takes `recipe`.*batch_size'):
        part = build_part(registry, {"name": "old", "scale": 2.0}, "objectives[1]", recipe=recipe, seed=1)
    assert part.recipe is recipe and part.scale == 2.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # csekit's own parts take no deprecated argument
        build_part(objectives.OBJECTIVES, {"name": "infonce"}, "objectives[0]", recipe=recipe, seed=1)


def test_a_part_option_error_names_the_file_and_line(tmp_path: Path) -> None:
    """A mistyped option of a part in a recipe file is reported at its line (it named the key only)."""
    path = tmp_path / "recipe.yaml"
    path.write_text("model:\n  pooler: cls\nobjectives:\n  - name: infonce\n    temprature: 0.05\n")
    with pytest.raises(CsekitError, match=rf"^{re.escape(str(path))}:5: recipe key objectives\[0\]\.temprature"):
        load_recipe(path)


@settings(max_examples=25, deadline=None)
@given(
    name=st.one_of(st.sampled_from(["builtin", "mine", "kill_once", "infonce", "STS12", "stsb-dev", "MR"]), st.text())
)
def test_membership_is_the_name_list_for_any_name(tmp_path_factory: pytest.TempPathFactory, name: str) -> None:
    """`name in registry` checks the built-in and registered tables before the installed entry points (the read
    of every package's metadata took 43 ms, twice a recipe's load): it must answer as the whole name list does,
    plugins included; and check_task's shortcut for a known task returns what the whole list would give."""
    from parts_for_tests import write_entry_points

    from csekit.evaluation.tasks import EVAL_TASKS, check_task, tasks_of

    site = write_entry_points(tmp_path_factory.mktemp("site"))
    registry: Registry[object] = Registry("objective", {"builtin": object()}, "objective")
    registry.register("mine", object())
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(site))
        assert (name in registry) is (name in registry.names())
        assert "kill_once" in registry and "kill_once" in registry.names()  # a plugin of the written package
        for groups in (("sts",), ("sts", "dev"), ("transfer",)):
            if name in tasks_of(*groups):
                assert check_task(name, groups, "task") is EVAL_TASKS.get(name)
            else:
                with pytest.raises(CsekitError, match="unknown task"):
                    check_task(name, groups, "task")

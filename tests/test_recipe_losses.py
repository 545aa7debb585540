"""Behaviour lock: every shipped recipe's 20-step loss trace on tiny models equals the recorded one.

A refactor that keeps csekit's behaviour keeps every trace. A change that is meant to change training
records the traces again (`python benchmarks/recipe_loss_trace.py --write`) and says so in its commit.
The tolerance allows for another CPU's rounding; on the recording machine the traces are identical
(the largest deviation is printed: `pytest -s`), and CSEKIT_EXACT_TRACES=1 requires them to be. Use it
there to check a refactor: a change that acts only through the gradients moves a loss by as little as
1e-4 relative in 20 steps at the recipes' learning rates (less at slt-fai-consert-sts.yaml's 5e-7).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from recipe_trace import (
    RECIPES,
    RECORD_COMMAND,
    RECORDED,
    RECORDED_ON,
    TinyInputs,
    deviation,
    format_machines,
    machine_signature,
    make_tiny_inputs,
    one_thread,
    read_machines,
    read_recorded,
    recorded_machine,
    shipped_recipes,
    trace_recipe,
)

from csekit.core.errors import CsekitError

RTOL = 1e-4
ATOL = 1e-6
"""Absolute tolerance at the scale of a loss of about 1; a series of smaller values (recall: ~1e-8) gets
it scaled down to its own size, else any value of it would pass."""

RECIPE_FILES = [path.name for path in shipped_recipes()]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TinyInputs:
    with one_thread():  # as trace_recipes makes them
        return make_tiny_inputs(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def recorded() -> dict[str, dict[str, list[float]]]:
    return read_recorded()


def mismatches(actual: list[float], expected: list[float]) -> list[int]:
    """Steps (1-based) where `actual` is outside the tolerance around `expected`."""
    if os.environ.get("CSEKIT_EXACT_TRACES") == "1":
        return [step for step, (a, e) in enumerate(zip(actual, expected, strict=True), start=1) if a != e]
    atol = ATOL * min(1.0, max(abs(value) for value in expected))
    return [
        step
        for step, (a, e) in enumerate(zip(actual, expected, strict=True), start=1)
        if not abs(a - e) <= atol + RTOL * abs(e)
    ]


def test_there_are_shipped_recipes_and_no_recording_of_a_removed_one(
    recorded: dict[str, dict[str, list[float]]],
) -> None:
    assert len(RECIPE_FILES) >= 30
    removed = sorted(set(recorded) - set(RECIPE_FILES))
    assert not removed, (
        f"{RECORDED} holds traces of recipes that no longer exist: {removed}; record all again: {RECORD_COMMAND}"
    )


def same_machine_as_the_recording(recipe_file: str) -> None:
    """Skip where rounding differs from the recording machine's (CSEKIT_TRACES_ANY_MACHINE=1 compares anyway).

    A refactor records the traces on its own machine first (`--write`), then checks them there.
    """
    recorded_on = recorded_machine(recipe_file)
    here = machine_signature()
    if recorded_on != here and os.environ.get("CSEKIT_TRACES_ANY_MACHINE") != "1":
        pytest.skip(
            f"traces recorded on [{recorded_on}], this is [{here}]. To lock a change on this machine: record "
            f"main's traces here first (`PYTHONPATH=src {RECORD_COMMAND}` on a clean checkout, which also "
            f"rewrites {RECORDED_ON.name}), then run this test on your change (CSEKIT_EXACT_TRACES=1 for "
            "bit-exactness); or compare with the recording within tolerance: CSEKIT_TRACES_ANY_MACHINE=1"
        )


@pytest.mark.parametrize("recipe_file", RECIPE_FILES)
def test_recipe_loss_trace_matches_the_recording(
    recipe_file: str, tiny: TinyInputs, recorded: dict[str, dict[str, list[float]]], tmp_path: Path
) -> None:
    expected = recorded.get(recipe_file)
    if expected is None:
        pytest.fail(
            f"recipes/{recipe_file} has no recorded loss trace in {RECORDED.name}; record it with "
            f"`{RECORD_COMMAND} recipes/{recipe_file}` (PYTHONPATH=src) and commit the file"
        )
    same_machine_as_the_recording(recipe_file)
    with one_thread():
        actual = trace_recipe(RECIPES / recipe_file, tiny, tmp_path / "run")
    assert list(actual) == list(expected), f"{recipe_file}: logged loss parts {list(actual)}, recorded {list(expected)}"
    largest = max(deviation(actual[name], expected[name]) for name in expected)
    print(f"{recipe_file}: largest relative deviation from the recording {largest:.3g}")
    for name, values in expected.items():
        steps = mismatches(actual[name], values)
        assert not steps, (
            f"{recipe_file}: {name} differs from the recording at steps {steps} (step {steps[0]}: "
            f"{actual[name][steps[0] - 1]!r}, recorded {values[steps[0] - 1]!r}); if the change is meant to "
            f"change training, record again: {RECORD_COMMAND}"
        )


def test_the_tolerance_allows_rounding_but_not_a_change(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CSEKIT_EXACT_TRACES", raising=False)
    loss = [2.0, 1.5, 0.0]
    assert mismatches([2.0 * (1 + 5e-5), 1.5 * (1 - 5e-5), 5e-7], loss) == []  # another CPU's rounding
    assert mismatches([2.0 * (1 + 2e-4), 1.5, float("nan")], loss) == [1, 3]
    recall = [0.0, 2e-9, 3e-8]  # far below ATOL: compared at its own scale
    assert mismatches([0.0, 2e-9 * (1 + 5e-5), 3e-8], recall) == []
    assert mismatches([0.0, 2e-9, 3e-8 * 1.1], recall) == [3]
    monkeypatch.setenv("CSEKIT_EXACT_TRACES", "1")
    assert mismatches([2.0, 1.5 * (1 + 1e-7), 0.0], loss) == [2]


def test_traces_recorded_again_elsewhere_name_their_own_machine(tmp_path: Path) -> None:
    path = tmp_path / "recipe_losses.machine"
    path.write_text("Zen 4; avx512f\n", encoding="utf-8")  # the file as a full --write leaves it
    assert recorded_machine("a.yaml", path) == "Zen 4; avx512f"
    default, per_recipe = read_machines(path)
    path.write_text(format_machines(default, {**per_recipe, "b.yaml": "Zen 3; avx2"}), encoding="utf-8")
    assert [recorded_machine(name, path) for name in ("a.yaml", "b.yaml")] == ["Zen 4; avx512f", "Zen 3; avx2"]
    assert format_machines("Zen 3; avx2", {"b.yaml": "Zen 3; avx2"}) == "Zen 3; avx2\n"  # no entry repeats the first
    path.write_text("Zen 4\nnot a recipe line\n", encoding="utf-8")
    with pytest.raises(CsekitError, match=r"recipe\.yaml = machine signature"):
        read_machines(path)

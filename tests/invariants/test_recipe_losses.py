"""Behaviour lock: every shipped recipe's 20-step loss trace on tiny models equals the recorded one.

A refactor that keeps csekit's behaviour keeps every trace. A change that is meant to change training
records the traces again (`python benchmarks/recipe_loss_trace.py --write`) and says so in its commit.
The lock holds on every machine: a trace is compared within CROSS_MACHINE_RTOL, which allows another CPU's
rounding (measured between an AVX2 and an AVX-512 CPU), except the MACHINE_DEPENDENT recipes', whose trace
another CPU's rounding tips elsewhere: each has one trace per machine signature and is compared on a
machine of a recorded signature. On the recording machine the traces are identical (the largest deviation
is printed: `pytest -s`), and CSEKIT_EXACT_TRACES=1 requires them to be; use it there to check a refactor:
a change that acts only through the gradients moves a loss by as little as 1e-4 relative in 20 steps at
the recipes' learning rates (less at slt-fai-consert-sts.yaml's 5e-7).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from recipe_trace import (
    CROSS_MACHINE_RTOL,
    MACHINE_DEPENDENT,
    RECIPES,
    RECORD_COMMAND,
    RECORDED,
    RECORDED_PER_MACHINE,
    TinyInputs,
    deviation,
    format_machines,
    format_traces_per_machine,
    machine_signature,
    make_tiny_inputs,
    one_thread,
    read_machines,
    read_recorded,
    read_recorded_per_machine,
    record_per_machine,
    recorded_machine,
    shipped_recipes,
    trace_recipe,
)

from csekit.core.errors import CsekitError

RTOL = CROSS_MACHINE_RTOL
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


@pytest.fixture(scope="module")
def per_machine() -> dict[str, dict[str, dict[str, list[float]]]]:
    return read_recorded_per_machine()


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
    recorded: dict[str, dict[str, list[float]]], per_machine: dict[str, dict[str, dict[str, list[float]]]]
) -> None:
    assert len(RECIPE_FILES) >= 30
    removed = sorted(set(recorded) - set(RECIPE_FILES))
    assert not removed, (
        f"{RECORDED} holds traces of recipes that no longer exist: {removed}; record all again: {RECORD_COMMAND}"
    )
    assert set(MACHINE_DEPENDENT) <= set(RECIPE_FILES)
    assert not set(MACHINE_DEPENDENT) & set(recorded), f"machine-dependent recipes belong in {RECORDED_PER_MACHINE}"
    for signature, traces in per_machine.items():
        assert set(traces) <= set(MACHINE_DEPENDENT), f"{RECORDED_PER_MACHINE} [{signature}]: {sorted(traces)}"


def expected_trace(
    recipe_file: str,
    recorded: dict[str, dict[str, list[float]]],
    per_machine: dict[str, dict[str, dict[str, list[float]]]],
) -> dict[str, list[float]]:
    """The recorded trace to compare with here: the recipe's one, or this machine's for a machine-dependent one."""
    if recipe_file not in MACHINE_DEPENDENT:
        if recipe_file not in recorded:
            pytest.fail(
                f"recipes/{recipe_file} has no recorded loss trace in {RECORDED.name}; record it with "
                f"`{RECORD_COMMAND} recipes/{recipe_file}` (PYTHONPATH=src) and commit the file"
            )
        return recorded[recipe_file]
    here = machine_signature()
    if recipe_file not in per_machine.get(here, {}):
        machines = [signature for signature, traces in per_machine.items() if recipe_file in traces]
        pytest.skip(
            f"{recipe_file} is machine-dependent ({MACHINE_DEPENDENT[recipe_file]}): recorded on {machines}, "
            f"not on this machine [{here}]; record it here: `PYTHONPATH=src {RECORD_COMMAND} recipes/{recipe_file}`"
        )
    return per_machine[here][recipe_file]


@pytest.mark.parametrize("recipe_file", RECIPE_FILES)
def test_recipe_loss_trace_matches_the_recording(
    recipe_file: str,
    tiny: TinyInputs,
    recorded: dict[str, dict[str, list[float]]],
    per_machine: dict[str, dict[str, dict[str, list[float]]]],
    tmp_path: Path,
) -> None:
    expected = expected_trace(recipe_file, recorded, per_machine)
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


def test_a_machine_dependent_trace_that_changed_drops_the_other_machines_ones(tmp_path: Path) -> None:
    old, new = {"loss": [2.0, 1.5]}, {"loss": [2.0, 1.6]}
    recorded = {"zen3": {"pca.yaml": old}, "zen4": {"pca.yaml": old}}
    kept, notes = record_per_machine(recorded, "zen4", {"pca.yaml": {"loss": [2.0, 1.5 * (1 + 1e-6)]}})
    assert set(kept) == {"zen3", "zen4"} and not notes  # rounding: the computation is the same
    changed, notes = record_per_machine(recorded, "zen4", {"pca.yaml": new})
    assert changed == {"zen4": {"pca.yaml": new}} and "[zen3]" in notes[0]
    first, notes = record_per_machine({"zen3": {"pca.yaml": old}}, "zen4", {"pca.yaml": new})
    assert first == {"zen3": {"pca.yaml": old}, "zen4": {"pca.yaml": new}} and not notes
    path = tmp_path / "per_machine.json"
    path.write_text(format_traces_per_machine(first), encoding="utf-8")
    assert read_recorded_per_machine(path) == first

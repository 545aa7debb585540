"""benchmarks/suite_diagnose.py (issue 63 item 3): `csekit diagnose` once per finished run of a suite, then each
bias per recipe against the baseline and the recipe's control, paired by seed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from scipy.stats import ttest_rel

from csekit.bench import load_suite

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def suite_diagnose(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import suite_diagnose

    return suite_diagnose


def _suite(folder: Path) -> Path:
    (folder / "a.yaml").write_text("name: a\n", encoding="utf-8")
    path = folder / "suite.yaml"
    path.write_text(
        "seeds: [1, 2, 3]\nbaseline: base\nrecipes:\n  - {recipe: a.yaml, name: base}\n"
        "  - {recipe: a.yaml, name: prompt}\n  - {recipe: a.yaml, name: method, control: prompt}\n",
        encoding="utf-8",
    )
    return path


def _report(folder: Path, name: str, **metrics: float) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    report = {"models": {f"runs/{name}/best": metrics}}
    (folder / f"{name}.json").write_text(json.dumps(report), encoding="utf-8")


def test_each_finished_run_is_diagnosed_once_with_its_own_pooler(
    tmp_path: Path, suite_diagnose: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    suite = load_suite(_suite(tmp_path))
    output, reports = tmp_path / "out", tmp_path / "reports"
    for name in ("base-seed1", "base-seed2", "method-seed1"):
        (output / name / "best").mkdir(parents=True)
        (output / name / "results.json").write_text("{}", encoding="utf-8")
    (output / "prompt-seed1" / "best").mkdir(parents=True)  # not finished: no results.json
    _report(reports, "base-seed2", uniformity=-1.0)  # diagnosed earlier
    commands: list[list[str]] = []
    monkeypatch.setattr(suite_diagnose.subprocess, "run", lambda command, **_: commands.append(command))
    assert suite_diagnose.diagnose_finished(suite, output, reports, "DATA") == ["base-seed1", "method-seed1"]
    assert [command[3:] for command in commands] == [
        ["diagnose", str(output / name / "best"), "--output", str(reports / f"{name}.json"), "--data-dir", "DATA"]
        for name in ("base-seed1", "method-seed1")
    ]
    assert not any("--pooler" in command for command in commands)  # each model read with its own pooler


def test_the_table_pairs_each_bias_by_seed_with_the_baseline_and_the_control(
    tmp_path: Path, suite_diagnose: Any
) -> None:
    suite = load_suite(_suite(tmp_path))
    reports = tmp_path / "reports"
    rates = {"base": [0.40, 0.42, 0.41], "prompt": [0.30, 0.31, 0.33], "method": [0.20, 0.25, 0.21]}
    for name, values in rates.items():
        for seed, rate in enumerate(values, start=1):
            if (name, seed) != ("prompt", 3):  # the control's seed 3 is not diagnosed yet
                _report(
                    reports,
                    f"{name}-seed{seed}",
                    false_negative_rate=rate,
                    uniformity=-rate,
                    alignment=rate,
                    frequency_probe_accuracy=rate,
                    cont_oppn_gap=rate,
                    anisotropy=rate,
                )
    markdown = suite_diagnose.table(suite, reports)
    section = markdown.split("### false negatives (%)")[1].split("###")[0]
    p_base = ttest_rel([20, 25, 21], [40, 42, 41]).pvalue
    p_control = ttest_rel([20, 25], [30, 31]).pvalue
    assert "| base | 3 | 41.0000 ± 0.8165 | - | - |" in section
    assert "| prompt | 2 | 30.5000 ± 0.5000 | -10.500 (p = " in section
    assert f"| method | 3 | 22.0000 ± 2.1602 | -19.000 (p = {p_base:.3f}, 3 seeds) | " in section
    assert f"-8.000 (p = {p_control:.3f}, 2 seeds) |" in section
    uniformity = markdown.split("### uniformity")[1].split("###")[0]
    assert f"| method | 3 | -0.2200 ± 0.0216 | +0.190 (p = {p_base:.3f}, 3 seeds) |" in uniformity


def test_a_suite_without_a_baseline_tabulates_each_recipe_alone(tmp_path: Path, suite_diagnose: Any) -> None:
    """No baseline: each recipe's mean, no paired column (it raised a KeyError); a recipe name is one cell."""
    path = _suite(tmp_path)
    path.write_text(path.read_text(encoding="utf-8").replace("baseline: base\n", ""), encoding="utf-8")
    suite = load_suite(path)
    _report(tmp_path / "reports", "base-seed1", false_negative_rate=0.5, uniformity=-1.0, alignment=0.1,
            frequency_probe_accuracy=0.7, cont_oppn_gap=0.3, anisotropy=0.4)  # fmt: skip
    section = suite_diagnose.table(suite, tmp_path / "reports").split("###")[1]
    assert "| Recipe | Seeds | Mean ± std | minus the baseline | minus its control |" in section
    assert "| base | 1 | 50.0000 ± 0.0000 | - | - |" in section

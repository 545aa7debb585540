"""The benchmark runner: a smoke suite runs, resumes (finished runs skipped), and writes tables and plots."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from csekit.bench import load_suite, run_suite
from csekit.core.errors import CsekitError

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "benchmarks" / "suites" / "smoke.yaml"


def test_smoke_suite_runs_resumes_and_plots(tmp_path: Path, tiny_model_dir: Path) -> None:
    from conftest import make_corpus, make_data_dir

    data = make_data_dir(tmp_path / "data")
    corpus = make_corpus(tmp_path / "corpus.txt", lines=48)
    overrides = [f"model.backbone={tiny_model_dir}", f"data.corpus={corpus}"]
    out = tmp_path / "bench"
    messages: list[str] = []
    first = run_suite(SMOKE, out, data_dir=data, overrides=overrides, show_progress=False, log=messages.append)
    names = ["simcse-seed1", "simcse-seed2", "simcse-lr1e-3-seed1", "simcse-lr1e-3-seed2"]
    assert first["ran"] == names and first["skipped"] == []
    for name in names:
        assert (out / name / "results.json").exists() and (out / name / "best").is_dir()
    for plot in ("training_curves.png", "align_uniform.png", "negative_cosines.png"):
        assert (out / plot).stat().st_size > 1000
        assert (out / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = list(csv.DictReader((out / "results.csv").open(encoding="utf-8")))
    assert [r["method"] for r in rows] == ["simcse", "simcse-lr1e-3"] and all(r["seeds"] == "2" for r in rows)
    assert {"STS-B dev mean", "STS-B dev std", "align mean", "uniform mean"} <= set(rows[0])
    markdown = (out / "results.md").read_text(encoding="utf-8")
    assert "| Method | Seeds | STS-B dev | align | uniform |" in markdown and " ± " in markdown

    # a second call trains nothing; an unfinished run (results.json missing) is run again
    (out / "simcse-seed2" / "results.json").unlink()
    second = run_suite(SMOKE, out, data_dir=data, overrides=overrides, show_progress=False, log=messages.append)
    assert second["ran"] == ["simcse-seed2"] and len(second["skipped"]) == 3
    third = run_suite(SMOKE, out, data_dir=data, overrides=overrides, show_progress=False, log=messages.append)
    assert third["ran"] == [] and len(third["skipped"]) == 4


def test_default_suite_is_valid() -> None:
    suite = load_suite(REPO / "benchmarks" / "suites" / "default.yaml")
    methods = ["simcse", "dclr", "whitenedcse", "slt-fai", "osscse", "combined"]
    assert [r.name for r in suite.recipes] == [f"{m}-minilm" for m in methods] and suite.seeds == [42, 43, 44]
    assert suite.recipes[0].path == (REPO / "recipes" / "quickstart.yaml").resolve()
    assert all(r.path.exists() for r in suite.recipes)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("recipes: []\n", "suite.yaml:1: recipes must be a non-empty list"),
        ("seeds: [1]\nrecipe: x\n", "suite.yaml:2: unknown suite key 'recipe'"),
        ("seeds: one\nrecipes: [a.yaml]\n", "suite.yaml:1: seeds must be"),
        ("seeds: [-1]\nrecipes: [a.yaml]\n", "suite.yaml:1: seeds must be a non-empty list of integers in [0, "),
        ("seeds: [true]\nrecipes: [a.yaml]\n", "suite.yaml:1: seeds must be"),
        ("tasks: ','\nrecipes: [a.yaml]\n", 'suite.yaml:1: --tasks ",": no task given'),
        ("tasks: STS21\nrecipes: [a.yaml]\n", 'suite.yaml:1: --tasks: unknown task "STS21"'),
        ("recipes:\n  - recipe: missing.yaml\n", "suite.yaml:2: recipe"),
    ],
)
def test_bad_suites_name_file_and_line(tmp_path: Path, text: str, needle: str) -> None:
    (tmp_path / "a.yaml").write_text("name: a\n", encoding="utf-8")
    (tmp_path / "suite.yaml").write_text(text, encoding="utf-8")
    with pytest.raises(CsekitError, match=needle.replace("[", r"\[")):
        load_suite(tmp_path / "suite.yaml")


def test_csekit_bench_command_runs_a_suite(tmp_path: Path, tiny_model_dir: Path) -> None:
    """`csekit bench SUITE --output DIR --set ...` is the README's command (it once answered "No such command")."""
    from conftest import make_corpus, make_data_dir
    from typer.testing import CliRunner

    from csekit.cli import app

    data = make_data_dir(tmp_path / "data")
    corpus = make_corpus(tmp_path / "corpus.txt", lines=48)
    suite = tmp_path / "suite.yaml"
    suite.write_text(f"seeds: [1]\ntasks: stsb-dev\nrecipes: [{REPO / 'benchmarks/suites/smoke-recipe.yaml'}]\n")
    args = ["bench", str(suite), "--output", str(tmp_path / "out"), "--data-dir", str(data), "--no-progress"]
    args += ["--set", f"model.backbone={tiny_model_dir}", "--set", f"data.corpus={corpus}"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert (tmp_path / "out" / "smoke-recipe-seed1" / "results.json").exists()
    assert "| Method |" in result.output and "ran 1, skipped 0 finished" in result.output

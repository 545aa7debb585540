"""The benchmark runner: a smoke suite runs, resumes (finished runs skipped), and writes tables and plots."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest

from csekit.bench import collect, load_suite, paired_differences, run_suite, summarise
from csekit.core.errors import CsekitError
from csekit.evaluation.published import load_published

REPO = Path(__file__).resolve().parents[2]
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
        wall = json.loads((out / name / "results.json").read_text(encoding="utf-8"))["wall_seconds"]
        assert (
            wall["train"] > 0 and wall["evaluate"] >= 0 and wall["resumed"] is False
        )  # a tiny model: evaluation may take < 1 ms
    for plot in ("training_curves.png", "align_uniform.png", "negative_cosines.png"):
        assert (out / plot).stat().st_size > 1000
        assert (out / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = list(csv.DictReader((out / "results.csv").open(encoding="utf-8")))
    assert [r["method"] for r in rows] == ["simcse", "simcse-lr1e-3"] and all(r["seeds"] == "2" for r in rows)
    assert {"STS-B dev mean", "STS-B dev std", "align mean", "uniform mean"} <= set(rows[0])
    markdown = (out / "results.md").read_text(encoding="utf-8")
    assert "| Method | Seeds | STS-B dev | align | uniform |" in markdown and " ± " in markdown

    # a second call trains nothing; an unfinished run (results.json missing) is run again: resumed from its
    # checkpoint, or started over (its wall time whole, not "resumed") where it stopped before the first one
    (out / "simcse-seed2" / "results.json").unlink()
    (out / "simcse-seed1" / "results.json").unlink()
    shutil.rmtree(out / "simcse-seed1" / "checkpoint")
    second = run_suite(SMOKE, out, data_dir=data, overrides=overrides, show_progress=False, log=messages.append)
    assert second["ran"] == ["simcse-seed1", "simcse-seed2"] and len(second["skipped"]) == 2
    resumed = {
        name: json.loads((out / name / "results.json").read_text(encoding="utf-8"))["wall_seconds"]["resumed"]
        for name in ("simcse-seed1", "simcse-seed2")
    }
    assert resumed == {"simcse-seed1": False, "simcse-seed2": True}
    third = run_suite(SMOKE, out, data_dir=data, overrides=overrides, show_progress=False, log=messages.append)
    assert third["ran"] == [] and len(third["skipped"]) == 4


def test_default_suite_is_valid() -> None:
    suite = load_suite(REPO / "benchmarks" / "suites" / "default.yaml")
    assert suite.transfer_classifier == "sklearn"  # the default protocol; `transfer_classifier: pytorch` the papers'
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
        ("recipes: [a.yaml]\nbaseline: simcse\n", "suite.yaml:2: baseline 'simcse' is not a recipe name of this suite"),
        (
            "recipes: [a.yaml]\ntransfer_classifier: svm\n",
            "suite.yaml:2: transfer_classifier must be one of sklearn, pytorch, found 'svm'",
        ),
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


def test_the_testbed_suite_is_the_controlled_one_on_the_stand_in() -> None:
    """benchmarks/suites/testbed.yaml (issue 63) holds every configuration of controlled.yaml with the same parts and
    shared values; only the backbone (the MLM-only stand-in), the run length, the learning rate, DiffCSE's
    generator and SLT-FAI's frequency counts (the paper's BookCorpus ones) differ."""
    from csekit.training.recipe import load_recipe

    controlled = load_suite(REPO / "benchmarks" / "suites" / "controlled.yaml")
    testbed = load_suite(REPO / "benchmarks" / "suites" / "testbed.yaml")
    assert sorted(r.name for r in testbed.recipes) == sorted(r.name for r in controlled.recipes)
    # the seed papers' methods (and OssCSE's control) run first: their comparison is ready when a session stops
    seed_papers = ["whitenedcse-minilm", "dclr-minilm", "slt-fai-minilm", "simcse-prompt-minilm", "osscse-minilm"]
    assert [r.name for r in testbed.recipes[:6]] == ["simcse-minilm", *seed_papers]
    assert (testbed.seeds, testbed.tasks, testbed.baseline) == (controlled.seeds, controlled.tasks, controlled.baseline)
    # each method's difference from SimCSE is compared with its paper's on BERT-base, never the scores themselves
    assert (testbed.published, testbed.paper_comparison) == (REPO / "benchmarks/published/bert-base.yaml", "deltas")
    published = load_published(testbed.published)
    papers = {r.name: r.published_as for r in testbed.recipes if r.published_as in published}
    assert papers["simcse-minilm"] == "simcse-bert-base" and papers["slt-fai-minilm"] == "slt-fai-simcse"
    assert {"matryoshka-simcse-minilm", "simcse-mlm-minilm", "simcse-prompt-minilm"}.isdisjoint(papers)
    assert len(papers) == len(testbed.recipes) - 3
    standin = "generators/minilm-mlm-standin"
    changed = {"model.backbone": standin, "train.max_steps": 200, "train.eval_every": 50, "train.lr": 1.0e-4}
    by_name = {r.name: r for r in controlled.recipes}
    for ours in testbed.recipes:
        theirs = by_name[ours.name]
        assert (ours.path, ours.control) == (theirs.path, theirs.control)
        mine, base = (dataclasses.asdict(load_recipe(r.path, r.overrides)) for r in (ours, theirs))
        for key, value in changed.items():
            section, name = key.split(".")
            assert mine[section].pop(name) == value
            base[section].pop(name)
        if ours.name == "diffcse-minilm":
            assert mine["objectives"][1].pop("generator") == standin
            base["objectives"][1].pop("generator")
        if ours.name == "slt-fai-minilm":
            for index in (1, 2):
                assert mine["objectives"][index].pop("counts").endswith("freq/bookcorpus_bert-base-uncased/labels.json")
                assert base["objectives"][index].pop("counts").endswith("freq/sts_sick_minilm-l6.json")
        assert mine == base, ours.name


def test_controlled_suite_differs_only_in_the_methods_parts() -> None:
    """Every shared training setting resolves to the same value; the prompt poolers only for PromptBERT, OssCSE
    and their control; fp32 pinned, so that the table does not depend on whether the CPU has native bf16."""
    from csekit.training.recipe import load_recipe

    suite = load_suite(REPO / "benchmarks" / "suites" / "controlled.yaml")
    assert suite.baseline == "simcse-minilm" and suite.seeds == [42, 43, 44] and suite.tasks == "sts,align"
    recipes = {r.name: load_recipe(r.path, r.overrides) for r in suite.recipes}
    assert len({json.dumps(vars(recipe.train), sort_keys=True) for recipe in recipes.values()}) == 1
    shared = recipes["simcse-minilm"].train
    assert (shared.batch_size, shared.lr, shared.warmup_ratio, shared.precision) == (64, 3e-5, 0.0, "fp32")
    assert (shared.dev_task, shared.select_metric, shared.eval_every) == ("sts", "stsb-dev", 25)
    assert {(r.model.backbone, r.model.max_length) for r in recipes.values()} == {("minilm-l6", 32)}
    poolers = {name: r.model.pooler for name, r in recipes.items()}
    assert poolers.pop("promptbert-minilm") == "mask_denoised"
    prompt = {"simcse-prompt-minilm", "osscse-minilm"}
    assert all(pooler == ("mask" if name in prompt else "cls") for name, pooler in poolers.items())
    whitening = {"whitenedcse-minilm", "combined-minilm"}
    headless = {"tsdae-minilm", "ct-minilm", "matryoshka-simcse-minilm"}  # their objectives train the saved vectors
    assert all(recipes[name].model.head["name"] == "none" for name in headless)
    assert recipes["diffcse-minilm"].model.head["name"] == "batchnorm_mlp"  # DiffCSE's own (the authors' --batchnorm)
    others = whitening | headless | {"diffcse-minilm"}
    assert all(r.model.head["name"] == "mlp" for name, r in recipes.items() if name not in others)
    corpora = {name: r.data.corpus for name, r in recipes.items()}
    assert corpora.pop("osscse-minilm") == corpora.pop("combined-minilm")
    assert corpora["sncse-minilm"].endswith("sncse.jsonl") and corpora.pop("simcse-minilm").endswith("sentences.txt")
    assert {corpus for name, corpus in corpora.items() if name != "sncse-minilm"} <= {
        recipes["simcse-minilm"].data.corpus
    }
    new = {"mixcse-minilm", "esimcse-minilm", "sncse-minilm", "rankcse-minilm", "promptbert-minilm", "combined-minilm"}
    issue52 = {"cropping-minilm", "simcse-mlm-minilm", "diffcse-minilm"} | headless
    assert new | issue52 <= set(recipes)
    assert [o["name"] for o in recipes["simcse-mlm-minilm"].objectives] == ["infonce", "mlm"]
    assert recipes["diffcse-minilm"].objectives[1]["generator"] == "generators/minilm-mlm"  # the script's output
    controls = {r.name: r.control for r in suite.recipes if r.control}
    assert controls == {"promptbert-minilm": "simcse-prompt-minilm", "osscse-minilm": "simcse-prompt-minilm"}


def _write_results(
    output: Path,
    method: str,
    seed: int,
    sts12: float,
    average: float,
    wall: dict[str, Any] | None = None,
    best_step: int | None = None,
) -> None:
    folder = output / f"{method}-seed{seed}"
    folder.mkdir(parents=True)
    report = {"recipe": method, "seed": seed, "tasks": {"STS12": {"all": sts12}}, "avg": average}
    if best_step is not None:
        report["best_step"] = best_step
    if wall is not None:
        report["wall_seconds"] = wall
    (folder / "results.json").write_text(json.dumps(report), encoding="utf-8")


def _two_sided_t_p(deltas: list[float]) -> float:
    """The paired t-test by hand: t = mean / (sd / sqrt(n)), and the t distribution's closed-form tails for
    1 degree of freedom (Cauchy: 1 - 2 atan(|t|) / pi) and 2 (1 - |t| / sqrt(2 + t^2))."""
    n = len(deltas)
    mean = sum(deltas) / n
    sd = math.sqrt(sum((d - mean) ** 2 for d in deltas) / (n - 1))
    t = abs(mean / (sd / math.sqrt(n)))
    return {2: 1 - 2 * math.atan(t) / math.pi, 3: 1 - t / math.sqrt(2 + t * t)}[n]


def test_paired_comparison_against_the_baseline_matches_a_hand_computed_t_test(tmp_path: Path) -> None:
    suite = load_suite(_write_suite(tmp_path, ["simcse", "better", "much-better", "partial"]))
    out = tmp_path / "bench"
    averages = {
        "simcse": [0.70, 0.72, 0.71],
        "better": [0.72, 0.75, 0.72],  # +2, +3, +1
        "much-better": [0.75, 0.775, 0.755],  # +5, +5.5, +4.5
        "partial": [0.69, 0.69],  # -1, -3; seed 3 never finished
    }
    _write_results(out, "simcse", 1, sts12=0.5, average=0.5)  # the baseline alone: nothing to pair yet
    summarise(out, suite)
    assert "No other configuration has finished a seed that the baseline finished." in (out / "results.md").read_text()
    (out / "simcse-seed1" / "results.json").unlink()
    (out / "simcse-seed1").rmdir()
    for method, values in averages.items():
        for seed, value in enumerate(values, start=1):
            wall = {"train": 90.0 + 10 * seed, "evaluate": 50.0, "resumed": seed == 3} if method == "better" else None
            _write_results(out, method, seed, sts12=0.5 + value / 10, average=value, wall=wall)

    summarise(out, suite)
    differences = paired_differences(collect(out, suite), "simcse")
    assert list(differences) == ["better", "much-better", "partial"]
    for method, deltas in (("better", [2, 3, 1]), ("much-better", [5, 5.5, 4.5]), ("partial", [-1, -3])):
        average = differences[method]["STS Avg."]
        assert average.seeds == list(range(1, len(deltas) + 1))
        assert average.mean == pytest.approx(sum(deltas) / len(deltas), abs=1e-9)
        assert average.p_value == pytest.approx(_two_sided_t_p(deltas), rel=1e-6)
        assert average.higher == sum(d > 0 for d in deltas)
        sts12 = differences[method]["STS12"]  # the same differences, a tenth as large: the same t
        assert sts12.mean == pytest.approx(average.mean / 10) and sts12.p_value == pytest.approx(average.p_value)
    assert [differences[m]["STS Avg."].significant for m in differences] == [False, True, False]

    markdown = (out / "results.md").read_text(encoding="utf-8")
    assert "## Paired difference against simcse" in markdown
    expected_much_better = f"+5.00 (p = {_two_sided_t_p([5, 5.5, 4.5]):.3f}) *"
    assert f"| much-better | 1, 2, 3 | +0.50 (p = {_two_sided_t_p([5, 5.5, 4.5]):.3f}) * |" in markdown
    assert f"{expected_much_better} | 3/3 |" in markdown
    assert "| partial | 1, 2 |" in markdown and "-2.00 (p = 0.295) | 0/2 |" in markdown
    assert markdown.endswith("|---|---|---|---|---|\n| better | 3 | 110 (100-120) | 50 (50-50) | 1 |\n")
    rows = {row["method"]: row for row in csv.DictReader((out / "results.csv").open(encoding="utf-8"))}
    assert rows["simcse"]["STS Avg. diff"] == "" and rows["simcse"]["STS Avg. mean"] == "71.0000"
    assert float(rows["better"]["STS Avg. diff"]) == pytest.approx(2.0)
    assert float(rows["better"]["STS Avg. p"]) == pytest.approx(_two_sided_t_p([2, 3, 1]), rel=1e-3)
    assert rows["partial"]["STS Avg. paired seeds"] == "2" and rows["better"]["STS Avg. seeds above"] == "3"
    assert rows["better"]["STS-B diff"] == ""  # a column no run has

    # only seeds both finished are paired: without the baseline's seed 3, `better` is compared on seeds 1 and 2
    (out / "simcse-seed3" / "results.json").unlink()
    summarise(out, suite)
    rows = {row["method"]: row for row in csv.DictReader((out / "results.csv").open(encoding="utf-8"))}
    assert rows["better"]["STS Avg. paired seeds"] == "2"
    assert float(rows["better"]["STS Avg. p"]) == pytest.approx(_two_sided_t_p([2, 3]), rel=1e-3)


def _write_suite(folder: Path, entries: list[str]) -> Path:
    """A suite over seeds 1-3 with baseline `simcse`: one recipe line `{recipe: a.yaml, name: ENTRY}` an entry."""
    (folder / "a.yaml").write_text("name: a\n", encoding="utf-8")
    lines = "".join(f"  - {{recipe: a.yaml, name: {entry}}}\n" for entry in entries)
    suite = folder / "suite.yaml"
    suite.write_text(f"seeds: [1, 2, 3]\nbaseline: simcse\nrecipes:\n{lines}", encoding="utf-8")
    return suite


def test_the_summary_names_the_runs_whose_best_model_is_the_starting_one(tmp_path: Path) -> None:
    """A run whose best/ is its starting model (best_step 0: no step beat the start) is named, so that its row is
    not read as a trained model's; no section when every run kept a trained step."""
    suite = load_suite(_write_suite(tmp_path, ["simcse", "other"]))
    out = tmp_path / "bench"
    for method, steps in (("simcse", [250, 125, 250]), ("other", [0, 125, 0])):
        for seed, step in enumerate(steps, start=1):
            _write_results(out, method, seed, sts12=0.5, average=0.5, best_step=step)
    summarise(out, suite)
    markdown = (out / "results.md").read_text(encoding="utf-8")
    assert "## Runs that kept the starting model" in markdown
    assert "is the backbone as loaded: other seed 1, other seed 3.\n" in markdown
    (out / "other-seed1/results.json").unlink()
    (out / "other-seed3/results.json").unlink()
    summarise(out, suite)
    assert "kept the starting model" not in (out / "results.md").read_text(encoding="utf-8")


def test_summary_only_tabulates_finished_runs_without_training(tmp_path: Path) -> None:
    """`csekit bench --summary-only` writes the tables of a suite stopped part way; a difference that rounds to
    zero prints 0.00 (it printed -0.00)."""
    from typer.testing import CliRunner

    from csekit.cli import app

    suite = _write_suite(tmp_path, ["simcse", "same", "unstarted"])
    out = tmp_path / "bench"
    for seed, (base, same) in enumerate([(0.70, 0.69999), (0.72, 0.71997)], start=1):  # -0.001, -0.003 x 100
        _write_results(out, "simcse", seed, sts12=base, average=base)
        _write_results(out, "same", seed, sts12=same, average=same)
    result = CliRunner().invoke(app, ["bench", str(suite), "--output", str(out), "--summary-only"])
    assert result.exit_code == 0, result.output
    assert "4 finished runs summarised" in result.output
    markdown = (out / "results.md").read_text(encoding="utf-8")
    assert "| same | 1, 2 | 0.00 (p = " in markdown and "-0.00" not in markdown
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == [
        "same-seed1",
        "same-seed2",
        "simcse-seed1",
        "simcse-seed2",
    ]

    missing = CliRunner().invoke(app, ["bench", str(suite), "--output", str(tmp_path / "none"), "--summary-only"])
    assert isinstance(missing.exception, CsekitError) and "none: no such folder" in str(missing.exception)


def test_a_recipe_is_also_compared_with_its_control(tmp_path: Path) -> None:
    """OssCSE's prompt pooler is one of its parts: the suite compares it with SimCSE on the same pooler too."""
    suite = load_suite(_write_suite(tmp_path, ["simcse", "prompt", "method, control: prompt"]))
    assert [r.control for r in suite.recipes] == [None, None, "prompt"]
    out = tmp_path / "bench"
    values = {"simcse": [0.70, 0.72, 0.71], "prompt": [0.74, 0.75, 0.73], "method": [0.75, 0.77, 0.745]}
    for method, per_seed in values.items():
        for seed, value in enumerate(per_seed, start=1):
            _write_results(out, method, seed, sts12=value, average=value)
    summarise(out, suite)
    markdown = (out / "results.md").read_text(encoding="utf-8")
    against_control = markdown.split("## Paired difference of method against its control prompt")[1]
    p_value = _two_sided_t_p([1, 2, 1.5])
    assert f"| method | 1, 2, 3 | +1.50 (p = {p_value:.3f}) * |" in against_control  # STS12: +1, +2, +1.5
    assert f"+1.50 (p = {p_value:.3f}) * | 3/3 |" in against_control  # STS Avg.: +1, +2, +1.5
    assert "| prompt |" not in against_control  # only the recipe that names the control
    baseline_section = markdown.split("## Paired difference against simcse")[1].split("## Paired difference of")[0]
    assert "| method | 1, 2, 3 | +4.50" in baseline_section  # +5, +5, +3.5 against the suite baseline, as before


@pytest.mark.parametrize("control", ["missing", "method"])
def test_a_control_must_be_another_recipe_of_the_suite(tmp_path: Path, control: str) -> None:
    (tmp_path / "a.yaml").write_text("name: a\n", encoding="utf-8")
    (tmp_path / "suite.yaml").write_text(
        f"recipes:\n  - {{recipe: a.yaml, name: simcse}}\n  - {{recipe: a.yaml, name: method, control: {control}}}\n",
        encoding="utf-8",
    )
    with pytest.raises(CsekitError, match=f"suite.yaml:3: control '{control}' of 'method' is not another recipe name"):
        load_suite(tmp_path / "suite.yaml")


def test_a_tiny_p_value_prints_as_below_one_thousandth() -> None:
    """A p-value of 2e-5 printed as `p = 0.000` (seen in the controlled suite's STS12 column)."""
    from csekit.bench import PairedDifference, format_paired_markdown

    tiny = PairedDifference([1, 2, 3], -0.93, 2e-5, 0)
    plain = PairedDifference([1, 2, 3], 0.5, 0.0421, 2)
    markdown = format_paired_markdown("simcse", {"method": {"STS12": tiny, "STS Avg.": plain}})
    assert "| -0.93 (p < 0.001) * |" in markdown and "| +0.50 (p = 0.042) * | 2/3 |" in markdown
    assert "p = 0.000" not in markdown


def test_every_recipe_of_a_suite_is_checked_before_the_first_training(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An SLT-FAI recipe whose token counts were never made stops the suite before anything trains, with the
    command that makes them; so does an OssCSE corpus that `csekit augment` did not write. Run from an empty
    folder: the recipes name those inputs relative to where csekit runs, and a checkout may have made them."""
    from conftest import make_corpus, make_data_dir

    monkeypatch.chdir(tmp_path)
    data = make_data_dir(tmp_path / "data")
    corpus = make_corpus(tmp_path / "corpus.txt", lines=48)
    suite = tmp_path / "suite.yaml"
    suite.write_text(
        f"seeds: [1]\nrecipes:\n"
        f"  - {{recipe: {REPO / 'recipes' / 'quickstart.yaml'}, name: simcse, set: [data.corpus={corpus}]}}\n"
        f"  - {{recipe: {REPO / 'recipes' / 'slt-fai-minilm.yaml'}, name: slt-fai, set: [data.corpus={corpus}]}}\n"
        f"  - {{recipe: {REPO / 'recipes' / 'osscse-minilm.yaml'}, name: osscse}}\n",
        encoding="utf-8",
    )
    out = tmp_path / "bench"
    overrides = [f"model.backbone={tiny_model_dir}", "train.max_steps=2", "train.batch_size=8"]
    with pytest.raises(CsekitError) as error:
        run_suite(suite, out, data_dir=data, overrides=overrides, show_progress=False, log=lambda line: None)
    message = str(error.value)
    assert "nothing trained, 2 recipe(s) cannot run" in message
    assert "[slt-fai] token counts file freq/sts_sick_minilm-l6.json not found" in message
    assert "make it with: csekit freq" in message
    assert "[osscse] corpus corpus/sts_sick_unlabeled_osscse.jsonl not found" in message
    assert "make it with: csekit augment" in message
    assert not out.exists()


def test_a_suite_says_how_long_the_rest_will_take(tmp_path: Path, tiny_model_dir: Path) -> None:
    from conftest import make_corpus, make_data_dir

    data = make_data_dir(tmp_path / "data")
    corpus = make_corpus(tmp_path / "corpus.txt", lines=48)
    messages: list[str] = []
    overrides = [f"model.backbone={tiny_model_dir}", f"data.corpus={corpus}"]
    run_suite(SMOKE, tmp_path / "bench", data_dir=data, overrides=overrides, show_progress=False, log=messages.append)
    assert messages[0] == "simcse-seed1: training and evaluating (run 1 of 4)"
    progress = [line for line in messages if "left, about" in line]
    assert [line.split(";")[1].split(",")[0].strip() for line in progress] == [
        "3 run(s) left",
        "2 run(s) left",
        "1 run(s) left",
    ]
    assert all(line.rstrip().endswith(" s more") for line in progress)  # tiny runs: seconds


def test_ctrl_c_in_bench_says_how_to_continue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import sys

    import csekit.bench
    from csekit import cli
    from csekit.training.trainer import TrainingInterrupted

    def interrupted(*args: Any, **kwargs: Any) -> None:
        raise TrainingInterrupted(7, tmp_path / "bench" / "simcse-seed1")

    monkeypatch.setattr(csekit.bench, "run_suite", interrupted)
    args = ["csekit", "bench", str(SMOKE), "--output", str(tmp_path / "bench"), "--set", "train.max_steps=2"]
    monkeypatch.setattr(sys, "argv", args)
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    assert exit_info.value.code == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"csekit: interrupted at step 7 of {tmp_path / 'bench' / 'simcse-seed1'}; continue the suite with: "
        f"csekit bench {SMOKE} --output {tmp_path / 'bench'} --set train.max_steps=2"
    ]


def test_duplicates_suite_differs_only_in_data_duplicates() -> None:
    """The three modes on the controlled suite's SimCSE settings (its simcse-minilm entry), paired against keep."""
    from csekit.training.recipe import load_recipe

    suite = load_suite(REPO / "benchmarks" / "suites" / "duplicates.yaml")
    controlled = load_suite(REPO / "benchmarks" / "suites" / "controlled.yaml")
    assert suite.baseline == "keep" and suite.seeds == controlled.seeds and suite.tasks == controlled.tasks
    simcse = next(r for r in controlled.recipes if r.name == "simcse-minilm")
    reference = dataclasses.asdict(load_recipe(simcse.path, simcse.overrides))
    assert reference["data"].pop("duplicates") == "keep"
    for entry in suite.recipes:
        recipe = dataclasses.asdict(load_recipe(entry.path, entry.overrides))
        assert recipe["data"].pop("duplicates") == entry.name
        assert recipe == reference
    assert [r.name for r in suite.recipes] == ["keep", "separate", "drop"]


def test_every_public_bench_name_is_imported_from_its_module_when_first_used() -> None:
    """csekit.bench names each public name three times (TYPE_CHECKING, `_HOMES`, `__all__`): a name listed in one
    but not the others would fail only when a user first reached for it."""
    import importlib

    import csekit.bench as bench

    assert sorted(bench.__all__) == sorted(name for names in bench._HOMES.values() for name in names)
    for module, names in bench._HOMES.items():
        home = importlib.import_module(f"csekit.bench.{module}")
        assert all(getattr(bench, name) is getattr(home, name) for name in names), module
    with pytest.raises(AttributeError, match="no attribute 'missing'"):
        bench.missing  # noqa: B018

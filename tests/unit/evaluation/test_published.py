"""Published numbers as data, the paper suites, and `csekit bench`'s comparison with a paper's row."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
import yaml
from prompteol_reference import AUTHORS_COMMIT, RUN_ICL_TEMPLATES, demonstration_of

from csekit.bench.run import run_suite
from csekit.bench.suite import load_suite
from csekit.bench.summary import summarise
from csekit.core.errors import CsekitError
from csekit.encoding.prompteol import Demonstration
from csekit.evaluation.published import PUBLISHED_COLUMNS, compare_with_paper, load_published

REPO = Path(__file__).resolve().parents[3]
PUBLISHED = REPO / "benchmarks" / "published"
PAPER_BACKBONES = {"bert-base-uncased": "bert-base.yaml", "roberta-base": "roberta-base.yaml"}
SEVEN = ("STS12", "STS13", "STS14", "STS15", "STS16", "STS-B", "SICK-R")


def _t975(degrees: int) -> float:
    """Student's t quantile 0.975 in closed form for 1 and 2 degrees of freedom (tan(0.475 pi); from
    t / sqrt(2 + t^2) = 0.95)."""
    return {1: math.tan(0.475 * math.pi), 2: math.sqrt(2 * 0.95**2 / (1 - 0.95**2))}[degrees]


def _expected(paper: float, values: list[float]) -> tuple[float, float, float, float]:
    """Mean, std (ddof 0) and the one-run 95% prediction interval, computed by hand."""
    n = len(values)
    mean = sum(values) / n
    std0 = math.sqrt(sum((v - mean) ** 2 for v in values) / n)
    std1 = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = _t975(n - 1) * std1 * math.sqrt(1 + 1 / n)
    return mean, std0, mean - half, mean + half


def _signed(value: float) -> str:
    text = f"{value:+.2f}"
    return "0.00" if text in ("+0.00", "-0.00") else text


def _line(label: str, paper: float, values: list[float]) -> str:
    """The results.md line of one task, written out from the hand computation."""
    mean, std0, low, high = _expected(paper, values)
    within = "yes" if low <= paper <= high else "no"
    return (
        f"| {label} | {paper:.2f} | {mean:.2f} ± {std0:.2f} ({len(values)} seeds) | {_signed(mean - paper)} | "
        f"{low:.2f} to {high:.2f} | {within} | sentence end none |"
    )


# --- the published data ----------------------------------------------------------------------------------


def _recipe_backbone(path: Path) -> str | None:
    raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    return (raw.get("model") or {}).get("backbone")


@pytest.mark.parametrize(("backbone", "file"), sorted(PAPER_BACKBONES.items()))
def test_every_paper_recipe_has_its_published_row_or_a_stated_reason(backbone: str, file: str) -> None:
    """Every shipped recipe on BERT-base or RoBERTa-base is in its published file, and nothing else is."""
    published = load_published(PUBLISHED / file)
    recipes = {p.stem for p in (REPO / "recipes").glob("*.yaml") if _recipe_backbone(p) == backbone}
    assert recipes, backbone
    assert sorted(recipes - set(published)) == [], f"recipes without a published row or reason in {file}"
    assert sorted(set(published) - recipes) == [], f"entries of {file} that name no shipped {backbone} recipe"
    for row in published.values():
        assert (row.reason is None) == bool(row.scores) and (row.source is None) == (row.reason is not None)


@pytest.mark.parametrize("file", sorted(path.name for path in PUBLISHED.glob("*.yaml")))
def test_published_averages_are_the_mean_of_their_seven_tasks(file: str) -> None:
    """A misread number shows: each row's STS Avg. is the mean of its seven tasks (and the transfer average of
    its seven), up to the rounding of the printed figures (PromptBERT's README averages seeds: 0.02)."""
    rows = load_published(PUBLISHED / file).items()
    for name, row in [*rows, *((f"{n}.paper_baseline", r.paper_baseline) for n, r in rows if r.paper_baseline)]:
        if all(label in row.scores for label in SEVEN):
            mean = sum(row.scores[label] for label in SEVEN) / 7
            assert mean == pytest.approx(row.scores["STS Avg."], abs=0.02), name
        transfer = [label for label in PUBLISHED_COLUMNS[8:15]]
        if all(label in row.scores for label in transfer):
            mean = sum(row.scores[label] for label in transfer) / 7
            assert mean == pytest.approx(row.scores["Transfer Avg."], abs=0.01), name


def test_the_prompteol_rows_are_run_icl_shs_models_each_with_its_template() -> None:
    """One entry per model of run_icl.sh (kongds/scaling_sentemb 8567aa0), keyed by its name, its source naming the
    README's table and the template it ran (a demonstration csekit accepts as it is written there); every task and
    an average that is the mean of the seven printed ones up to their rounding (0.005); the note says what they are."""
    published = load_published(PUBLISHED / "prompteol.yaml")
    assert list(published) == list(RUN_ICL_TEMPLATES)  # the README's order, which is run_icl.sh's
    for model, row in published.items():
        template = RUN_ICL_TEMPLATES[model]
        assert f"kongds/scaling_sentemb {AUTHORS_COMMIT}, README.md table" in (row.source or ""), model
        assert f"`bash run_icl.sh {model}`" in (row.source or "") and template in (row.source or ""), model
        assert f'row "OPT {model.removeprefix("opt-").upper()}"' in (row.source or ""), model
        Demonstration(*demonstration_of(template))  # csekit takes the demonstration as the template writes it
        assert list(row.scores) == [*SEVEN, "STS Avg."], model
        mean = sum(row.scores[label] for label in SEVEN) / 7
        assert mean == pytest.approx(row.scores["STS Avg."], abs=0.005 + 1e-9), model
        assert "WITH an in-context demonstration" in (row.note or "") and "could not be read" in (row.note or "")


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("a: {source: T1, scores: {STS12: 70}}\nb: {scores: {STS12: 70}}\n", "pub.yaml:2: b: give `source`"),
        ("a: {source: T1, scores: {STS 12: 70}}\n", "pub.yaml:1: a: unknown column 'STS 12' (did you mean"),
        ("a: {source: T1, scores: {STS12: 700}}\n", "pub.yaml:1: a: STS12 must be a number in [-100, 100]"),
        ("a: {source: T1, scores: {STS12: .nan}}\n", "pub.yaml:1: a: STS12 must be a number"),
        ("a: {source: T1, scores: {STS12: true}}\n", "pub.yaml:1: a: STS12 must be a number"),
        ("a: {reason: '', source: T1}\n", "pub.yaml:1: a: a reason is a non-empty text, given alone"),
        ("a: {reason: none read, scores: {STS12: 70}}\n", "pub.yaml:1: a: a reason is a non-empty text, given alone"),
        ("a: {source: T1, scores: {STS12: 70}, table: 1}\n", "pub.yaml:1: a: unknown key 'table'"),
        ("- a\n", "pub.yaml: a published-numbers file maps recipe names"),
        ("a: {source: T1, scores: {STS12: 70}, means: {runs: 1}}\n", "pub.yaml:1: a: means.runs must be a count"),
        ("a: {source: T1, scores: {STS12: 70}, means: {runs: 3, columns: [MR]}}\n", "a: means.columns must list"),
        ("a: {source: T1, scores: {STS12: 70}, means: [3]}\n", "pub.yaml:1: a: means is {runs"),
    ],
)
def test_a_bad_published_file_names_file_line_and_entry(tmp_path: Path, text: str, needle: str) -> None:
    (tmp_path / "pub.yaml").write_text(text, encoding="utf-8")
    with pytest.raises(CsekitError, match=needle.replace("[", r"\[").replace("(", r"\(")):
        load_published(tmp_path / "pub.yaml")


def test_the_prediction_interval_matches_the_hand_computation() -> None:
    for values in ([70.0, 72.0, 71.0], [76.1, 76.9], [80.0, 80.5, 79.0]):
        for paper in (60.0, 71.5, 80.2):
            result = compare_with_paper(paper, values)
            mean, std0, low, high = _expected(paper, values)
            assert (result.mean, result.std) == (pytest.approx(mean), pytest.approx(std0))
            assert (result.low, result.high) == (pytest.approx(low), pytest.approx(high))
            assert result.within == (low <= paper <= high) and result.difference == pytest.approx(mean - paper)
    single = compare_with_paper(70.0, [71.0])
    assert (single.low, single.high, single.within, single.std) == (None, None, None, 0.0)


def test_a_published_mean_of_runs_is_compared_with_the_range_of_a_mean() -> None:
    """The mean of k runs varies less than one run: mean ± t · s · sqrt(1/k + 1/n), here 71.0 ± t(2) · 1 · sqrt(5/6)
    for k = 2 (up to 74.93) against sqrt(4/3) for one run (up to 75.97): 75.5 is in one run's range, not a mean's."""
    values = [70.0, 72.0, 71.0]
    one = compare_with_paper(75.5, values)
    mean_of_two = compare_with_paper(75.5, values, runs=2)
    half = _t975(2) * 1.0 * math.sqrt(1 / 2 + 1 / 3)
    assert (mean_of_two.low, mean_of_two.high) == (pytest.approx(71.0 - half), pytest.approx(71.0 + half))
    assert one.within and not mean_of_two.within and mean_of_two.runs == 2


def test_the_rows_marked_as_means_could_not_be_one_run() -> None:
    """WhitenedCSE's SST, TREC and MRPC accuracies are no count of right answers on those fixed test sets; the
    PromptBERT rows are the README's means over seeds (the count not given: compared as a mean of 2)."""
    test_sizes = {"SST": 1821, "TREC": 500, "MRPC": 1725}
    row = load_published(PUBLISHED / "bert-base.yaml")["whitenedcse-bert-base"]
    assert set(row.means) == {*test_sizes, "Transfer Avg."} and row.runs_of("MR") == 1
    for label, size in test_sizes.items():
        counts = range(size + 1)
        assert all(round(100 * right / size, 2) != row.scores[label] for right in counts), label
        assert row.runs_of(label) == 2
    for file, recipe in (("bert-base.yaml", "promptbert-bert-base"), ("roberta-base.yaml", "promptbert-roberta-base")):
        promptbert = load_published(PUBLISHED / file)[recipe]
        assert set(promptbert.means) == set(promptbert.scores)


# --- the comparison in results.md and results.csv ---------------------------------------------------------


def _write_run(output: Path, method: str, seed: int, scores: dict[str, float]) -> None:
    """A finished run's results.json with the given STS columns (fractions, as csekit writes them)."""
    keys = {label: (task, key) for label, task, key in _sts_columns()}
    tasks = {keys[label][0]: {keys[label][1]: value} for label, value in scores.items()}
    report: dict[str, object] = {"recipe": method, "seed": seed, "tasks": tasks}
    if set(scores) == set(SEVEN):
        report["avg"] = sum(scores.values()) / 7
    folder = output / f"{method}-seed{seed}"
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps(report), encoding="utf-8")


def _sts_columns() -> tuple[tuple[str, str, str], ...]:
    from csekit.evaluation.tasks import table_columns

    return table_columns("sts")


def test_results_md_and_csv_put_each_paper_number_beside_csekits_seeds(tmp_path: Path) -> None:
    """A paper row within the spread, one outside, a task the suite did not evaluate, one seed (no judgement),
    a reason, a missing entry and a recipe compared with another's row (`paper:`)."""
    (tmp_path / "a.yaml").write_text("name: a\n", encoding="utf-8")
    (tmp_path / "pub.yaml").write_text(
        "simcse: {source: Table 5 of the test, scores: {STS12: 71.0, STS13: 90.0, SICK-R: 70.0, STS Avg.: 75.0}}\n"
        "single: {source: Table 6, scores: {STS12: 70.0}, note: one seed only}\n"
        "unread: {reason: the table is an image}\n",
        encoding="utf-8",
    )
    (tmp_path / "suite.yaml").write_text(
        "seeds: [1, 2, 3]\npublished: pub.yaml\nrecipes:\n"
        "  - {recipe: a.yaml, name: simcse}\n  - {recipe: a.yaml, name: renamed, paper: simcse}\n"
        "  - {recipe: a.yaml, name: single}\n  - {recipe: a.yaml, name: unread}\n  - {recipe: a.yaml, name: absent}\n",
        encoding="utf-8",
    )
    suite = load_suite(tmp_path / "suite.yaml")
    out = tmp_path / "bench"
    sts12 = {1: 0.70, 2: 0.72, 3: 0.71}
    sts13 = {1: 0.80, 2: 0.81, 3: 0.79}
    for method in ("simcse", "renamed"):
        for seed in (1, 2, 3):
            _write_run(out, method, seed, {"STS12": sts12[seed], "STS13": sts13[seed]})
    _write_run(out, "single", 1, {"STS12": 0.69})
    summary = summarise(out, suite)
    markdown = (out / "results.md").read_text(encoding="utf-8")
    assert summary["table"] == markdown
    section = markdown.split("## Against the published numbers")[1]
    simcse = section.split("### simcse\n")[1].split("###")[0]
    assert simcse.startswith("\nPaper: Table 5 of the test.\n\n| Task | Paper | csekit | Difference |")
    assert _line("STS12", 71.0, [70.0, 72.0, 71.0]) + "\n" in simcse  # 71.0 is the mean: within
    assert _line("STS13", 90.0, [80.0, 81.0, 79.0]).endswith("| no | sentence end none |")
    assert _line("STS13", 90.0, [80, 81, 79]) in simcse
    assert "| SICK-R | 70.00 | not evaluated | - | - | - | - |" in simcse
    assert "| STS Avg. | 75.00 | not evaluated | - | - | - | - |" in simcse
    assert section.split("### renamed\n")[1].split("###")[0] == simcse  # compared with simcse's row
    assert "| STS12 | 70.00 | 69.00 ± 0.00 (1 seeds) | -1.00 | - | - | sentence end none |" in section
    assert "Paper: Table 6. Note: one seed only" in section
    assert "### unread\n\nNo published numbers: the table is an image\n" in section
    assert "### absent\n\nNo entry 'absent' in the published file.\n" in section
    assert "Within the seed spread: 2 of 4 published numbers." in section  # STS12 yes, STS13 no, twice

    rows = {row["method"]: row for row in csv.DictReader((out / "results.csv").open(encoding="utf-8"))}
    mean, _, low, high = _expected(90.0, [80.0, 81.0, 79.0])
    assert rows["simcse"]["STS13 paper"] == "90.00" and rows["simcse"]["STS13 paper within"] == "no"
    assert float(rows["simcse"]["STS13 paper diff"]) == pytest.approx(mean - 90.0, abs=1e-4)
    assert float(rows["simcse"]["STS13 paper range low"]) == pytest.approx(low, abs=1e-4)
    assert float(rows["simcse"]["STS13 paper range high"]) == pytest.approx(high, abs=1e-4)
    assert rows["simcse"]["STS12 paper within"] == "yes" and rows["single"]["STS12 paper within"] == ""
    assert set(rows) == {"simcse", "renamed", "single"} and rows["renamed"]["STS13 paper"] == "90.00"
    assert "SICK-R paper" not in rows["simcse"]  # a published column no run evaluated
    assert not (out / "sts_avg_vs_paper.png").exists()  # no STS average evaluated: nothing to mark


def test_the_plot_marks_the_papers_average(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("name: a\n", encoding="utf-8")
    (tmp_path / "pub.yaml").write_text("simcse: {source: T, scores: {STS Avg.: 76.25}}\n", encoding="utf-8")
    (tmp_path / "suite.yaml").write_text(
        "seeds: [1, 2]\npublished: pub.yaml\nrecipes: [{recipe: a.yaml, name: simcse}]\n", encoding="utf-8"
    )
    out = tmp_path / "bench"
    for seed in (1, 2):
        _write_run(out, "simcse", seed, dict.fromkeys(SEVEN, 0.7 + seed / 100))
    summary = summarise(out, load_suite(tmp_path / "suite.yaml"))
    plot = out / "sts_avg_vs_paper.png"
    assert str(plot) in summary["plots"] and plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert _line("STS Avg.", 76.25, [71.0, 72.0]) in summary["table"]


@pytest.mark.parametrize(
    ("suite", "needle"),
    [
        ("published: missing.yaml\n", r"suite.yaml:1: published-numbers file .*missing.yaml does not exist"),
        ("published: pub.yaml\nrecipes: [{recipe: a.yaml, paper: nobody}]\n", "suite.yaml:2: paper 'nobody' of 'a'"),
        ("recipes: [{recipe: a.yaml, paper: simcse}]\n", "suite.yaml:1: paper needs a `published:` file"),
        ("published: bad.yaml\n", r"suite.yaml:1: .*bad.yaml:1: x: STS12 must be a number"),
    ],
)
def test_a_suites_published_file_and_paper_keys_are_checked_when_it_is_read(
    tmp_path: Path, suite: str, needle: str
) -> None:
    (tmp_path / "a.yaml").write_text("name: a\n", encoding="utf-8")
    (tmp_path / "pub.yaml").write_text("simcse: {source: T, scores: {STS12: 70}}\n", encoding="utf-8")
    (tmp_path / "bad.yaml").write_text("x: {source: T, scores: {STS12: high}}\n", encoding="utf-8")
    if "recipes" not in suite:
        suite += "recipes: [a.yaml]\n"
    (tmp_path / "suite.yaml").write_text(suite, encoding="utf-8")
    with pytest.raises(CsekitError, match=needle):
        load_suite(tmp_path / "suite.yaml")


def test_csekit_bench_prints_the_comparison_of_a_tiny_models_seeds(tmp_path: Path, tiny_model_dir: Path) -> None:
    """Three seeds of a tiny model on STS-B test against a hand-written row: the printed lines are the ones
    recomputed here from each run's results.json; a row at csekit's mean is then within the spread."""
    from conftest import make_corpus, make_data_dir
    from typer.testing import CliRunner

    from csekit.cli import app

    data = make_data_dir(tmp_path / "data")
    stsb = data / "sts" / "STSBenchmark"
    (stsb / "sts-test.csv").write_text((stsb / "sts-dev.csv").read_text(encoding="utf-8"), encoding="utf-8")
    corpus = make_corpus(tmp_path / "corpus.txt", lines=48)
    (tmp_path / "pub.yaml").write_text(
        "simcse: {source: hand-written (Table 0), scores: {STS-B: 99.5, STS Avg.: 76.25}}\n", encoding="utf-8"
    )
    suite = tmp_path / "suite.yaml"
    suite.write_text(
        f"seeds: [1, 2, 3]\ntasks: STSBenchmark\nsample_sentences: 10\npublished: pub.yaml\n"
        f"recipes: [{{recipe: {REPO / 'benchmarks/suites/smoke-recipe.yaml'}, name: simcse}}]\n",
        encoding="utf-8",
    )
    out = tmp_path / "out"
    args = ["bench", str(suite), "--output", str(out), "--data-dir", str(data), "--no-progress"]
    args += ["--set", f"model.backbone={tiny_model_dir}", "--set", f"data.corpus={corpus}"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    values = []
    for seed in (1, 2, 3):
        report = json.loads((out / f"simcse-seed{seed}" / "results.json").read_text(encoding="utf-8"))
        values.append(100.0 * report["tasks"]["STSBenchmark"]["test"])
    assert len(set(values)) == 3  # three different seeds
    table = "| Task | Paper | csekit | Difference | 95% range | Paper within | Protocol |\n" + "|---" * 7 + "|\n"
    expected = table + _line("STS-B", 99.5, values) + "\n| STS Avg. | 76.25 | not evaluated | - | - | - | - |\n"
    assert "Paper: hand-written (Table 0).\n\n" + expected in result.output

    mean = sum(values) / 3
    (tmp_path / "pub.yaml").write_text(f"simcse: {{source: at the mean, scores: {{STS-B: {mean:.2f}}}}}\n")
    again = CliRunner().invoke(app, ["bench", str(suite), "--output", str(out), "--summary-only"])
    assert again.exit_code == 0, again.output
    assert _line("STS-B", round(mean, 2), values).endswith("| yes | sentence end none |")
    assert _line("STS-B", round(mean, 2), values) in again.output


# --- the paper suites ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("backbone", ["bert-base", "roberta-base"])
def test_the_paper_suites_resolve_and_name_the_command_for_each_missing_input(tmp_path: Path, backbone: str) -> None:
    """Each paper suite: its recipes on this backbone, 3 seeds or more, the published file, every recipe with a
    published row or reason; run against an empty data folder, it stops before training and names, recipe by
    recipe, the command that makes each missing input (wiki1m, the augmented corpora, the evaluation data)."""
    from csekit.training.recipe import load_recipe

    path = REPO / "benchmarks" / "suites" / f"papers-{backbone}.yaml"
    suite = load_suite(path)
    assert len(suite.seeds) >= 3 and suite.published == PUBLISHED / f"{backbone}.yaml"
    assert suite.transfer_classifier == "pytorch"  # the papers' transfer protocol (issue #53)
    assert "Expected device time" in path.read_text(encoding="utf-8")
    published = load_published(suite.published)
    hub_name = {"bert-base": "bert-base-uncased", "roberta-base": "roberta-base"}[backbone]
    for recipe in suite.recipes:
        config = load_recipe(recipe.path, recipe.overrides)
        assert config.model.backbone == hub_name and "wiki1m" in config.data.corpus, recipe.name
        assert recipe.published_as in published, recipe.name
    assert {"simcse", "dclr", "whitenedcse", "osscse", "esimcse", "sncse", "promptbert"} <= {
        r.name.split("-")[0] for r in suite.recipes
    }

    data = tmp_path / "data"
    data.mkdir()
    with pytest.raises(CsekitError) as error:
        run_suite(path, tmp_path / "out", data_dir=data, show_progress=False, log=lambda line: None)
    message = str(error.value)
    assert f"nothing trained, {len(suite.recipes)} recipe(s) cannot run" in message
    assert message.count(f"make it with: csekit download-data {data} --corpus wiki1m") == len(suite.recipes) - 2
    assert f"[osscse-{backbone}] corpus corpus/wiki1m_osscse.jsonl not found" in message
    assert f"[sncse-{backbone}] corpus corpus/wiki1m_sncse.jsonl not found" in message
    assert message.count("make it with: csekit augment") == 2
    assert "[evaluation data] no data for STS12, STS13" in message and f"`csekit download-data {data}`" in message
    assert not (tmp_path / "out").exists()


def test_the_offline_example_suite_says_it_is_not_a_reproduction() -> None:
    """The README's worked example compares all-MiniLM-L6-v2 with a BERT-base row only to show the format."""
    path = REPO / "benchmarks" / "suites" / "papers-example-minilm.yaml"
    suite = load_suite(path)
    assert path.read_text(encoding="utf-8").startswith("# NOT A PAPER REPRODUCTION")
    assert "not a reproduction" in suite.name and [r.published_as for r in suite.recipes] == ["simcse-bert-base"]

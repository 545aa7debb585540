"""A suite's paper's-difference table (`paper_comparison`): each method's paired difference from the baseline beside
its paper's own difference, from the baseline the paper compares it with (its `paper_baseline`, else the suite
baseline's published row)."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import ttest_rel
from test_bench import _write_results

from csekit.bench import load_suite, summarise
from csekit.bench.deltas import format_delta_markdown, paper_differences
from csekit.bench.papers import same_sign
from csekit.bench.suite import Suite, SuiteRecipe
from csekit.bench.tables import PairedDifference
from csekit.core.errors import CsekitError
from csekit.evaluation.published import PublishedRow, load_published, paper_delta

SCORES = st.floats(min_value=-100.0, max_value=100.0, allow_nan=False).map(lambda value: round(value, 2))

PUBLISHED = """\
simcse-paper: {source: S Table 1, scores: {STS Avg.: 76.25}}
up-paper: {source: U Table 2, scores: {STS Avg.: 77.25}}
own-paper:
  source: O Table 1
  scores: {STS Avg.: 76.18}
  paper_baseline: {source: O Table 1 rerun, scores: {STS Avg.: 74.60}}
reasoned: {reason: no table could be read}
"""


@given(row=SCORES, base=SCORES, own=st.none() | SCORES)
@settings(max_examples=60, deadline=None)
def test_the_papers_difference_is_its_row_minus_the_baseline_it_compares_with(
    tmp_path_factory: pytest.TempPathFactory, row: float, base: float, own: float | None
) -> None:
    """Read from a file: the row's STS Avg. minus its own `paper_baseline`'s where it has one, else the suite
    baseline's row's; none where either number is missing."""
    path = tmp_path_factory.mktemp("pub") / "pub.yaml"
    own_text = "" if own is None else f", paper_baseline: {{source: rerun, scores: {{STS Avg.: {own}}}}}"
    path.write_text(
        f"base: {{source: B, scores: {{STS Avg.: {base}}}}}\n"
        f"method: {{source: M, scores: {{STS Avg.: {row}, STS12: 50}}{own_text}}}\n",
        encoding="utf-8",
    )
    rows = load_published(path)
    expected = row - (base if own is None else own)
    assert paper_delta(rows["method"], rows["base"]) == pytest.approx(expected, abs=1e-9)
    assert paper_delta(rows["method"], None) == (None if own is None else pytest.approx(row - own, abs=1e-9))
    assert paper_delta(rows["method"], rows["base"], label="STS12") is None  # the baseline has no STS12


@pytest.mark.parametrize(
    ("entry", "needle"),
    [
        ("paper_baseline: {reason: none}", "a.paper_baseline: unknown key 'reason'"),
        (
            "paper_baseline: {source: r, scores: {STS12: 1}, paper_baseline: {}}",
            "a.paper_baseline: unknown key 'paper_baseline'",
        ),
        ("paper_baseline: {source: r, scores: {STS12: 700}}", "a.paper_baseline: STS12 must be a number"),
        ("paper_baseline: {scores: {STS12: 70}}", "a.paper_baseline: give `source`"),
        ("paper_baseline: [70]", "a.paper_baseline: an entry is a mapping"),
    ],
)
def test_a_bad_paper_baseline_names_the_file_line_and_entry(tmp_path: Path, entry: str, needle: str) -> None:
    (tmp_path / "pub.yaml").write_text(f"z: {{reason: r}}\na: {{source: T, scores: {{STS12: 70}}, {entry}}}\n")
    with pytest.raises(CsekitError, match="pub.yaml:2: " + needle.replace("[", r"\[").replace("{", r"\{")):
        load_published(tmp_path / "pub.yaml")


def _suite(folder: Path, comparison: str | None, extra: str = "") -> Path:
    (folder / "a.yaml").write_text("name: a\n", encoding="utf-8")
    (folder / "pub.yaml").write_text(PUBLISHED, encoding="utf-8")
    recipes = [
        "{recipe: a.yaml, name: simcse, paper: simcse-paper}",
        "{recipe: a.yaml, name: up, paper: up-paper}",
        "{recipe: a.yaml, name: own, paper: own-paper}",
        "{recipe: a.yaml, name: unpublished}",
        "{recipe: a.yaml, name: reasoned}",
    ]
    setting = "" if comparison is None else f"paper_comparison: {comparison}\n"
    text = f"seeds: [1, 2, 3]\nbaseline: simcse\npublished: pub.yaml\n{setting}{extra}recipes:\n"
    path = folder / "suite.yaml"
    path.write_text(text + "".join(f"  - {line}\n" for line in recipes), encoding="utf-8")
    return path


@pytest.mark.parametrize("comparison", ["deltas", "scores", None])
def test_the_summary_sets_each_methods_difference_beside_its_papers(tmp_path: Path, comparison: str | None) -> None:
    """Every recipe but the baseline gets a row, in the suite's order: csekit's paired difference and p (scipy's
    ttest_rel), the paper's difference, the baseline it is taken from, and whether the signs agree. Under
    `deltas` the scores are not compared with the papers'; under `scores` (the default) they are as well."""
    suite = load_suite(_suite(tmp_path, comparison))
    out = tmp_path / "out"
    values = {
        "simcse": [0.60, 0.61, 0.62],
        "up": [0.62, 0.64, 0.63],  # +2, +3, +1
        "own": [0.59, 0.60, 0.605],  # -1, -1, -1.5
        "reasoned": [0.61, 0.62, 0.63],  # +1, +1, +1: no spread, no p
    }
    for method, runs in values.items():
        for seed, value in enumerate(runs, start=1):
            _write_results(out, method, seed, sts12=value, average=value)
    summarise(out, suite)
    markdown = (out / "results.md").read_text(encoding="utf-8")

    def p_of(method: str) -> float:
        return float(ttest_rel([100 * v for v in values[method]], [100 * v for v in values["simcse"]]).pvalue)

    assert "## Paired difference against the papers' (STS Avg.)" in markdown
    table = markdown.split("## Paired difference against the papers' (STS Avg.)")[1].split("\n\n")[2]
    base, own = "simcse-paper (76.25)", "its own: O Table 1 rerun (74.60)"
    assert table.splitlines() == [
        "| Method | Paper entry | csekit minus simcse | Paper's difference | Paper's baseline | Same sign |",
        "|---|---|---|---|---|---|",
        f"| up | up-paper | +2.00 (p = {p_of('up'):.3f}, 3 seeds) | +1.00 | {base} | yes |",
        f"| own | own-paper | -1.17 (p = {p_of('own'):.3f}, 3 seeds) * | +1.58 | {own} | no |",
        "| unpublished | - | no paired seed yet | no paper named | - | - |",
        f"| reasoned | reasoned | +1.00 (p = -, 3 seeds) | none published (the entry says why) | {base} | - |",
    ]
    assert p_of("own") < 0.05 < p_of("up")
    assert ("## Against the published numbers" in markdown) == (comparison != "deltas")
    rows = {row["method"]: row for row in csv.DictReader((out / "results.csv").open(encoding="utf-8"))}
    columns = ("STS Avg. paper's own difference", "STS Avg. same sign as paper")
    shown = {name: tuple(row[column] for column in columns) for name, row in rows.items()}
    assert shown == {
        "simcse": ("", ""),
        "up": ("1.0000", "yes"),
        "own": ("1.5800", "no"),
        "reasoned": ("", ""),
    }  # `unpublished` has no finished run, so no row
    assert ("STS Avg. paper diff" in next(iter(rows.values()))) == (comparison != "deltas")  # csekit minus paper


@given(
    deltas=st.lists(st.floats(-20, 20, allow_nan=False), min_size=1, max_size=5),
    paper=st.floats(-5, 5, allow_nan=False),
)
@settings(max_examples=200, deadline=None)
def test_same_sign_says_yes_exactly_when_both_differences_point_the_same_way(deltas: list[float], paper: float) -> None:
    """For any measured differences and any paper's: yes when their mean and the paper's difference share a sign,
    no when they do not, `-` when either is zero."""
    recipes = [SuiteRecipe(name, Path("a.yaml")) for name in ("base", "method")]
    suite = Suite("s", [1], "sts", recipes, baseline="base")
    published = {
        "base": PublishedRow("base", source="B", scores={"STS Avg.": 70.0}),
        "method": PublishedRow("method", source="M", scores={"STS Avg.": 70.0 + paper}),
    }
    mean = math.fsum(deltas) / len(deltas)
    measured = PairedDifference(list(range(len(deltas))), mean, None, sum(d > 0 for d in deltas))
    papers = paper_differences(suite, published)
    row = format_delta_markdown(suite, published, {"method": {"STS Avg.": measured}}, papers).splitlines()[-1]
    assert same_sign(mean, paper_delta(published["method"], published["base"])) == row.split(" | ")[-1][:-2]
    shown_paper = (70.0 + paper) - 70.0
    expected = "-" if mean == 0 or shown_paper == 0 else ("yes" if (mean > 0) == (shown_paper > 0) else "no")
    assert row.endswith(f"| {expected} |"), row


@pytest.mark.parametrize(
    ("setting", "needle"),
    [
        ("paper_comparison: both\n", "suite.yaml:4: paper_comparison must be one of scores, deltas, found 'both'"),
        ("paper_comparison: [deltas]\n", "suite.yaml:4: paper_comparison must be one of"),
    ],
)
def test_a_bad_paper_comparison_names_the_line(tmp_path: Path, setting: str, needle: str) -> None:
    with pytest.raises(CsekitError, match=needle.replace("[", r"\[")):
        load_suite(_suite(tmp_path, None, setting))


@pytest.mark.parametrize("drop", ["baseline: simcse\n", "published: pub.yaml\n"])
def test_deltas_need_a_published_file_and_a_baseline(tmp_path: Path, drop: str) -> None:
    path = _suite(tmp_path, "deltas")
    text = path.read_text(encoding="utf-8").replace(drop, "").replace(", paper: simcse-paper", "")
    path.write_text(text.replace(", paper: up-paper", "").replace(", paper: own-paper", ""), encoding="utf-8")
    with pytest.raises(CsekitError, match=r"suite.yaml:\d: paper_comparison: deltas .* needs both `published:`"):
        load_suite(path)

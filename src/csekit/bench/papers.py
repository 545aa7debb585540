"""A suite's recipes against the published numbers of its `published:` file: per column, the paper's number
beside csekit's seeds and the range one more seed falls in."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from csekit.bench.results import STS_COLUMNS, TRANSFER_COLUMNS, score_at
from csekit.bench.suite import Suite
from csekit.core.report_cells import markdown_cell, markdown_row
from csekit.evaluation.published import PUBLISHED_COLUMNS, PaperComparison, PublishedRow, compare_with_paper

PAPER_CSV_STATS = ("paper", "paper diff", "paper range low", "paper range high", "paper within")
PAPER_PLOT = "sts_avg_vs_paper.png"


def paper_comparisons(
    suite: Suite, runs: dict[str, list[dict[str, Any]]], published: dict[str, PublishedRow]
) -> dict[str, dict[str, PaperComparison]]:
    """Per recipe with a published row and finished runs: each published column against csekit's seeds."""
    paths = dict((*STS_COLUMNS, *TRANSFER_COLUMNS))
    comparisons: dict[str, dict[str, PaperComparison]] = {}
    for recipe in suite.recipes:
        row = published.get(recipe.published_as)
        if row is None or not row.scores or recipe.name not in runs:
            continue
        for label, paper in row.scores.items():
            values = [100.0 * v for v in (score_at(r, paths[label]) for r in runs[recipe.name]) if v is not None]
            if values:
                comparison = compare_with_paper(paper, values, row.runs_of(label))
                comparisons.setdefault(recipe.name, {})[label] = comparison
    return comparisons


def paper_labels(papers: dict[str, dict[str, PaperComparison]]) -> list[str]:
    """The published columns compared for any recipe, in the papers' order."""
    return [label for label in PUBLISHED_COLUMNS if any(label in columns for columns in papers.values())]


def paper_csv_cells(comparison: PaperComparison | None) -> list[str]:
    if comparison is None:
        return ["", "", "", "", ""]
    within = {None: "", True: "yes", False: "no"}[comparison.within]
    ends = ["" if end is None else f"{end:.4f}" for end in (comparison.low, comparison.high)]
    return [f"{comparison.paper:.2f}", f"{comparison.difference:.4f}", *ends, within]


PAPER_RULE = (
    "Per task: the paper's number, csekit's mean ± standard deviation over seeds (x 100), the difference "
    "(csekit minus paper), and the range one more csekit run falls in with 95% probability: mean ± "
    "t(0.975, n-1) · s · sqrt(1 + 1/n), s the standard deviation over the n seeds with n - 1 in the "
    "denominator. A paper reports one run, so the question is whether it could have been one more of "
    'csekit\'s seeds; "yes" when the paper\'s number lies in that range, "-" with fewer than 2 seeds. A number '
    "the paper gives as the mean of k runs (marked) is compared as one: the range of the mean of k more runs, "
    "sqrt(1/k + 1/n) for sqrt(1 + 1/n), with k = 2 where the source does not give the count. Protocol: how "
    "csekit computed its number: the sentence-end rule its model applied (`csekit.encoding.sentence_end`: none, or "
    "an author's end punctuation), the test template tokenised whole where the model has one "
    "(`csekit.encoding.whole_template`: PromptBERT's and SNCSE's RoBERTa evaluation) and, for a transfer task, "
    "SentEval's classifier (sklearn or pytorch); every published transfer number comes from SentEval's PyTorch "
    "classifier."
)


def format_paper_markdown(
    suite: Suite,
    runs: dict[str, list[dict[str, Any]]],
    published: dict[str, PublishedRow],
    papers: dict[str, dict[str, PaperComparison]],
) -> str:
    """One section per recipe: its paper's row beside csekit's seeds, or why there is none to compare with."""
    judged = [c.within for columns in papers.values() for c in columns.values() if c.within is not None]
    shown = suite.published
    if shown is not None and shown.is_relative_to(Path.cwd()):
        shown = shown.relative_to(Path.cwd())
    markdown = f"\n## Against the published numbers\n\nPublished numbers: {markdown_cell(shown)}. {PAPER_RULE}\n"
    if judged:
        markdown += f"\nWithin the seed spread: {sum(judged)} of {len(judged)} published numbers.\n"
    for recipe in suite.recipes:
        markdown += f"\n### {markdown_cell(recipe.name)}\n\n"
        row = published.get(recipe.published_as)
        if row is None:
            markdown += f"No entry {markdown_cell(repr(recipe.published_as))} in the published file.\n"
        elif row.reason is not None:
            markdown += f"No published numbers: {markdown_cell(row.reason)}\n"
        elif recipe.name not in runs:
            markdown += f"Paper: {markdown_cell(row.source)}. No finished run yet.\n"
        else:
            markdown += _paper_table(row, papers.get(recipe.name, {}), runs[recipe.name])
    return markdown


def _paper_table(row: PublishedRow, columns: dict[str, PaperComparison], runs: list[dict[str, Any]]) -> str:
    """The table of one recipe: a line per published column, with the protocol csekit's number was computed by."""
    note = f" Note: {markdown_cell(row.note)}" if row.note else ""
    lines = [f"Paper: {markdown_cell(row.source)}.{note}", ""]
    lines += [
        "| Task | Paper | csekit | Difference | 95% range | Paper within | Protocol |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, paper in row.scores.items():
        comparison = columns.get(label)
        if comparison is None:
            lines.append(markdown_row([label, f"{paper:.2f}", "not evaluated", "-", "-", "-", "-"]))
            continue
        spread = "-" if comparison.low is None else f"{comparison.low:.2f} to {comparison.high:.2f}"
        within = {None: "-", True: "yes", False: "no"}[comparison.within]
        measured = f"{comparison.mean:.2f} ± {comparison.std:.2f} ({comparison.seeds} seeds)"
        published = f"{paper:.2f}" + _mean_mark(row, label)
        cells = [label, published, measured, signed(comparison.difference), spread, within, protocol(label, runs)]
        lines.append(markdown_row(cells))
    return "\n".join(lines) + "\n"


def protocol(label: str, runs: list[dict[str, Any]]) -> str:
    """How csekit's runs computed the number of column `label` (results.json's `sentence_end`, `test_template` and
    `transfer_classifier`; runs written before they were recorded: none, none and sklearn)."""
    if label in dict(TRANSFER_COLUMNS):
        used = sorted({str(run.get("transfer_classifier", "sklearn")) for run in runs})
        return f"SentEval {' and '.join(used)} classifier (paper: pytorch)"
    ends = f"sentence end {' and '.join(sorted({str(run.get('sentence_end', 'none')) for run in runs}))}"
    whole = sorted(
        {"training ids" if run.get("test_template", "none") == "none" else "whole test template" for run in runs}
    )
    return ends if whole == ["training ids"] else f"{ends}, {' and '.join(whole)}"


def _mean_mark(row: PublishedRow, label: str) -> str:
    """' (mean of k runs)' after a published mean (' (mean of runs)' where the count is not given)."""
    if label not in row.means:
        return ""
    runs = row.means[label]
    return f" (mean of {runs} runs)" if runs else " (mean of runs)"


def signed(value: float) -> str:
    """A difference with its sign and 2 decimals; one that rounds to zero prints 0.00, not -0.00 or +0.00."""
    text = f"{value:+.2f}"
    return "0.00" if text in ("+0.00", "-0.00") else text


def same_sign(measured: float | None, paper: float | None) -> str:
    """yes or no; `-` where either difference is missing or exactly zero (no direction to compare)."""
    if measured is None or paper is None or measured == 0 or paper == 0:
        return "-"
    return "yes" if (measured > 0) == (paper > 0) else "no"

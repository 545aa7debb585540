"""The summary's tables: mean ± std over seeds per recipe (Markdown and CSV), paired differences against a
baseline or a control seed by seed, and the wall time per run."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from typing import Any

import numpy as np

from csekit.bench.papers import PAPER_CSV_STATS, paper_csv_cells, paper_labels, same_sign, signed
from csekit.bench.results import OTHER_COLUMNS, STS_COLUMNS, TRANSFER_COLUMNS, UNSCALED, file_task_columns, score_at
from csekit.bench.suite import Suite
from csekit.core.report_cells import csv_text, markdown_cell, markdown_row, markdown_rule
from csekit.evaluation.published import PaperComparison


def table_rows(runs: dict[str, list[dict[str, Any]]]) -> tuple[list[str], list[dict[str, Any]]]:
    """Columns present in any run, and per method the mean and standard deviation (ddof=0) over seeds."""
    columns = [
        (label, path)
        for label, path in (*STS_COLUMNS, *TRANSFER_COLUMNS, *OTHER_COLUMNS, *file_task_columns(runs))
        if any(score_at(r, path) is not None for reports in runs.values() for r in reports)
    ]
    rows = []
    for method, reports in runs.items():
        row: dict[str, Any] = {"method": method, "seeds": len(reports)}
        for label, path in columns:
            values = [v for v in (score_at(r, path) for r in reports) if v is not None]
            scale = 1.0 if label in UNSCALED else 100.0
            row[label] = (scale * float(np.mean(values)), scale * float(np.std(values))) if values else None
        rows.append(row)
    return [label for label, _ in columns], rows


def format_markdown(labels: list[str], rows: list[dict[str, Any]]) -> str:
    """The papers' layout: one row per method, `mean ± std` over seeds (x 100 except align/uniform); a method
    with one seed shows its value alone (a spread of 0.00 would read as a measured one)."""
    heads = ["Method", "Seeds", *labels]
    lines = [markdown_row(heads), markdown_rule(len(heads))]
    for row in rows:
        cells = [row["method"], str(row["seeds"])]
        for label in labels:
            value = row[label]
            digits = 3 if label in UNSCALED else 2
            spread = f" ± {value[1]:.{digits}f}" if value is not None and row["seeds"] > 1 else ""
            cells.append("-" if value is None else f"{value[0]:.{digits}f}{spread}")
        lines.append(markdown_row(cells))
    return "\n".join(lines) + "\n"


def format_csv(
    labels: list[str],
    rows: list[dict[str, Any]],
    differences: dict[str, dict[str, PairedDifference]] | None = None,
    papers: dict[str, dict[str, PaperComparison]] | None = None,
    paper_deltas: dict[str, float | None] | None = None,
) -> str:
    """One row per method; with `differences`, also each STS column's paired difference, p and seeds above;
    with `papers`, each published column's paper number, difference, 95% range (one run's, or a mean's where the
    paper gives a mean of runs) and whether it is within; with `paper_deltas` (per method, its paper's own STS Avg.
    difference), that difference and whether csekit's paired one has its sign (empty where it cannot be said)."""
    paired_labels = [label for label, _ in STS_COLUMNS] if differences is not None else []
    compared = paper_labels(papers or {})
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    heads = [
        "method",
        "seeds",
        *[f"{label} {stat}" for label in labels for stat in ("mean", "std")],
        *[f"{label} {stat}" for label in paired_labels for stat in ("diff", "p", "seeds above", "paired seeds")],
        *[f"{label} {stat}" for label in compared for stat in PAPER_CSV_STATS],
        *([] if paper_deltas is None else ["STS Avg. paper's own difference", "STS Avg. same sign as paper"]),
    ]
    writer.writerow([csv_text(head) for head in heads])
    for row in rows:
        cells: list[Any] = [csv_text(row["method"]), row["seeds"]]
        for label in labels:
            cells += ["", ""] if row[label] is None else [f"{row[label][0]:.4f}", f"{row[label][1]:.4f}"]
        for label in paired_labels:
            diff = (differences or {}).get(row["method"], {}).get(label)
            if diff is None:
                cells += ["", "", "", ""]
            else:
                p_value = "" if diff.p_value is None else f"{diff.p_value:.4g}"
                cells += [f"{diff.mean:.4f}", p_value, diff.higher, len(diff.seeds)]
        for label in compared:
            cells += paper_csv_cells((papers or {}).get(row["method"], {}).get(label))
        if paper_deltas is not None:
            paper = paper_deltas.get(row["method"])
            measured = (differences or {}).get(row["method"], {}).get("STS Avg.")
            mean = None if measured is None else measured.mean
            verdict = same_sign(mean, paper)
            cells += ["" if paper is None else f"{paper:.4f}", "" if verdict == "-" else verdict]
        writer.writerow(cells)
    return buffer.getvalue()


@dataclass
class PairedDifference:
    """One method against the baseline on one column, over the seeds both finished."""

    seeds: list[int]
    mean: float  # method minus baseline, x 100, mean over the paired seeds
    p_value: float | None  # paired t-test; None with fewer than two pairs or differences without variance
    higher: int  # seeds on which the method scored above the baseline

    @property
    def significant(self) -> bool:
        return self.p_value is not None and self.p_value < SIGNIFICANCE


SIGNIFICANCE = 0.05
"""p-value below which a paired difference is marked as beyond seed noise."""


def paired_difference(pairs: list[tuple[int, float, float]]) -> PairedDifference | None:
    """`(seed, method's value, baseline's value)` triples, in order, as one paired difference: the mean of method
    minus baseline and a paired t-test (None with fewer than two pairs or differences without variance)."""
    from scipy.stats import ttest_rel

    if not pairs:
        return None
    seeds, values, base_values = (list(column) for column in zip(*pairs, strict=True))
    deltas = np.subtract(values, base_values)
    p_value = None
    if len(pairs) >= 2 and float(np.std(deltas)) > 0:
        p_value = float(ttest_rel(values, base_values).pvalue)
    return PairedDifference(seeds, float(np.mean(deltas)), p_value, int(np.sum(deltas > 0)))


def paired_differences(runs: dict[str, list[dict[str, Any]]], baseline: str) -> dict[str, dict[str, PairedDifference]]:
    """Per method (not the baseline) and STS column: the difference to the baseline, seed by seed.

    Seeds share the training data order and initialisation noise of the same seed, so pairing them
    removes that part of the seed-to-seed spread; only seeds present in both are compared.
    """
    base_by_seed = {int(report["seed"]): report for report in runs.get(baseline, [])}
    differences: dict[str, dict[str, PairedDifference]] = {}
    for method, reports in runs.items():
        if method == baseline:
            continue
        for label, path in STS_COLUMNS:
            pairs = []
            for report in reports:
                base = base_by_seed.get(int(report["seed"]))
                value, base_value = score_at(report, path), None if base is None else score_at(base, path)
                if value is not None and base_value is not None:
                    pairs.append((int(report["seed"]), 100.0 * value, 100.0 * base_value))
            difference = paired_difference(pairs)
            if difference is not None:
                differences.setdefault(method, {})[label] = difference
    return differences


def format_paired_markdown(baseline: str, differences: dict[str, dict[str, PairedDifference]]) -> str:
    """Each method minus the baseline (x 100) with its p-value; `*` marks p < 0.05."""
    labels = [label for label, _ in STS_COLUMNS]
    heads = ["Method", "Paired seeds", *labels, f"Seeds above {baseline} (STS Avg.)"]
    lines = [markdown_row(heads), markdown_rule(len(heads))]
    for method, columns in differences.items():
        first = next(iter(columns.values()))
        cells = [method, ", ".join(str(seed) for seed in first.seeds)]
        for label in labels:
            diff = columns.get(label)
            if diff is None:
                cells.append("-")
                continue
            shown = "p = -" if diff.p_value is None else p_text(diff.p_value)
            cells.append(f"{signed(diff.mean)} ({shown}){' *' if diff.significant else ''}")
        average = columns.get("STS Avg.")
        cells.append("-" if average is None else f"{average.higher}/{len(average.seeds)}")
        lines.append(markdown_row(cells))
    return "\n".join(lines) + "\n"


def p_text(p_value: float) -> str:
    """`p = 0.042`; below 0.0005 `p < 0.001` (three decimals would print a p-value of 0.000)."""
    return "p < 0.001" if p_value < 0.0005 else f"p = {p_value:.3f}"


def format_wall_markdown(runs: dict[str, list[dict[str, Any]]]) -> str:
    """Wall seconds per run (training with its dev evaluations, then the final evaluation): mean, range."""
    lines = [
        "| Method | Runs timed | Train s (min-max) | Evaluate s (min-max) | Resumed runs |",
        "|---|---|---|---|---|",
    ]
    for method, reports in runs.items():
        walls = [r["wall_seconds"] for r in reports if isinstance(r.get("wall_seconds"), dict)]
        if not walls:
            continue
        cells = [method, str(len(walls))]
        for key in ("train", "evaluate"):
            values = [float(w[key]) for w in walls]
            cells.append(f"{np.mean(values):.0f} ({min(values):.0f}-{max(values):.0f})")
        cells.append(str(sum(bool(w.get("resumed")) for w in walls)))
        lines.append(markdown_row(cells))
    return "\n".join(lines) + "\n" if len(lines) > 2 else ""


def controls_markdown(suite: Suite, runs: dict[str, list[dict[str, Any]]]) -> str:
    """One paired table per recipe that names a `control` (e.g. a method against SimCSE with the same pooler)."""
    markdown = ""
    for recipe in suite.recipes:
        if recipe.control is None:
            continue
        markdown += f"\n## Paired difference of {markdown_cell(recipe.name)} against its control "
        markdown += f"{markdown_cell(recipe.control)}\n\n"
        pair = {name: runs[name] for name in (recipe.control, recipe.name) if name in runs}
        differences = paired_differences(pair, recipe.control)
        if differences:
            markdown += (
                "The recipe minus its control on the same seeds (x 100); p from a paired t-test over seeds; "
                "* marks p < 0.05.\n\n"
            )
            markdown += format_paired_markdown(recipe.control, differences)
        else:
            markdown += "The two have not finished a seed in common yet.\n"
    return markdown

"""The summary of a suite's finished runs: results.md, results.csv and the plots, rebuilt on every call."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from csekit.bench.deltas import format_delta_markdown, paper_differences
from csekit.bench.papers import format_paper_markdown, paper_comparisons
from csekit.bench.plots import write_paper_plot, write_plots
from csekit.bench.results import collect
from csekit.bench.suite import Suite
from csekit.bench.tables import (
    controls_markdown,
    format_csv,
    format_markdown,
    format_paired_markdown,
    format_wall_markdown,
    paired_differences,
    table_rows,
)
from csekit.core.atomic import atomic_write_text
from csekit.core.report_cells import markdown_cell
from csekit.core.save_guard import guarded_save
from csekit.evaluation.published import STS_AVERAGE, load_published


def summarise(output: Path, suite: Suite) -> dict[str, Any]:
    """Write results.md, results.csv and the plots from every finished run."""
    runs = collect(output, suite)
    labels, rows = table_rows(runs)
    one_seed = len(suite.seeds) == 1  # no spread, and nothing for a paired test to test
    spread = (
        "One seed: no spread and no paired comparison (both need at least two seeds)"
        if one_seed
        else "Mean ± standard deviation over seeds"
    )
    markdown = f"# {markdown_cell(suite.name)}\n\n{spread}; x 100 except alignment and uniformity.\n\n"
    markdown += format_markdown(labels, rows)
    differences = None
    if suite.baseline is not None and not one_seed:
        differences = paired_differences(runs, suite.baseline)
        markdown += (
            f"\n## Paired difference against {markdown_cell(suite.baseline)}\n\n"
            "Method minus baseline on the same seeds (x 100), mean over the seeds both finished; p from a paired "
            "t-test over seeds (scipy.stats.ttest_rel); * marks p < 0.05, a difference beyond seed noise. With 3 "
            "seeds the test has 2 degrees of freedom, and a sign test (the last column) cannot reach p < 0.05 "
            "with fewer than 6 seeds.\n\n"
        )
        if differences:
            markdown += format_paired_markdown(suite.baseline, differences)
        else:
            markdown += "No other configuration has finished a seed that the baseline finished.\n"
    if not one_seed:
        markdown += controls_markdown(suite, runs)
    markdown += starting_models_markdown(runs)
    wall = format_wall_markdown(runs)
    if wall:
        markdown += "\n## Wall time per run\n\nSeconds; a resumed run counts only its last part.\n\n" + wall
    papers = paper_deltas = None
    if suite.published is not None:
        published = load_published(suite.published)
        if differences is not None:
            paper_deltas = paper_differences(suite, published)
            markdown += format_delta_markdown(suite, published, differences, paper_deltas)
        if suite.paper_comparison == "scores":
            papers = paper_comparisons(suite, runs, published)
            markdown += format_paper_markdown(suite, runs, published, papers)
    with guarded_save("results.md and results.csv", output, "the runs' results.json files are intact"):
        atomic_write_text(output / "results.md", markdown)
        atomic_write_text(output / "results.csv", format_csv(labels, rows, differences, papers, paper_deltas))
    with guarded_save("the plots", output, "results.md, results.csv and the runs' results are intact"):
        plots = write_plots(output, suite, runs)
        if papers and any(STS_AVERAGE in columns for columns in papers.values()):
            plots.append(write_paper_plot(output, suite, runs, papers))
    return {"table": markdown, "plots": [str(p) for p in plots], "finished": sum(len(r) for r in runs.values())}


def starting_models_markdown(runs: dict[str, list[dict[str, Any]]]) -> str:
    """A section naming each run whose best/, the model the tables score, is its starting model: no evaluated step
    beat the start on its `train.select_metric` (csekit.training.best_model), so its row is the backbone as loaded,
    not a trained model. Empty when there is none."""
    starts = [
        f"{markdown_cell(recipe)} seed {report.get('seed')}"
        for recipe, reports in runs.items()
        for report in reports
        if report.get("best_step") == 0 and not isinstance(report.get("best_step"), bool)
    ]
    if not starts:
        return ""
    return (
        "\n## Runs that kept the starting model\n\nNo evaluated step beat the start on the recipe's select_metric, "
        "so best/, which the tables score, is the backbone as loaded: " + ", ".join(starts) + ".\n"
    )

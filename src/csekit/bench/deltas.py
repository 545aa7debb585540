"""Each method's paired difference from the suite baseline beside its paper's own difference (STS Avg.): does the
method move the average the way its paper says, whatever the backbone's level?"""

from __future__ import annotations

from csekit.bench.papers import same_sign, signed
from csekit.bench.suite import Suite
from csekit.bench.tables import PairedDifference, p_text
from csekit.core.report_cells import markdown_cell, markdown_row, markdown_rule
from csekit.evaluation.published import STS_AVERAGE, PublishedRow, paper_delta

DELTA_RULE = (
    "Each method minus {baseline} on the same seeds (STS Avg., x 100, mean over the seeds both finished; p from a "
    "paired t-test, * below 0.05) beside its paper's difference on the paper's backbone: the paper's STS Avg. minus "
    "that of the baseline the paper compares it with (its own rerun where the published row gives one, else "
    "{baseline}'s published row {entry}). Same sign: whether csekit's difference points the paper's way; where "
    "csekit's p is 0.05 or more its difference is within seed noise, and the sign says little."
)


def paper_differences(suite: Suite, published: dict[str, PublishedRow]) -> dict[str, float | None]:
    """Per recipe but the baseline: its paper's own difference on STS Avg. (None where the file gives none)."""
    base_row = published.get(next(r.published_as for r in suite.recipes if r.name == suite.baseline))
    differences: dict[str, float | None] = {}
    for recipe in suite.recipes:
        if recipe.name != suite.baseline:
            row = published.get(recipe.published_as)
            differences[recipe.name] = None if row is None else paper_delta(row, base_row)
    return differences


def format_delta_markdown(
    suite: Suite,
    published: dict[str, PublishedRow],
    differences: dict[str, dict[str, PairedDifference]],
    papers: dict[str, float | None],
) -> str:
    """The section: one row per recipe but the baseline, in the suite's order (`papers`: `paper_differences`)."""
    baseline = next(recipe for recipe in suite.recipes if recipe.name == suite.baseline)
    base_row = published.get(baseline.published_as)
    rule = DELTA_RULE.format(baseline=markdown_cell(baseline.name), entry=markdown_cell(baseline.published_as))
    markdown = f"\n## Paired difference against the papers' ({STS_AVERAGE})\n\n{rule}\n\n"
    heads = ["Method", "Paper entry", f"csekit minus {baseline.name}", "Paper's difference", "Paper's baseline"]
    lines = [markdown_row([*heads, "Same sign"]), markdown_rule(len(heads) + 1)]
    for recipe in suite.recipes:
        if recipe.name == baseline.name:
            continue
        measured = differences.get(recipe.name, {}).get(STS_AVERAGE)
        row, paper = published.get(recipe.published_as), papers[recipe.name]
        if row is None:  # a suite refuses a `paper:` its file lacks: this recipe names none (a control, a variant)
            cells = [recipe.name, "-", _measured_cell(measured), "no paper named", "-"]
        else:
            cells = [recipe.name, recipe.published_as, _measured_cell(measured)]
            cells += [_paper_cell(row, paper), _baseline_cell(row, base_row, baseline.published_as)]
        lines.append(markdown_row([*cells, same_sign(None if measured is None else measured.mean, paper)]))
    return markdown + "\n".join(lines) + "\n"


def _measured_cell(measured: PairedDifference | None) -> str:
    if measured is None:
        return "no paired seed yet"
    p_value = "p = -" if measured.p_value is None else p_text(measured.p_value)
    seeds = f"{len(measured.seeds)} seed{'s' * (len(measured.seeds) != 1)}"
    return f"{signed(measured.mean)} ({p_value}, {seeds}){' *' if measured.significant else ''}"


def _paper_cell(row: PublishedRow, paper: float | None) -> str:
    if row.reason is not None:
        return "none published (the entry says why)"
    return "-" if paper is None else signed(paper)


def _baseline_cell(row: PublishedRow, base_row: PublishedRow | None, base_entry: str) -> str:
    if row.paper_baseline is not None:
        own = row.paper_baseline.scores.get(STS_AVERAGE)
        return f"its own: {row.paper_baseline.source}" + ("" if own is None else f" ({own:.2f})")
    base = None if base_row is None else base_row.scores.get(STS_AVERAGE)
    return base_entry + ("" if base is None else f" ({base:.2f})")

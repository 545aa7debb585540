"""The papers' biases on a bench suite's trained models: `csekit diagnose` on every finished run, then a table.

Each finished run of the suite's output folder (`OUTPUT/<recipe>-seed<k>/results.json` and `best/`) is
diagnosed once, with its own pooler (`csekit diagnose`'s default), into `REPORTS/<recipe>-seed<k>.json`; a run
already diagnosed is skipped, so the script can be stopped and run again. Then, per bias a paper targets
(DCLR's false-negative rate, WhitenedCSE's uniformity, SLT-FAI's frequency probe, OssCSE's Cont./Oppn. gap, with
anisotropy and alignment beside them), each recipe's mean ± std over seeds and its paired difference from the
suite's baseline (and from its `control:`), p from scipy's paired t-test, as Markdown.

    CSEKIT_DATA=../shared/data PYTHONPATH=src python benchmarks/suite_diagnose.py \\
        benchmarks/suites/testbed.yaml --output runs/testbed --reports runs/testbed-diagnose
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from csekit.bench import load_suite
from csekit.bench.suite import Suite, run_dir
from csekit.bench.tables import p_text, paired_difference
from csekit.core.errors import CsekitError, message_line
from csekit.core.report_cells import markdown_row, markdown_rule
from csekit.evaluation.diagnose import TABLE_ROWS, read_diagnose_report

TARGETS = {
    "false_negative_rate": "DCLR: lower",
    "uniformity": "WhitenedCSE: lower",
    "frequency_probe_accuracy": "SLT-FAI: lower",
    "cont_oppn_gap": "OssCSE: lower",
    "anisotropy": "lower: more isotropic",
    "alignment": "lower: positives closer",
}
"""The biases tabulated, in this order, with the direction each paper (or the field) calls better."""
SCALES = {key: (label, scale) for key, label, scale, _ in TABLE_ROWS}  # `csekit diagnose`'s own labels and scales
Metrics = dict[int, dict[str, float | None]]
"""Seed -> a run's diagnose metrics (None: not a number, or not given)."""


def diagnose_finished(suite: Suite, output: Path, reports: Path, data_dir: str | None) -> list[str]:
    """Run `csekit diagnose` on each finished run without a report; returns the runs diagnosed now."""
    reports.mkdir(parents=True, exist_ok=True)
    done = []
    for recipe in suite.recipes:
        for seed in suite.seeds:
            folder = run_dir(output, recipe, seed)
            report = reports / f"{folder.name}.json"
            if report.exists() or not (folder / "results.json").exists():
                continue
            command = [sys.executable, "-m", "csekit.cli", "diagnose", str(folder / "best"), "--output", str(report)]
            if data_dir is not None:
                command += ["--data-dir", data_dir]
            print(f"diagnosing {folder.name}", file=sys.stderr, flush=True)
            try:
                subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
            except subprocess.CalledProcessError as error:  # its own one-line reason is printed above
                raise CsekitError(
                    f"csekit diagnose of {folder / 'best'} failed (exit status {error.returncode}, reason above); "
                    "the runs diagnosed before it are kept"
                ) from None
            done.append(folder.name)
    return done


def _values(reports: Path, name: str, seeds: list[int]) -> Metrics:
    """Seed -> the diagnose metrics of run `name`-seed<k>, for the runs diagnosed (read bounded and checked: a
    report that is not one is one line naming it; a metric that is null or missing is None)."""
    found = {}
    for seed in seeds:
        path = reports / f"{name}-seed{seed}.json"
        if os.path.lexists(path):
            found[seed] = read_diagnose_report(path)
    return found


def _paired(mine: Metrics, base: Metrics, key: str, scale: float) -> str:
    """The paired difference over the seeds where both runs have the metric as a number."""
    pairs = []
    for seed in sorted(set(mine) & set(base)):
        value, base_value = mine[seed][key], base[seed][key]
        if value is not None and base_value is not None:
            pairs.append((seed, scale * value, scale * base_value))
    difference = paired_difference(pairs)
    if difference is None:
        return "-"
    shown = "p = -" if difference.p_value is None else p_text(difference.p_value)
    return f"{difference.mean:+.3f} ({shown}, {len(difference.seeds)} seeds)"


def table(suite: Suite, reports: Path) -> str:
    """Per metric: mean ± std per recipe, paired difference from the baseline (and from a control)."""
    runs = {recipe.name: _values(reports, recipe.name, suite.seeds) for recipe in suite.recipes}
    markdown = ""
    for key, target in TARGETS.items():
        label, scale = SCALES[key]
        markdown += f"\n### {label} ({target})\n\n"
        heads = ["Recipe", "Seeds", "Mean ± std", f"minus {suite.baseline or 'the baseline'}", "minus its control"]
        lines = [markdown_row(heads), markdown_rule(len(heads))]
        for recipe in suite.recipes:
            mine = runs[recipe.name]
            if not mine:
                continue
            values = [scale * value for value in (metrics[key] for metrics in mine.values()) if value is not None]
            if not values:
                continue
            no_base = suite.baseline is None or recipe.name == suite.baseline
            base = "-" if no_base else _paired(mine, runs[str(suite.baseline)], key, scale)
            control = "-" if recipe.control is None else _paired(mine, runs[recipe.control], key, scale)
            spread = f"{np.mean(values):.4f} ± {np.std(values):.4f}"
            lines.append(markdown_row([recipe.name, len(values), spread, base, control]))
        markdown += "\n".join(lines) + "\n"
    return markdown


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("suite", type=Path, help="the bench suite file")
    parser.add_argument("--output", type=Path, required=True, help="the suite's bench output folder")
    parser.add_argument("--reports", type=Path, required=True, help="where each run's diagnose JSON goes")
    parser.add_argument("--data-dir", default=None, help="SentEval data folder (default: $CSEKIT_DATA)")
    parser.add_argument("--table-only", action="store_true", help="diagnose nothing; tabulate the reports")
    args = parser.parse_args()
    try:
        suite = load_suite(args.suite)
        if not args.table_only:
            diagnose_finished(suite, args.output, args.reports, args.data_dir)
        print(table(suite, args.reports))
    except CsekitError as error:
        print(f"suite_diagnose: {message_line(error)}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()

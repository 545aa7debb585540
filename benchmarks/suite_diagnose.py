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
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from csekit.bench import load_suite
from csekit.bench.suite import Suite, run_dir
from csekit.bench.tables import p_text, paired_difference
from csekit.core.report_cells import markdown_row, markdown_rule
from csekit.evaluation.diagnose import TABLE_ROWS

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
            subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
            done.append(folder.name)
    return done


def _values(reports: Path, name: str, seeds: list[int]) -> dict[int, dict[str, Any]]:
    """Seed -> the diagnose metrics of run `name`-seed<k>, for the runs diagnosed."""
    found = {}
    for seed in seeds:
        path = reports / f"{name}-seed{seed}.json"
        if path.exists():
            found[seed] = next(iter(json.loads(path.read_text(encoding="utf-8"))["models"].values()))
    return found


def _paired(mine: dict[int, dict[str, Any]], base: dict[int, dict[str, Any]], key: str, scale: float) -> str:
    pairs = [(seed, scale * mine[seed][key], scale * base[seed][key]) for seed in sorted(set(mine) & set(base))]
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
            values = [scale * metrics[key] for metrics in mine.values()]
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
    suite = load_suite(args.suite)
    if not args.table_only:
        diagnose_finished(suite, args.output, args.reports, args.data_dir)
    print(table(suite, args.reports))


if __name__ == "__main__":
    main()

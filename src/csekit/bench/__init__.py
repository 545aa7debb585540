"""`csekit bench`: recipes x seeds, trained and evaluated, collected into the papers' tables and plots.

A suite is a YAML file::

    name: default
    seeds: [42, 43, 44]
    tasks: sts,transfer,align          # as `csekit evaluate --tasks`
    sample_sentences: 1000             # corpus sentences for the cosine-distribution plot
    recipes:
      - recipe: ../../recipes/quickstart.yaml   # relative to the suite file
        name: simcse-minilm                    # optional; default: the recipe file's stem
        set: [train.max_steps=300]             # optional --set overrides
        control: simcse-prompt-minilm          # optional: also compared with this recipe, seed by seed
    baseline: simcse-minilm            # optional: every other recipe is compared with it, seed by seed
    published: ../published/bert-base.yaml  # optional: the papers' numbers, compared task by task
                                       # (a recipe's row is its name's, or the one its `paper:` key names)

Each run lives in `OUTPUT/<name>-seed<k>/` (the training run plus `results.json`, written last, which
marks the run finished; it holds the run's facts and its `tasks` and `averages`, the layout of `csekit evaluate
--output`, see csekit.evaluation.result). A second call skips finished runs and resumes interrupted trainings, so a
suite can be stopped and restarted at any time. The summary (`results.md`, `results.csv`, `*.png`)
is rebuilt from all finished runs on every call.

The package's rooms: `suite` (the suite file, run folders), `run` (training and evaluating the runs),
`results` (a run's results.json, cosines and dev curves read back), `tables` (mean ± std, paired differences,
wall time), `papers` (the published numbers), `plots`, and `summary` (results.md, results.csv and the plots).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from csekit.bench.results import COSINES_FILE, RESULTS_FILE, collect, read_cosines, read_results
    from csekit.bench.run import check_suite_inputs, run_suite
    from csekit.bench.suite import Suite, SuiteRecipe, load_suite, run_dir
    from csekit.bench.summary import summarise
    from csekit.bench.tables import PairedDifference, format_paired_markdown, paired_differences

_HOMES = {
    "results": ("COSINES_FILE", "RESULTS_FILE", "collect", "read_cosines", "read_results"),
    "run": ("check_suite_inputs", "run_suite"),
    "suite": ("Suite", "SuiteRecipe", "load_suite", "run_dir"),
    "summary": ("summarise",),
    "tables": ("PairedDifference", "format_paired_markdown", "paired_differences"),
}
"""Each public name's module. They are imported when first used: a suite file is read (and its mistakes refused)
without the training modules, torch and transformers, which `results` and `run` bring (seconds to import)."""


def __getattr__(name: str) -> Any:
    for module, names in _HOMES.items():
        if name in names:
            return getattr(importlib.import_module(f"csekit.bench.{module}"), name)
    raise AttributeError(f"module 'csekit.bench' has no attribute {name!r}")


__all__ = [
    "COSINES_FILE",
    "RESULTS_FILE",
    "PairedDifference",
    "Suite",
    "SuiteRecipe",
    "check_suite_inputs",
    "collect",
    "format_paired_markdown",
    "load_suite",
    "paired_differences",
    "read_cosines",
    "read_results",
    "run_dir",
    "run_suite",
    "summarise",
]

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
marks the run finished). A second call skips finished runs and resumes interrupted trainings, so a
suite can be stopped and restarted at any time. The summary (`results.md`, `results.csv`, `*.png`)
is rebuilt from all finished runs on every call.
"""

from __future__ import annotations

import csv
import io
import math
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from csekit.core.atomic import atomic_write_text, write_file
from csekit.core.bounded_read import (
    bounded_lines,
    open_regular,
    parse_yaml,
    read_bounded_text,
    read_json_file,
    read_with,
)
from csekit.core.errors import CsekitError, at
from csekit.core.json_text import json_text
from csekit.core.safe_names import check_name, child_path
from csekit.core.save_guard import guarded_save
from csekit.evaluation.published import (
    PUBLISHED_COLUMNS,
    STS_AVERAGE,
    PaperComparison,
    PublishedRow,
    compare_with_paper,
    load_published,
)
from csekit.evaluation.tasks import table_columns
from csekit.training.recipe import MAX_SEED
from csekit.training.run_folder import METRICS_FILE, METRICS_LINE_LIMIT, metrics_record

RESULTS_FILE = "results.json"
COSINES_FILE = "cosines.npy"
RESULTS_LIMIT = 2**20
"""The largest results.json read (bench writes a few KiB)."""
COSINES_LIMIT = 2**28
"""The largest cosines.npy read (bench writes 2 MB: 1000 sentences give 499,500 float32 pairs)."""
SUITE_KEYS = {"name", "seeds", "tasks", "recipes", "sample_sentences", "baseline", "published"}
RECIPE_KEYS = {"recipe", "name", "set", "control", "paper"}

# (column label, path into results.json "tasks"/top level) in the papers' order
STS_COLUMNS = (
    *((label, ("tasks", task, key)) for label, task, key in table_columns("sts")),
    ("STS Avg.", ("avg",)),
)
TRANSFER_COLUMNS = (
    *((label, ("tasks", task, key)) for label, task, key in table_columns("transfer")),
    ("Transfer Avg.", ("transfer_avg",)),
)
OTHER_COLUMNS = (
    ("STS-B dev", ("tasks", "stsb-dev")),
    ("SICK dev", ("tasks", "sick-dev")),
    ("align", ("tasks", "align", "align")),
    ("uniform", ("tasks", "align", "uniform")),
)
UNSCALED = {"align", "uniform"}  # reported as they are; everything else x 100


@dataclass
class SuiteRecipe:
    name: str
    path: Path
    overrides: list[str] = field(default_factory=list)
    control: str | None = None  # a recipe name: the summary also compares this recipe with it, seed by seed
    paper: str | None = None  # the entry of the suite's published file this recipe is compared with (default: name)

    @property
    def published_as(self) -> str:
        return self.paper or self.name


@dataclass
class Suite:
    name: str
    seeds: list[int]
    tasks: str
    recipes: list[SuiteRecipe]
    sample_sentences: int = 1000
    baseline: str | None = None  # a recipe name: the summary compares every other one with it, seed by seed
    published: Path | None = None  # the papers' numbers (benchmarks/published/*.yaml), compared task by task


def _line_of(text: str, key: str) -> int | None:
    for number, line in enumerate(text.splitlines(), start=1):
        if line.lstrip(" -").startswith(f"{key}:"):
            return number
    return None


def _line_naming(text: str, key: str, value: str) -> int | None:
    """The line that sets `key` to `value`, in block or flow style (`{..., key: value}`)."""
    for number, line in enumerate(text.splitlines(), start=1):
        if f"{key}: {value}" in line or f"{key}: '{value}'" in line or f'{key}: "{value}"' in line:
            return number
    return _line_of(text, key)


def _is_seed(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_SEED


def load_suite(path: str | Path) -> Suite:
    """Read and check a suite file; mistakes are CsekitErrors naming the file and line."""
    path = Path(path)
    text = read_bounded_text(path, "suite file", limit=2**20)
    raw = parse_yaml(text, str(path), "suite")[0] or {}
    if not isinstance(raw, dict):
        raise CsekitError(f"{path}: a suite is a mapping with keys {', '.join(sorted(SUITE_KEYS))}")
    for key in raw:
        if key not in SUITE_KEYS:
            raise CsekitError(
                f"{at(path, _line_of(text, key))}: unknown suite key {key!r}; expected {sorted(SUITE_KEYS)}"
            )
    seeds = raw.get("seeds", [42])
    if not isinstance(seeds, list) or not seeds or not all(_is_seed(s) for s in seeds):
        raise CsekitError(
            f"{at(path, _line_of(text, 'seeds'))}: seeds must be a non-empty list of integers in [0, {MAX_SEED}]"
        )
    tasks = raw.get("tasks", "sts")
    if isinstance(tasks, list):
        tasks = ",".join(str(t) for t in tasks)
    from csekit.evaluation.suite import parse_tasks

    try:
        parse_tasks(str(tasks))
    except CsekitError as error:
        raise CsekitError(f"{at(path, _line_of(text, 'tasks'))}: {error}") from None
    entries = raw.get("recipes")
    if not isinstance(entries, list) or not entries:
        raise CsekitError(f"{at(path, _line_of(text, 'recipes'))}: recipes must be a non-empty list")
    recipes: list[SuiteRecipe] = []
    for entry in entries:
        recipes.append(_suite_recipe(path, text, entry, [r.name for r in recipes]))
    sample = raw.get("sample_sentences", 1000)
    if not isinstance(sample, int) or sample < 2:
        raise CsekitError(f"{at(path, _line_of(text, 'sample_sentences'))}: sample_sentences must be an integer >= 2")
    baseline = raw.get("baseline")
    if baseline is not None and str(baseline) not in [r.name for r in recipes]:
        raise CsekitError(
            f"{at(path, _line_of(text, 'baseline'))}: baseline {baseline!r} is not a recipe name of this suite; "
            f"expected one of {[r.name for r in recipes]}"
        )
    _check_controls(path, text, recipes)
    return Suite(
        str(raw.get("name") or path.stem),
        seeds,
        str(tasks),
        recipes,
        sample,
        None if baseline is None else str(baseline),
        _published_file(path, text, raw.get("published"), recipes),
    )


def _suite_recipe(path: Path, text: str, entry: Any, taken: list[str]) -> SuiteRecipe:
    """One entry of a suite's `recipes:` list, checked (`taken`: the names of the entries before it)."""
    if isinstance(entry, str):
        entry = {"recipe": entry}
    if not isinstance(entry, dict) or "recipe" not in entry:
        raise CsekitError(f"{at(path, _line_of(text, 'recipes'))}: each recipe needs a `recipe:` path")
    unknown = set(entry) - RECIPE_KEYS
    if unknown:
        key = sorted(unknown)[0]
        raise CsekitError(
            f"{at(path, _line_of(text, key))}: unknown recipe key {key!r}; expected {sorted(RECIPE_KEYS)}"
        )
    recipe_path = (path.parent / str(entry["recipe"])).resolve()
    if not recipe_path.exists():
        raise CsekitError(f"{at(path, _line_of(text, 'recipe'))}: recipe {recipe_path} does not exist")
    overrides = entry.get("set") or []
    if not isinstance(overrides, list):
        raise CsekitError(f"{at(path, _line_of(text, 'set'))}: set must be a list of key=value strings")
    name = entry.get("name") or recipe_path.stem
    if not isinstance(name, str | int | float) or isinstance(name, bool):
        raise CsekitError(f"{at(path, _line_of(text, 'name'))}: a recipe name must be text")
    name = str(name)
    # The name becomes the run folder OUTPUT/NAME-seedK: it must stay one folder inside OUTPUT.
    check_name(name, f"{at(path, _line_naming(text, 'name', name))}: recipe name", folder="--output")
    if name in taken:
        raise CsekitError(f"{at(path, _line_of(text, 'recipes'))}: two recipes are named {name!r}; give one a name")
    control = entry.get("control")
    paper = entry.get("paper")
    if paper is not None and (not isinstance(paper, str) or not paper):
        raise CsekitError(
            f"{at(path, _line_of(text, 'paper'))}: paper must name an entry of the suite's published file"
        )
    return SuiteRecipe(name, recipe_path, [str(o) for o in overrides], None if control is None else str(control), paper)


def _published_file(path: Path, text: str, value: Any, recipes: list[SuiteRecipe]) -> Path | None:
    """The suite's `published:` file (relative to the suite), read and checked now; each `paper:` names an entry."""
    if value is None:
        for recipe in recipes:
            if recipe.paper is not None:
                line = _line_naming(text, "paper", recipe.paper)
                raise CsekitError(f"{at(path, line)}: paper needs a `published:` file in the suite")
        return None
    if not isinstance(value, str) or not value:
        raise CsekitError(f"{at(path, _line_of(text, 'published'))}: published must be a path to a YAML file")
    published = (path.parent / value).resolve()
    try:
        rows = load_published(published)
    except CsekitError as error:
        raise CsekitError(f"{at(path, _line_of(text, 'published'))}: {error}") from None
    for recipe in recipes:
        if recipe.paper is not None and recipe.paper not in rows:
            raise CsekitError(
                f"{at(path, _line_naming(text, 'paper', recipe.paper))}: paper {recipe.paper!r} of {recipe.name!r} "
                f"is not an entry of {published}"
            )
    return published


def _check_controls(path: Path, text: str, recipes: list[SuiteRecipe]) -> None:
    """Each `control:` names another recipe of the suite."""
    names = [r.name for r in recipes]
    for recipe in recipes:
        if recipe.control is not None and (recipe.control not in names or recipe.control == recipe.name):
            raise CsekitError(
                f"{at(path, _line_naming(text, 'control', recipe.control))}: control {recipe.control!r} of "
                f"{recipe.name!r} is not another recipe name of this suite; "
                f"expected one of {[n for n in names if n != recipe.name]}"
            )


def run_dir(output: Path, recipe: SuiteRecipe, seed: int) -> Path:
    """`OUTPUT/NAME-seedK`, never outside OUTPUT (the name comes from the suite file, see `child_path`)."""
    return child_path(output, f"{recipe.name}-seed{seed}", f"suite recipe name {recipe.name!r}")


def _run_one(
    recipe: SuiteRecipe,
    seed: int,
    suite: Suite,
    folder: Path,
    data_dir: Path | None,
    overrides: Sequence[str],
    show_progress: bool,
) -> dict[str, Any]:
    """Train (or resume) one run, evaluate its best model, sample corpus cosines, write results.json last."""
    from csekit.data.corpus import open_corpus
    from csekit.data.data_dir import resolve_data_dir
    from csekit.encoding.encoder import SentenceEncoder
    from csekit.evaluation.alignment import pairwise_cosines, sample_sentences
    from csekit.evaluation.suite import parse_tasks, run_evaluation
    from csekit.training.recipe import load_recipe
    from csekit.training.trainer import train

    config = load_recipe(recipe.path, [*recipe.overrides, *overrides, f"train.seed={seed}"])
    started = any((folder / name).exists() for name in ("metrics.jsonl", "checkpoint"))
    train_start = time.perf_counter()
    result = train(config, folder, data_dir=data_dir, resume=started, show_progress=show_progress)
    train_seconds = time.perf_counter() - train_start
    evaluate_start = time.perf_counter()
    encoder = SentenceEncoder.load(folder / "best")

    def encode(sentences: list[str]) -> np.ndarray:
        return encoder.encode(
            sentences, batch_size=config.train.eval_batch_size, precision="fp32", show_progress_bar=False
        )

    root = resolve_data_dir(data_dir)
    scores = run_evaluation(encode, root, parse_tasks(suite.tasks), n_jobs=-1)
    corpus = open_corpus(config.data.corpus, root, config.data.max_chars, "skip", config.data.text_column)
    texts = [str(corpus[i]) for i in range(len(corpus))]
    sample = sample_sentences(texts, suite.sample_sentences, seed=seed)
    cosines = pairwise_cosines(encode(sample)).astype(np.float32)
    report: dict[str, Any] = {"recipe": recipe.name, "seed": seed, "steps": result.steps, "best_step": result.best_step}
    # Wall time of this call (training includes its dev evaluations); a resumed run counts only its last part.
    report["wall_seconds"] = {
        "train": round(train_seconds, 3),
        "evaluate": round(time.perf_counter() - evaluate_start, 3),
        "resumed": started,
    }
    report["tasks"] = {k: v for k, v in scores.items() if k not in ("avg", "transfer_avg")}
    for key in ("avg", "transfer_avg"):
        if key in scores:
            report[key] = scores[key]
    intact = f"the run's checkpoint is intact; run the suite again to finish {folder}"
    with guarded_save(f"{COSINES_FILE} and {RESULTS_FILE}", folder, intact):
        write_file(folder / COSINES_FILE, lambda handle: np.save(handle, cosines))
        atomic_write_text(folder / RESULTS_FILE, json_text(report, indent=2) + "\n")
    return report


def _pending_runs(out: Path, suite: Suite) -> list[tuple[SuiteRecipe, int]]:
    """The (recipe, seed) pairs without a results.json yet, in the order they run."""
    return [
        (recipe, seed)
        for recipe in suite.recipes
        for seed in suite.seeds
        if not os.path.lexists(run_dir(out, recipe, seed) / RESULTS_FILE)
    ]


def check_suite_inputs(
    suite: Suite, pending: list[tuple[SuiteRecipe, int]], data_dir: Path | None, overrides: Sequence[str]
) -> None:
    """Resolve every pending run's recipe and look up its inputs before the first training.

    One line lists each recipe whose recipe or inputs are wrong (with the command that makes a missing
    input), so that a suite never stops hours in because a later recipe's corpus or counts were never made.
    """
    from csekit.training.inputs import check_recipe_inputs
    from csekit.training.recipe import load_recipe

    problems: dict[str, str] = {}
    for recipe, seed in pending:
        if recipe.name in problems:
            continue
        try:
            config = load_recipe(recipe.path, [*recipe.overrides, *overrides, f"train.seed={seed}"])
            check_recipe_inputs(config, data_dir)
        except CsekitError as error:
            problems[recipe.name] = str(error)
    missing_data = _missing_task_data(suite, data_dir) if pending else None
    if problems or missing_data:
        listed = "; ".join(f"[{name}] {problem}" for name, problem in problems.items())
        parts = [f"{len(problems)} recipe(s) cannot run: {listed}"] if problems else []
        parts += [missing_data] if missing_data else []
        raise CsekitError(f"suite {suite.name}: nothing trained, " + "; ".join(parts))


def _missing_task_data(suite: Suite, data_dir: Path | None) -> str | None:
    """The suite's evaluation tasks whose data folder is missing (checked before training, not after it)."""
    from csekit.data.data_dir import find_task_dir, resolve_data_dir
    from csekit.evaluation.suite import parse_tasks
    from csekit.evaluation.tasks import EVAL_TASKS

    try:
        root = resolve_data_dir(data_dir)
    except CsekitError:
        return None  # every recipe's check has said so already
    groups = parse_tasks(suite.tasks)
    missing = []
    for name in (*groups["sts"], *groups["dev"], *groups["transfer"]):
        task = EVAL_TASKS.get(name)
        try:
            if task.load is None:
                find_task_dir(root, task.folder)
        except CsekitError:
            missing.append(name)
    if not missing:
        return None
    return (
        f"[evaluation data] no data for {', '.join(missing)} under {root}: `csekit download-data {root}` fetches "
        "STS12-16, STS-B and SICK; the transfer tasks are read from transfer/MR .. MRPC (README, transfer tasks)"
    )


def _duration(seconds: float) -> str:
    minutes, seconds = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min {seconds:02d} s"


def run_suite(
    suite_path: str | Path,
    output: str | Path,
    data_dir: str | Path | None = None,
    overrides: Sequence[str] = (),
    show_progress: bool = True,
    log: Any = print,
) -> dict[str, Any]:
    """Run every recipe x seed not yet finished, then write the tables and plots; returns what ran.

    Every pending run's inputs are checked first; after each run, the time the rest is expected to take
    (the mean of this call's runs so far) is logged.
    """
    suite = load_suite(suite_path)
    out = Path(output)
    data_path = Path(data_dir) if data_dir else None
    pending = _pending_runs(out, suite)
    check_suite_inputs(suite, pending, data_path, overrides)
    out.mkdir(parents=True, exist_ok=True)
    ran: list[str] = []
    skipped = [run_dir(out, r, s).name for r in suite.recipes for s in suite.seeds if (r, s) not in pending]
    for name in skipped:
        log(f"{name}: finished earlier, skipped")
    started = time.perf_counter()
    for index, (recipe, seed) in enumerate(pending, start=1):
        folder = run_dir(out, recipe, seed)
        log(f"{folder.name}: training and evaluating (run {index} of {len(pending)})")
        _run_one(recipe, seed, suite, folder, data_path, overrides, show_progress)
        ran.append(folder.name)
        elapsed = time.perf_counter() - started
        left = len(pending) - index
        if left:
            log(f"{folder.name}: done; {left} run(s) left, about {_duration(elapsed / index * left)} more")
    summary = summarise(out, suite)
    return {"ran": ran, "skipped": skipped, **summary}


# --- collection, tables, plots ----------------------------------------------------------------------


def _get(report: dict[str, Any], path: tuple[str, ...]) -> float | None:
    value: Any = report
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return float(value) if isinstance(value, int | float) else None


def collect(output: Path, suite: Suite) -> dict[str, list[dict[str, Any]]]:
    """results.json of every finished run, grouped by recipe name (suite order)."""
    runs: dict[str, list[dict[str, Any]]] = {}
    for recipe in suite.recipes:
        for seed in suite.seeds:
            path = run_dir(output, recipe, seed) / RESULTS_FILE
            if os.path.lexists(path):
                runs.setdefault(recipe.name, []).append(read_results(path))
    return runs


def read_results(path: Path) -> dict[str, Any]:
    """A run's results.json (bounded), checked to hold what the summary reads; anything else is one line."""
    report = read_json_file(path, "run results", limit=RESULTS_LIMIT)
    problem = _results_problem(report)
    if problem is not None:
        raise CsekitError(f"{path}: {problem}; it is not what csekit bench wrote (remove it to run that run again)")
    report.setdefault("tasks", {})
    return report


def _results_problem(report: Any) -> str | None:
    if not isinstance(report, dict):
        return "not a JSON object"
    tasks = report.get("tasks", {})
    if not isinstance(tasks, dict) or not all(_is_scores(value) for value in tasks.values()):
        return '"tasks" must map each task to a score or a mapping of scores'
    if not all(_is_score(report.get(key)) for key in ("avg", "transfer_avg")):
        return '"avg" and "transfer_avg" must be scores'
    align = tasks.get("align")
    if align is not None and not (isinstance(align, dict) and {"align", "uniform"} <= set(align)):
        return '"tasks.align" must give "align" and "uniform"'
    wall = report.get("wall_seconds")
    if wall is not None and not (
        isinstance(wall, dict) and all(_is_number(wall.get(k)) for k in ("train", "evaluate"))
    ):
        return '"wall_seconds" must give "train" and "evaluate" as numbers'
    return None


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _is_score(value: Any) -> bool:
    """A finite number, or null (a score that was not a number, such as a Spearman correlation of constants)."""
    return value is None or _is_number(value)


def _is_scores(value: Any, depth: int = 0) -> bool:
    if isinstance(value, dict):
        return depth < 3 and all(isinstance(k, str) and _is_scores(v, depth + 1) for k, v in value.items())
    return _is_score(value)


def table_rows(runs: dict[str, list[dict[str, Any]]]) -> tuple[list[str], list[dict[str, Any]]]:
    """Columns present in any run, and per method the mean and standard deviation (ddof=0) over seeds."""
    columns = [
        (label, path)
        for label, path in (*STS_COLUMNS, *TRANSFER_COLUMNS, *OTHER_COLUMNS)
        if any(_get(r, path) is not None for reports in runs.values() for r in reports)
    ]
    rows = []
    for method, reports in runs.items():
        row: dict[str, Any] = {"method": method, "seeds": len(reports)}
        for label, path in columns:
            values = [v for v in (_get(r, path) for r in reports) if v is not None]
            scale = 1.0 if label in UNSCALED else 100.0
            row[label] = (scale * float(np.mean(values)), scale * float(np.std(values))) if values else None
        rows.append(row)
    return [label for label, _ in columns], rows


def format_markdown(labels: list[str], rows: list[dict[str, Any]]) -> str:
    """The papers' layout: one row per method, `mean ± std` over seeds (x 100 except align/uniform); a method
    with one seed shows its value alone (a spread of 0.00 would read as a measured one)."""
    heads = ["Method", "Seeds", *labels]
    lines = ["| " + " | ".join(heads) + " |", "|" + "|".join("---" for _ in heads) + "|"]
    for row in rows:
        cells = [row["method"], str(row["seeds"])]
        for label in labels:
            value = row[label]
            digits = 3 if label in UNSCALED else 2
            spread = f" ± {value[1]:.{digits}f}" if value is not None and row["seeds"] > 1 else ""
            cells.append("-" if value is None else f"{value[0]:.{digits}f}{spread}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def format_csv(
    labels: list[str],
    rows: list[dict[str, Any]],
    differences: dict[str, dict[str, PairedDifference]] | None = None,
    papers: dict[str, dict[str, PaperComparison]] | None = None,
) -> str:
    """One row per method; with `differences`, also each STS column's paired difference, p and seeds above;
    with `papers`, each published column's paper number, difference, 95% range (one run's, or a mean's where the
    paper gives a mean of runs) and whether it is within."""
    paired_labels = [label for label, _ in STS_COLUMNS] if differences is not None else []
    paper_labels = _paper_labels(papers or {})
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(
        [
            "method",
            "seeds",
            *[f"{label} {stat}" for label in labels for stat in ("mean", "std")],
            *[f"{label} {stat}" for label in paired_labels for stat in ("diff", "p", "seeds above", "paired seeds")],
            *[f"{label} {stat}" for label in paper_labels for stat in PAPER_CSV_STATS],
        ]
    )
    for row in rows:
        cells: list[Any] = [row["method"], row["seeds"]]
        for label in labels:
            cells += ["", ""] if row[label] is None else [f"{row[label][0]:.4f}", f"{row[label][1]:.4f}"]
        for label in paired_labels:
            diff = (differences or {}).get(row["method"], {}).get(label)
            if diff is None:
                cells += ["", "", "", ""]
            else:
                p_text = "" if diff.p_value is None else f"{diff.p_value:.4g}"
                cells += [f"{diff.mean:.4f}", p_text, diff.higher, len(diff.seeds)]
        for label in paper_labels:
            cells += _paper_csv_cells((papers or {}).get(row["method"], {}).get(label))
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


def paired_differences(runs: dict[str, list[dict[str, Any]]], baseline: str) -> dict[str, dict[str, PairedDifference]]:
    """Per method (not the baseline) and STS column: the difference to the baseline, seed by seed.

    Seeds share the training data order and initialisation noise of the same seed, so pairing them
    removes that part of the seed-to-seed spread; only seeds present in both are compared.
    """
    from scipy.stats import ttest_rel

    base_by_seed = {int(report["seed"]): report for report in runs.get(baseline, [])}
    differences: dict[str, dict[str, PairedDifference]] = {}
    for method, reports in runs.items():
        if method == baseline:
            continue
        for label, path in STS_COLUMNS:
            pairs = []
            for report in reports:
                base = base_by_seed.get(int(report["seed"]))
                value, base_value = _get(report, path), None if base is None else _get(base, path)
                if value is not None and base_value is not None:
                    pairs.append((int(report["seed"]), 100.0 * value, 100.0 * base_value))
            if not pairs:
                continue
            seeds, values, base_values = (list(column) for column in zip(*pairs, strict=True))
            deltas = np.subtract(values, base_values)
            p_value = None
            if len(pairs) >= 2 and float(np.std(deltas)) > 0:
                p_value = float(ttest_rel(values, base_values).pvalue)
            differences.setdefault(method, {})[label] = PairedDifference(
                seeds, float(np.mean(deltas)), p_value, int(np.sum(deltas > 0))
            )
    return differences


def format_paired_markdown(baseline: str, differences: dict[str, dict[str, PairedDifference]]) -> str:
    """Each method minus the baseline (x 100) with its p-value; `*` marks p < 0.05."""
    labels = [label for label, _ in STS_COLUMNS]
    heads = ["Method", "Paired seeds", *labels, f"Seeds above {baseline} (STS Avg.)"]
    lines = ["| " + " | ".join(heads) + " |", "|" + "|".join("---" for _ in heads) + "|"]
    for method, columns in differences.items():
        first = next(iter(columns.values()))
        cells = [method, ", ".join(str(seed) for seed in first.seeds)]
        for label in labels:
            diff = columns.get(label)
            if diff is None:
                cells.append("-")
                continue
            p_text = "p = -" if diff.p_value is None else _p_text(diff.p_value)
            cells.append(f"{_signed(diff.mean)} ({p_text}){' *' if diff.significant else ''}")
        average = columns.get("STS Avg.")
        cells.append("-" if average is None else f"{average.higher}/{len(average.seeds)}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _p_text(p_value: float) -> str:
    """`p = 0.042`; below 0.0005 `p < 0.001` (three decimals would print a p-value of 0.000)."""
    return "p < 0.001" if p_value < 0.0005 else f"p = {p_value:.3f}"


def _signed(value: float) -> str:
    """A difference with its sign and 2 decimals; one that rounds to zero prints 0.00, not -0.00 or +0.00."""
    text = f"{value:+.2f}"
    return "0.00" if text in ("+0.00", "-0.00") else text


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
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n" if len(lines) > 2 else ""


def _dev_curves(output: Path, suite: Suite) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """Per method and metric (dev score, align, uniform): (step, mean over seeds) from metrics.jsonl."""
    curves: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for recipe in suite.recipes:
        per_metric: dict[str, dict[int, list[float]]] = {}
        for seed in suite.seeds:
            path = run_dir(output, recipe, seed) / METRICS_FILE
            if os.path.lexists(path):
                for step, key, value in _evaluation_points(path):
                    per_metric.setdefault(key, {}).setdefault(step, []).append(value)
        if per_metric:
            curves[recipe.name] = {
                key: sorted((step, float(np.mean(vals))) for step, vals in steps.items())
                for key, steps in per_metric.items()
            }
    return curves


def _evaluation_points(path: Path) -> Iterator[tuple[int, str, float]]:
    """(step, metric, value) of every evaluation record in a run's metrics.jsonl, streamed and bounded line by
    line; a record that is not what csekit writes is one line naming the file and line."""
    try:
        source = open_regular(path)
    except OSError as error:
        raise CsekitError(f"{path}: cannot read it ({error.strerror or error})") from None
    with source:
        for number, (line, _) in enumerate(bounded_lines(source, METRICS_LINE_LIMIT), start=1):
            if line is not None and not line.strip():
                continue
            record = None if line is None else metrics_record(line.rstrip(b"\r\n"))
            if record is None:
                if line is not None and not line.endswith(b"\n"):
                    continue  # a last line cut off by a killed run
                raise CsekitError(f"{path}:{number}: not a metrics record (a JSON object with a step)")
            if "align" not in record:
                continue
            dev_keys = [k for k in ("stsb-dev", "sick-dev") if k in record]
            for key in [*dev_keys, "align", "uniform"]:
                value = record.get(key)
                if value is None:  # a score that was not a number
                    continue
                if not _is_number(value):
                    raise CsekitError(f"{path}:{number}: {key} is {str(value)[:40]!r}, not a number")
                yield record["step"], key, float(value)


def _cosines_header_checked(handle: BinaryIO) -> BinaryIO:
    """`handle` back at its start once its .npy header says a 1-D float array that fits in the file (a header
    claiming 10^12 values would otherwise make numpy allocate them before reading)."""
    version = np.lib.format.read_magic(handle)  # numpy's own header parsers; np.save writes version 1.0
    readers = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
    if version not in readers:
        raise ValueError(f"npy format version {version}")
    shape, _, dtype = readers[version](handle)
    size = os.fstat(handle.fileno()).st_size
    if len(shape) != 1 or dtype.kind != "f" or shape[0] * dtype.itemsize > size:
        raise ValueError(f"holds a {dtype} array of shape {shape}, not a list of cosines")
    handle.seek(0)
    return handle


def read_cosines(path: Path) -> np.ndarray:
    """A run's cosines.npy: a 1-D float array of finite cosines, read without pickle (its header checked first)."""

    try:
        values = read_with(
            path, lambda handle: np.load(_cosines_header_checked(handle), allow_pickle=False), "cosines", COSINES_LIMIT
        )
    except (ValueError, OSError, EOFError) as error:
        reason = str(error).splitlines()[0][:200] if str(error) else type(error).__name__
        raise CsekitError(f"{path}: not a cosine sample written by csekit bench ({reason})") from None
    if not np.isfinite(values).all():
        raise CsekitError(f"{path}: holds values that are not finite; not a cosine sample written by csekit bench")
    return values


def write_plots(output: Path, suite: Suite, runs: dict[str, list[dict[str, Any]]]) -> list[Path]:
    """Dev score and alignment/uniformity over steps, alignment vs uniformity, in-batch cosine histograms."""
    try:
        import matplotlib
    except ImportError:
        raise CsekitError(
            "the plots need matplotlib: pip install 'csekit[bench]' (or pip install matplotlib)"
        ) from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written: list[Path] = []

    def _save(fig: Any, path: Path) -> Path:
        fig.tight_layout()
        write_file(path, lambda handle: fig.savefig(handle, format="png", dpi=100))
        plt.close(fig)
        return path

    curves = _dev_curves(output, suite)
    if curves:
        fig, axes = plt.subplots(1, 3, figsize=(15, 4))
        for method, metrics in curves.items():
            dev_key = next((k for k in ("stsb-dev", "sick-dev") if k in metrics), None)
            for ax, key in zip(axes, (dev_key, "align", "uniform"), strict=True):
                if key in metrics:
                    steps, values = zip(*metrics[key], strict=True)
                    scale = 100.0 if key == dev_key else 1.0
                    ax.plot(steps, [scale * v for v in values], marker="o", label=method)
        for ax, title in zip(
            axes, ("dev Spearman x 100", "alignment (lower is better)", "uniformity (lower is better)"), strict=True
        ):
            ax.set_title(title)
            ax.set_xlabel("training step")
            ax.legend(fontsize="small")
        written.append(_save(fig, output / "training_curves.png"))

    points = {
        method: [
            (r["tasks"]["align"]["uniform"], r["tasks"]["align"]["align"])
            for r in reports
            if "align" in r["tasks"] and None not in (r["tasks"]["align"]["uniform"], r["tasks"]["align"]["align"])
        ]
        for method, reports in runs.items()
    }
    if any(points.values()):
        fig, ax = plt.subplots(figsize=(5, 4))
        for method, xy in points.items():
            if xy:
                ax.scatter(*zip(*xy, strict=True), label=method)
        for metrics in curves.values():  # the trajectory over training, as in SimCSE's Figure 2
            if "align" in metrics and "uniform" in metrics:
                ax.plot([v for _, v in metrics["uniform"]], [v for _, v in metrics["align"]], alpha=0.4, linestyle="--")
        ax.set_xlabel("uniformity")
        ax.set_ylabel("alignment")
        ax.set_title("alignment vs uniformity (STS-B dev; lower is better)")
        ax.legend(fontsize="small")
        written.append(_save(fig, output / "align_uniform.png"))

    cosines = {}
    for recipe in suite.recipes:
        arrays = [
            read_cosines(run_dir(output, recipe, seed) / COSINES_FILE)
            for seed in suite.seeds
            if os.path.lexists(run_dir(output, recipe, seed) / COSINES_FILE)
        ]
        if arrays:
            cosines[recipe.name] = np.concatenate(arrays)
    if cosines:
        fig, ax = plt.subplots(figsize=(6, 4))
        for method, values in cosines.items():
            ax.hist(values, bins=50, range=(-1, 1), density=True, histtype="step", label=method)
        ax.set_xlabel("cosine similarity of sentence pairs from the corpus (in-batch negatives)")
        ax.set_ylabel("density")
        ax.legend(fontsize="small")
        written.append(_save(fig, output / "negative_cosines.png"))
    return written


def _controls_markdown(suite: Suite, runs: dict[str, list[dict[str, Any]]]) -> str:
    """One paired table per recipe that names a `control` (e.g. a method against SimCSE with the same pooler)."""
    markdown = ""
    for recipe in suite.recipes:
        if recipe.control is None:
            continue
        markdown += f"\n## Paired difference of {recipe.name} against its control {recipe.control}\n\n"
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
    markdown = f"# {suite.name}\n\n{spread}; x 100 except alignment and uniformity.\n\n"
    markdown += format_markdown(labels, rows)
    differences = None
    if suite.baseline is not None and not one_seed:
        differences = paired_differences(runs, suite.baseline)
        markdown += (
            f"\n## Paired difference against {suite.baseline}\n\n"
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
        markdown += _controls_markdown(suite, runs)
    wall = format_wall_markdown(runs)
    if wall:
        markdown += "\n## Wall time per run\n\nSeconds; a resumed run counts only its last part.\n\n" + wall
    papers = None
    if suite.published is not None:
        published = load_published(suite.published)
        papers = paper_comparisons(suite, runs, published)
        markdown += format_paper_markdown(suite, runs, published, papers)
    with guarded_save("results.md and results.csv", output, "the runs' results.json files are intact"):
        atomic_write_text(output / "results.md", markdown)
        atomic_write_text(output / "results.csv", format_csv(labels, rows, differences, papers))
    with guarded_save("the plots", output, "results.md, results.csv and the runs' results are intact"):
        plots = write_plots(output, suite, runs)
        if papers and any(STS_AVERAGE in columns for columns in papers.values()):
            plots.append(write_paper_plot(output, suite, runs, papers))
    return {"table": markdown, "plots": [str(p) for p in plots], "finished": sum(len(r) for r in runs.values())}


# --- against the published numbers (a suite's `published:` file) --------------------------------------

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
            values = [100.0 * v for v in (_get(r, paths[label]) for r in runs[recipe.name]) if v is not None]
            if values:
                comparison = compare_with_paper(paper, values, row.runs_of(label))
                comparisons.setdefault(recipe.name, {})[label] = comparison
    return comparisons


def _paper_labels(papers: dict[str, dict[str, PaperComparison]]) -> list[str]:
    """The published columns compared for any recipe, in the papers' order."""
    return [label for label in PUBLISHED_COLUMNS if any(label in columns for columns in papers.values())]


def _paper_csv_cells(comparison: PaperComparison | None) -> list[str]:
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
    "sqrt(1/k + 1/n) for sqrt(1 + 1/n), with k = 2 where the source does not give the count."
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
    markdown = f"\n## Against the published numbers\n\nPublished numbers: {shown}. {PAPER_RULE}\n"
    if judged:
        markdown += f"\nWithin the seed spread: {sum(judged)} of {len(judged)} published numbers.\n"
    for recipe in suite.recipes:
        markdown += f"\n### {recipe.name}\n\n"
        row = published.get(recipe.published_as)
        if row is None:
            markdown += f"No entry {recipe.published_as!r} in the published file.\n"
        elif row.reason is not None:
            markdown += f"No published numbers: {row.reason}\n"
        elif recipe.name not in runs:
            markdown += f"Paper: {row.source}. No finished run yet.\n"
        else:
            markdown += _paper_table(row, papers.get(recipe.name, {}))
    return markdown


def _paper_table(row: PublishedRow, columns: dict[str, PaperComparison]) -> str:
    """The table of one recipe: a line per published column."""
    lines = [f"Paper: {row.source}." + (f" Note: {row.note}" if row.note else ""), ""]
    lines += ["| Task | Paper | csekit | Difference | 95% range | Paper within |", "|---|---|---|---|---|---|"]
    for label, paper in row.scores.items():
        comparison = columns.get(label)
        if comparison is None:
            lines.append(f"| {label} | {paper:.2f} | not evaluated | - | - | - |")
            continue
        spread = "-" if comparison.low is None else f"{comparison.low:.2f} to {comparison.high:.2f}"
        within = {None: "-", True: "yes", False: "no"}[comparison.within]
        measured = f"{comparison.mean:.2f} ± {comparison.std:.2f} ({comparison.seeds} seeds)"
        published = f"{paper:.2f}" + _mean_mark(row, label)
        lines.append(f"| {label} | {published} | {measured} | {_signed(comparison.difference)} | {spread} | {within} |")
    return "\n".join(lines) + "\n"


def _mean_mark(row: PublishedRow, label: str) -> str:
    """' (mean of k runs)' after a published mean (' (mean of runs)' where the count is not given)."""
    if label not in row.means:
        return ""
    runs = row.means[label]
    return f" (mean of {runs} runs)" if runs else " (mean of runs)"


def write_paper_plot(
    output: Path, suite: Suite, runs: dict[str, list[dict[str, Any]]], papers: dict[str, dict[str, PaperComparison]]
) -> Path:
    """STS average per recipe: each seed, csekit's mean ± std, and the paper's average marked beside them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [recipe.name for recipe in suite.recipes if STS_AVERAGE in papers.get(recipe.name, {})]
    fig, ax = plt.subplots(figsize=(max(5.0, 1.2 * len(names) + 2), 4))
    for x, name in enumerate(names):
        comparison = papers[name][STS_AVERAGE]
        seeds = [100.0 * v for v in (_get(r, ("avg",)) for r in runs[name]) if v is not None]
        ax.scatter([x - 0.1] * len(seeds), seeds, color="tab:blue", s=12, label="csekit seed" if x == 0 else None)
        ax.errorbar(
            x,
            comparison.mean,
            yerr=comparison.std,
            fmt="o",
            color="tab:blue",
            capsize=4,
            label="csekit mean ± std" if x == 0 else None,
        )
        ax.scatter(x + 0.1, comparison.paper, marker="*", s=120, color="tab:red", label="paper" if x == 0 else None)
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize="small")
    ax.set_ylabel("STS Avg. (Spearman x 100)")
    ax.set_title("STS average: csekit's seeds against the paper")
    ax.legend(fontsize="small")
    fig.tight_layout()
    path = output / PAPER_PLOT
    write_file(path, lambda handle: fig.savefig(handle, format="png", dpi=100))
    plt.close(fig)
    return path

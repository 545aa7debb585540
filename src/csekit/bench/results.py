"""A bench run's results: results.json (one `EvalResult` with the run's facts), cosines.npy and the dev curves
of metrics.jsonl, read back bounded and checked; the table columns are paths into results.json."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from csekit.bench.suite import Suite, is_seed, run_dir
from csekit.core.bounded_read import bounded_lines, open_regular, read_json_file, read_with
from csekit.core.errors import CsekitError
from csekit.core.numbers import is_finite_number
from csekit.evaluation.file_tasks import FILE_TASK_SCORES
from csekit.evaluation.result import AVERAGES, STS_AVERAGE, TRANSFER_AVERAGE, EvalResult
from csekit.evaluation.tasks import table_columns
from csekit.training.run_folder import METRICS_FILE, METRICS_LINE_LIMIT, metrics_record

RESULTS_FILE = "results.json"
COSINES_FILE = "cosines.npy"
RESULTS_LIMIT = 2**20
"""The largest results.json read (bench writes a few KiB)."""
COSINES_LIMIT = 2**28
"""The largest cosines.npy read (bench writes 2 MB: 1000 sentences give 499,500 float32 pairs)."""
COSINE_SLACK = 1e-3
"""How far past +-1 a float32 cosine of unit vectors may round (1.0000001 is one)."""
# (column label, path into results.json "tasks"/"averages") in the papers' order
STS_COLUMNS = (
    *((label, ("tasks", task, key)) for label, task, key in table_columns("sts")),
    ("STS Avg.", ("averages", STS_AVERAGE)),
)
TRANSFER_COLUMNS = (
    *((label, ("tasks", task, key)) for label, task, key in table_columns("transfer")),
    ("Transfer Avg.", ("averages", TRANSFER_AVERAGE)),
)
OTHER_COLUMNS = (
    ("STS-B dev", ("tasks", "stsb-dev")),
    ("SICK dev", ("tasks", "sick-dev")),
    ("align", ("tasks", "align", "align")),
    ("uniform", ("tasks", "align", "uniform")),
)
UNSCALED = {"align", "uniform"}  # reported as they are; everything else x 100
SCORE_RANGES = {"align": (0.0, 4.0), "uniform": (-8.0, 0.0)}
"""The values a column can hold (unit vectors: alignment in [0, 4], uniformity in [-8, 0]); every other column is a
correlation, an accuracy or a retrieval score, in [-1, 1]. A results.json score of 1e308 became infinite x 100, and
the paper comparison's sums a ValueError traceback."""


def file_task_columns(runs: dict[str, list[dict[str, Any]]]) -> list[tuple[str, tuple[str, ...]]]:
    """A column for each score of each of the user's file tasks the runs report (`pairs:NAME/spearman`, named as
    `train.select_metric` names it), in the order the runs give the tasks."""
    tasks = dict.fromkeys(task for reports in runs.values() for r in reports for task in r.get("tasks") or {})
    return [
        (f"{task}/{score}", ("tasks", task, score))
        for task in tasks
        if task.partition(":")[0] in FILE_TASK_SCORES
        for score in FILE_TASK_SCORES[task.partition(":")[0]]
    ]


def score_at(report: dict[str, Any], path: tuple[str, ...]) -> float | None:
    """The number at `path` in a run's report (a column's path), or None where the run has none."""
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
                runs.setdefault(recipe.name, []).append(read_results(path, seed))
    return runs


def read_results(path: Path, seed: int | None = None) -> dict[str, Any]:
    """A run's results.json (bounded), checked to hold what the summary reads; anything else is one line. With
    `seed` (the seed of the run folder it is in), its `seed` must be that one: the paired tests pair runs by it, and
    a results.json copied from another seed's folder paired one seed with itself.

    A results.json of the layout before the averages had their own key (`avg` and `transfer_avg` at the top,
    `avg_sts` in `tasks`) is read as the same result, so a bench folder of an older csekit still summarises.
    """
    report = read_json_file(path, "run results", limit=RESULTS_LIMIT)
    remove = "it is not what csekit bench wrote (remove it to run that run again)"
    if isinstance(report, dict) and "averages" not in report:
        report = from_old_layout(report)
    try:
        result = EvalResult.from_json(report, str(path))
    except CsekitError as error:
        raise CsekitError(f"{error}; {remove}") from None
    wall = report.get("wall_seconds")
    if wall is not None and not (
        isinstance(wall, dict) and all(_is_number(wall.get(k)) and wall[k] >= 0 for k in ("train", "evaluate"))
    ):
        raise CsekitError(f'{path}: "wall_seconds" must give "train" and "evaluate" as seconds (>= 0); {remove}')
    for label, column in (*STS_COLUMNS, *TRANSFER_COLUMNS, *OTHER_COLUMNS, *file_task_columns({"": [report]})):
        value = score_at(report, column)
        if value is not None and not _in_range(label, value):
            raise CsekitError(f"{path}: {label} is {value:.4g}, not a score in {_range_text(label)}; {remove}")
    recorded = report.get("seed")
    matches = is_seed(recorded) and (seed is None or recorded == seed)
    if ("seed" in report or seed is not None) and not matches:
        expected = "a seed (an integer)" if seed is None else f"{seed}, the seed of its run folder"
        raise CsekitError(f'{path}: "seed" is {str(recorded)[:40]!r}, not {expected}; {remove}')
    return {**report, **result.as_json()}


def from_old_layout(report: dict[str, Any]) -> dict[str, Any]:
    """A results.json of csekit before `averages` (top-level `avg`, `transfer_avg`; `avg_sts` among the tasks)
    in today's layout; a part that is not of that layout either is left for the check to name."""
    tasks = report.get("tasks", {})
    moved = {key: report[key] for key in AVERAGES if key in report}
    if isinstance(tasks, dict):
        moved.update({key: tasks[key] for key in AVERAGES if key in tasks})
        tasks = {key: value for key, value in tasks.items() if key not in AVERAGES}
    rest = {key: value for key, value in report.items() if key not in AVERAGES and key != "tasks"}
    return {**rest, "tasks": tasks, "averages": moved}


def _is_number(value: Any) -> bool:
    return is_finite_number(value)


def _in_range(label: str, value: float) -> bool:
    """Whether `value` is a score column `label` (or a metrics.jsonl dev key) can hold (`SCORE_RANGES`)."""
    low, high = SCORE_RANGES.get(label, (-1.0, 1.0))
    return low <= value <= high


def _range_text(label: str) -> str:
    low, high = SCORE_RANGES.get(label, (-1.0, 1.0))
    return f"[{low:g}, {high:g}]"


def dev_curves(output: Path, suite: Suite) -> dict[str, dict[str, list[tuple[int, float]]]]:
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
            if "step" not in record:
                raise CsekitError(f"{path}:{number}: an evaluation record (it has align) without a step")
            dev_keys = [k for k in ("stsb-dev", "sick-dev") if k in record]
            for key in [*dev_keys, "align", "uniform"]:
                value = record.get(key)
                if value is None:  # a score that was not a number
                    continue
                if not (_is_number(value) and _in_range(key, value)):
                    raise CsekitError(
                        f"{path}:{number}: {key} is {str(value)[:40]!r}, not a number in {_range_text(key)}"
                    )
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
    if not (np.abs(values) <= 1 + COSINE_SLACK).all():  # NaN and infinity fail too
        raise CsekitError(
            f"{path}: holds values that are no cosines (outside [-1, 1] or not finite); not a cosine "
            "sample written by csekit bench"
        )
    return values

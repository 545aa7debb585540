"""One evaluation's results, in one shape for every writer and reader.

`csekit evaluate --output`, bench's results.json and the model card's scores all hold the same two keys
(beside whatever facts each writer adds, such as the model or the seed)::

    {"tasks": {"STS12": {"all": ..., "mean": ..., "wmean": ...}, "stsb-dev": ..., "align": {...}},
     "averages": {"avg": ..., "avg_sts": ..., "transfer_avg": ...}}

Scores are fractions (Spearman in [-1, 1], accuracy in [0, 1]); a score that was not a number (a Spearman
correlation of constant embeddings) is null. An average is present only when all of its tasks ran.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from numbers import Real
from typing import Any

from csekit.core.errors import CsekitError
from csekit.core.numbers import is_finite_number
from csekit.evaluation.tasks import AVG_STS

STS_AVERAGE = "avg"
"""The papers' STS average over the seven headline numbers (STS12-16 `all`, STS-B and SICK-R `test`)."""
TRANSFER_AVERAGE = "transfer_avg"
"""The mean accuracy of the seven SentEval transfer tasks."""
AVERAGES = (STS_AVERAGE, AVG_STS, TRANSFER_AVERAGE)
"""The averages an evaluation reports, in the order they are written."""
ALIGN_TASK = "align"
ALIGN_SCORES = ("align", "uniform")
"""The `align` task's two numbers (Wang and Isola's alignment and uniformity), distances rather than scores."""
FACTS = ("pairs", "skipped", "queries", "documents", "ndev", "ntest", "C", "l2reg")
"""What a task's result records beside its scores: a file's counts, a transfer task's split sizes and the
regularisation its protocol chose. They are not in `EvalResult.metrics()`."""
MAX_DEPTH = 3
"""How deep a task's scores nest (STS12 -> all; MR -> acc): deeper is not what csekit writes."""

Score = float | None


@dataclass(frozen=True)
class EvalResult:
    """Per-task scores (a score, or a mapping of named scores) and the averages over them."""

    tasks: dict[str, Any] = field(default_factory=dict)
    averages: dict[str, Score] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        """The JSON layout: {"tasks": ..., "averages": ...} (non-finite scores become null when written)."""
        return {"tasks": dict(self.tasks), "averages": {k: self.averages[k] for k in AVERAGES if k in self.averages}}

    def report(self, facts: Mapping[str, Any]) -> dict[str, Any]:
        """The JSON document a command writes: its own facts (the model, the seed...) and then the result."""
        return {**facts, **self.as_json()}

    @classmethod
    def from_json(cls, report: Any, source: str) -> EvalResult:
        """The result in a report read back (`source` names it in the error); a report of another shape is one
        CsekitError saying what is wrong."""
        if not isinstance(report, dict):
            raise CsekitError(f"{source}: not a JSON object")
        tasks = report.get("tasks", {})
        if not isinstance(tasks, dict) or not all(_is_scores(value) for value in tasks.values()):
            raise CsekitError(f'{source}: "tasks" must map each task to a score or a mapping of scores')
        align = tasks.get(ALIGN_TASK)
        if align is not None and not (isinstance(align, dict) and set(ALIGN_SCORES) <= set(align)):
            raise CsekitError(f'{source}: "tasks.align" must give "align" and "uniform"')
        averages = report.get("averages", {})
        if not isinstance(averages, dict):
            raise CsekitError(f'{source}: "averages" must map {", ".join(AVERAGES)} to scores')
        for key, value in averages.items():
            if key not in AVERAGES or not _is_score(value):
                raise CsekitError(f'{source}: "averages" must map {", ".join(AVERAGES)} to scores, not {key!r}')
        return cls(dict(tasks), {key: _number(value) for key, value in averages.items()})

    @classmethod
    def from_flat(cls, scores: Mapping[str, Any]) -> EvalResult:
        """A result from one flat mapping of tasks and averages (the dev scores a training logs, the layout
        results.json had before the averages had a key of their own)."""
        return cls(
            {key: value for key, value in scores.items() if key not in AVERAGES},
            {key: scores[key] for key in AVERAGES if key in scores},
        )

    @classmethod
    def from_dev_scores(cls, scores: Mapping[str, Any]) -> EvalResult:
        """A result from the dev scores a training logs at an evaluation (metrics.jsonl's flat `stsb-dev`,
        `sick-dev`, `avg_sts`, `align`, `uniform`): alignment and uniformity become the `align` task, as
        `csekit evaluate --tasks align` gives it."""
        result = cls.from_flat({key: value for key, value in scores.items() if key not in ALIGN_SCORES})
        if set(ALIGN_SCORES) <= set(scores):
            result.tasks[ALIGN_TASK] = {key: scores[key] for key in ALIGN_SCORES}
        return result

    def flat(self) -> dict[str, Any]:
        """Tasks and averages in one mapping, as the printed tables and the training's metrics read them."""
        return {**self.tasks, **self.averages}

    def metrics(self) -> dict[str, Score]:
        """Every score under one flat key, the view `train.select_metric` names and a training logs (metrics.jsonl,
        the progress line): a task scored as one number by its name (`stsb-dev`), then the averages (`avg_sts`),
        then each named score as `TASK/score` (`pairs:NAME/spearman`, `STS12/all`; the align task's as `align` and
        `uniform`, see `metric_key`). `FACTS` stay out."""
        single = {name: value for name, value in self.tasks.items() if not isinstance(value, Mapping)}
        named = {
            metric_key(name, key): item
            for name, value in self.tasks.items()
            if isinstance(value, Mapping)
            for key, item in value.items()
            if key not in FACTS and _is_value(item)
        }
        return {**single, **self.averages, **named}

    def score(self, *path: str) -> float | None:
        """The number at `path` ("STS12", "all" or "avg"), from the tasks or the averages; None if absent."""
        value: Any = self.flat()
        for key in path:
            if not isinstance(value, dict) or key not in value:
                return None
            value = value[key]
        return _number(value) if _is_number(value) else None


def metric_key(task: str, score: str) -> str:
    """The key of a task's score in `EvalResult.metrics()`: `TASK/score`, the task's name for its one number (score
    ""), and `align` and `uniform` themselves for the align task (the keys SimCSE's logs and metrics.jsonl use)."""
    if not score:
        return task
    return score if task == ALIGN_TASK else f"{task}/{score}"


def _number(value: Any) -> float | None:
    return None if value is None else float(value)


def _is_number(value: Any) -> bool:
    return is_finite_number(value)


def _is_value(value: Any) -> bool:
    """A number as scoring gives it (NaN included: a Spearman correlation of constants), or null."""
    return value is None or (isinstance(value, Real) and not isinstance(value, bool))


def _is_score(value: Any) -> bool:
    """A finite number, or null (a score that was not a number, such as a Spearman correlation of constants)."""
    return value is None or _is_number(value)


def _is_scores(value: Any, depth: int = 0) -> bool:
    if isinstance(value, dict):
        return depth < MAX_DEPTH and all(isinstance(k, str) and _is_scores(v, depth + 1) for k, v in value.items())
    if isinstance(value, list):  # a transfer task's per-fold choices (its C or l2reg for each of the k folds)
        return depth > 0 and all(_is_score(item) for item in value)
    return _is_score(value)

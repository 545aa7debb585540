"""What a run scores at each evaluation and selects its checkpoint on: `train.dev_task` and `train.select_metric`.

`train.dev_task` is one entry or a list of them: SentEval's dev splits (`sts`: STS-B dev and SICK-R dev, giving
their mean `avg_sts` too; `stsb-dev`; `sick-dev`), `none`, and a user's own files as `csekit evaluate` reads
them: `pairs:PATH` (a scored pairs file, `--pairs`) and `retrieval:PATH` (a BEIR-layout folder, `--retrieval`,
its qrels/test.tsv). A relative PATH is read from the current folder, as a relative `data.corpus` is.

A file task gives its scores under the task's name as `csekit evaluate` names it, one flat key a score
(`pairs:NAME/spearman`, `pairs:NAME/pearson`, `retrieval:NAME/ndcg@10`, ...): metrics.jsonl, the progress line,
the trackers (`dev/tasks/pairs:NAME/spearman`) and the model card carry those keys, and `train.select_metric`
names one. The files are read when the recipe is loaded, so a bad file is one line (file and line) before
anything is trained, and read again when the run starts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from csekit.core.errors import CsekitError, did_you_mean
from csekit.evaluation.file_tasks import FILE_TASK_SCORES, ReadTask, split_file_entries
from csekit.evaluation.pairs import PairsFile, read_pairs, score_pairs
from csekit.evaluation.retrieval import evaluate_retrieval
from csekit.evaluation.retrieval_data import read_retrieval_set
from csekit.evaluation.tasks import AVG_STS, FILE_TASK_KINDS, TRAINING_DEV_TASKS, FileTask, file_tasks

Encoder = Callable[[list[str]], np.ndarray]

NO_DEV_TASK = "none"
RETRIEVAL_SPLIT = "test"
"""The qrels a `retrieval:` dev task reads (qrels/test.tsv, as `csekit evaluate --retrieval` by default)."""


@dataclass(frozen=True)
class DevTasks:
    """The SentEval dev splits a run scores and its file tasks (not read yet)."""

    splits: tuple[str, ...] = ()
    files: tuple[FileTask, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.splits or self.files)

    def metrics(self) -> tuple[str, ...]:
        """Every score an evaluation gives (what `train.select_metric` may name), splits first."""
        names = (*self.splits, AVG_STS) if len(self.splits) > 1 else self.splits  # evaluate_dev adds their mean
        return (*names, *(f"{task.name}/{score}" for task in self.files for score in FILE_TASK_SCORES[task.kind]))


def dev_task_entries(dev_task: Any) -> list[str]:
    """`train.dev_task` as a list of entries (one string, or a list of strings)."""
    entries = [dev_task] if isinstance(dev_task, str) else dev_task
    if not isinstance(entries, list) or not entries or not all(isinstance(entry, str) for entry in entries):
        raise CsekitError(f"must be a dev task or a list of them, not {dev_task!r}")
    return entries


def parse_dev_tasks(dev_task: Any) -> DevTasks:
    """The splits and file tasks `train.dev_task` names (no file is read here); one CsekitError naming a wrong one."""
    entries = dev_task_entries(dev_task)
    choices = [*TRAINING_DEV_TASKS, NO_DEV_TASK, *(f"{kind}:PATH" for kind in FILE_TASK_KINDS)]
    splits: list[str] = []
    others, paths = split_file_entries(entries)
    for entry in others:
        if entry in TRAINING_DEV_TASKS:
            splits += TRAINING_DEV_TASKS[entry]
        elif entry == NO_DEV_TASK and len(entries) == 1:
            return DevTasks()
        else:
            alone = " (none stands alone)" if entry == NO_DEV_TASK else ""
            raise CsekitError(
                f'unknown dev task "{entry}"{alone}{did_you_mean(entry, choices)}; choose {", ".join(choices)}'
            )
    files = [task for kind, kind_paths in paths.items() for task in file_tasks(kind, kind_paths, "train.dev_task")]
    return DevTasks(tuple(dict.fromkeys(splits)), tuple(files))


def read_dev_files(tasks: DevTasks) -> list[ReadTask]:
    """Each file task read and checked (a bad file: one CsekitError naming the file and line)."""
    return [
        ReadTask(
            task, read_pairs(task.path) if task.kind == "pairs" else read_retrieval_set(task.path, RETRIEVAL_SPLIT)
        )
        for task in tasks.files
    ]


def check_dev_selection(dev_task: Any, select_metric: str, patience: int | None, where: Any) -> None:
    """`dev_task` names known splits and readable files, `select_metric` is one of the scores they give, and
    `patience` has a dev task to count with; `where(key)` places an error in the recipe."""
    try:
        tasks = parse_dev_tasks(dev_task)
        read_dev_files(tasks)
    except CsekitError as error:
        raise CsekitError(f"{where('train.dev_task')}: recipe key train.dev_task: {error}") from None
    scores = tasks.metrics()
    if scores and select_metric not in scores:
        named = dev_task if isinstance(dev_task, str) else ", ".join(dev_task)
        raise CsekitError(
            f'{where("train.select_metric")}: recipe key train.select_metric: "{select_metric}" is not a '
            f"score of dev_task {named}{did_you_mean(select_metric, scores)}; choose {', '.join(scores)}"
        )
    if patience is not None and not scores:
        raise CsekitError(
            f"{where('train.patience')}: recipe key train.patience needs a dev task to count evaluations without "
            f"improvement (train.dev_task is {dev_task}); set train.dev_task or remove train.patience"
        )


def score_dev_files(encode: Encoder, files: Sequence[ReadTask]) -> dict[str, float]:
    """Each file task's scores as flat `KIND:NAME/score` keys (see the module's docstring)."""
    scores: dict[str, float] = {}
    for read in files:
        found = (
            score_pairs(encode, read.data)
            if isinstance(read.data, PairsFile)
            else evaluate_retrieval(encode, read.data)
        )
        scores.update({f"{read.task.name}/{key}": found[key] for key in FILE_TASK_SCORES[read.task.kind]})
    return scores

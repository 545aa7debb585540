"""What a run scores at each evaluation and selects its checkpoint on: `train.dev_task` and `train.select_metric`.

`train.dev_task` is one entry or a list of them: SentEval's dev splits (`sts`: STS-B dev and SICK-R dev, giving
their mean `avg_sts` too; `stsb-dev`; `sick-dev`), `none`, and a user's own files as `csekit evaluate` reads
them: `pairs:PATH` (a scored pairs file, `--pairs`) and `retrieval:PATH` (a BEIR-layout folder, `--retrieval`,
its qrels/test.tsv), or as mappings that say how to read them, `{pairs: PATH, columns: [q, d, score]}`
(`--pairs-columns`: names, or 1-based numbers for a file without a header) and `{retrieval: DIR, split: dev}`
(`--split`), parsed by the one reader of task lists (`csekit.evaluation.file_tasks.split_file_entries`). A relative
PATH is read from the current folder, and recorded absolute when the run starts (`csekit.training.recipe_paths`).

A file task gives its scores under the task's name as `csekit evaluate` names it, one flat key a score
(`pairs:NAME/spearman`, `pairs:NAME/pearson`, `retrieval:NAME/ndcg@10`, ...): metrics.jsonl, the progress line,
the trackers (`dev/tasks/pairs:NAME/spearman`) and the model card carry those keys, and `train.select_metric`
names one. The files are read when the recipe is loaded, so a bad file is one line (file and line) before
anything is trained, and read again when the run starts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import yaml

from csekit.core.errors import CsekitError, did_you_mean
from csekit.evaluation.file_tasks import FILE_TASK_SCORES, ReadTask, TaskEntryError, read_task, split_file_entries
from csekit.evaluation.pairs import PairsFile, score_pairs
from csekit.evaluation.retrieval import evaluate_retrieval
from csekit.evaluation.tasks import AVG_STS, FILE_TASK_KINDS, TRAINING_DEV_TASKS, FileTask

Encoder = Callable[[list[str]], np.ndarray]

NO_DEV_TASK = "none"


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


def dev_task_entries(dev_task: Any) -> list[Any]:
    """`train.dev_task` as a list of entries (one entry, or a list of them): names, `KIND:PATH` or mappings."""
    entries = dev_task if isinstance(dev_task, list) else [dev_task]
    if not entries or not isinstance(dev_task, str | Mapping | list):  # a wrong entry of a list: placed by its parser
        raise CsekitError(f"must be a dev task or a list of them, not {dev_task!r}")
    return entries


def dev_task_text(dev_task: Any) -> str:
    """`train.dev_task` for a message: its entries joined by commas, a mapping as YAML writes it in a line."""
    entries = dev_task if isinstance(dev_task, list) else [dev_task]
    return ", ".join(
        entry if isinstance(entry, str) else yaml.safe_dump(entry, default_flow_style=True, width=10**6).strip()
        for entry in entries
    )


def dev_task_names(dev_task: Any) -> str | list[str]:
    """`train.dev_task` as text, a file task's mapping as `KIND:PATH` (what a saved model's csekit.json records):
    one entry as one string, a list as a list."""
    names = []
    for entry in dev_task if isinstance(dev_task, list) else [dev_task]:
        kind = next((kind for kind in FILE_TASK_KINDS if isinstance(entry, Mapping) and kind in entry), None)
        names.append(f"{kind}:{entry[kind]}" if kind is not None else str(entry))
    return names if isinstance(dev_task, list) else names[0]


def parse_dev_tasks(dev_task: Any) -> DevTasks:
    """The splits and file tasks `train.dev_task` names (no file is read here); one CsekitError naming a wrong one
    (a `TaskEntryError` placing a wrong file entry)."""
    entries = dev_task_entries(dev_task)
    choices = [*TRAINING_DEV_TASKS, NO_DEV_TASK, *(f"{kind}:PATH" for kind in FILE_TASK_KINDS)]
    splits: list[str] = []
    others, files = split_file_entries(dev_task, given_by="train.dev_task")
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
    return DevTasks(tuple(dict.fromkeys(splits)), tuple(files))


def read_dev_files(tasks: DevTasks) -> list[ReadTask]:
    """Each file task read and checked (a bad file: one CsekitError naming the file and line)."""
    return [read_task(task) for task in tasks.files]


def check_dev_selection(dev_task: Any, select_metric: str, patience: int | None, where: Any) -> None:
    """`dev_task` names known splits and readable files, `select_metric` is one of the scores they give, and
    `patience` has a dev task to count with; `where(key)` places an error in the recipe."""
    key = "train.dev_task"
    try:
        tasks = parse_dev_tasks(dev_task)
        read_dev_files(tasks)
    except TaskEntryError as error:
        raise CsekitError(f"{where(key + error.key)}: recipe key {key}{error.key}: {error}") from None
    except CsekitError as error:
        raise CsekitError(f"{where(key)}: recipe key {key}: {error}") from None
    scores = tasks.metrics()
    named = dev_task_text(dev_task)
    if scores and select_metric not in scores:
        raise CsekitError(
            f'{where("train.select_metric")}: recipe key train.select_metric: "{select_metric}" is not a '
            f"score of dev_task {named}{did_you_mean(select_metric, scores)}; choose {', '.join(scores)}"
        )
    if patience is not None and not scores:
        raise CsekitError(
            f"{where('train.patience')}: recipe key train.patience needs a dev task to count evaluations without "
            f"improvement (train.dev_task is {named}); set train.dev_task or remove train.patience"
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

"""The tasks of a user's own files (`--pairs FILE`, `--retrieval DIR`): read them all before the model is loaded
(a bad file is one line at once, not after the model pass), then score each as one task of the `EvalResult`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from csekit.core.errors import CsekitError
from csekit.evaluation.pairs import PairsFile, parse_columns, read_pairs, score_pairs, skipped_lines
from csekit.evaluation.retrieval import METRICS, evaluate_retrieval
from csekit.evaluation.retrieval_data import RetrievalSet, read_retrieval_set
from csekit.evaluation.tasks import FILE_TASK_KINDS, FileTask, file_tasks

Encoder = Callable[[list[str]], np.ndarray]

FILE_TASK_SCORES = {"pairs": ("spearman", "pearson"), "retrieval": METRICS}
"""The scores of each kind of file task (its counts, `pairs`, `queries`..., are facts about the file, not scores):
what a training selects on (`KIND:NAME/score`) and what bench's tables show."""


def split_file_entries(entries: Sequence[str]) -> tuple[list[str], dict[str, list[Path]]]:
    """A list of task names where `pairs:PATH` and `retrieval:PATH` name a user's files (`train.dev_task`, a bench
    suite's `tasks`): the other entries, and the paths of each kind (a CsekitError for a kind without a path)."""
    others: list[str] = []
    paths: dict[str, list[Path]] = {kind: [] for kind in FILE_TASK_KINDS}
    for entry in entries:
        kind, colon, path = entry.partition(":")
        if not (colon and kind in FILE_TASK_KINDS):
            others.append(entry)
        elif not path.strip():
            raise CsekitError(f'"{entry}" names no file; give {kind}:PATH')
        else:
            paths[kind].append(Path(path.strip()).expanduser())
    return others, paths


@dataclass(frozen=True)
class ReadTask:
    """A file task and what was read from its file or folder."""

    task: FileTask
    data: PairsFile | RetrievalSet

    def sentences(self) -> list[str]:
        """The sentences of a pairs task (encoded with the run's other sentences); a corpus is encoded apart."""
        if isinstance(self.data, PairsFile):
            return [*self.data.sentences1, *self.data.sentences2]
        return []


def read_file_tasks(
    pairs: Sequence[Path] = (), columns: str | None = None, retrieval: Sequence[Path] = (), split: str = "test"
) -> list[ReadTask]:
    """Every `--pairs` file (its columns named by `--pairs-columns`) and `--retrieval` folder (qrels `split`)."""
    read: list[ReadTask] = []
    parsed = parse_columns(columns)
    read += [ReadTask(task, read_pairs(task.path, parsed)) for task in file_tasks("pairs", pairs)]
    read += [ReadTask(task, read_retrieval_set(task.path, split)) for task in file_tasks("retrieval", retrieval)]
    return read


def score_file_tasks(encode: Encoder, encode_raw: Encoder, tasks: Sequence[ReadTask]) -> dict[str, Any]:
    """Each task's scores by its name: pairs through `encode` (the run's cache, whitened when asked), a retrieval
    corpus through `encode_raw` a chunk at a time (never held in the cache)."""
    scores: dict[str, Any] = {}
    for read in tasks:
        if isinstance(read.data, PairsFile):
            scores[read.task.name] = score_pairs(encode, read.data)
        else:
            scores[read.task.name] = evaluate_retrieval(encode_raw, read.data)
    return scores


def skipped_report(tasks: Sequence[ReadTask]) -> dict[str, list[dict[str, Any]]]:
    """The lines each pairs file skipped (the first 100, with their reasons), for a report's facts."""
    return {
        read.task.name: skipped_lines(read.data.skipped)
        for read in tasks
        if isinstance(read.data, PairsFile) and read.data.skipped
    }

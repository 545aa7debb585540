"""Evaluation as task objects: every task read once, one model pass over the union of their sentences, each task
scored, the averages computed once; `csekit evaluate`, bench and the trainer's dev scoring all run a `TaskSet`.

A `Task` is one object of six kinds, each beside the code that scores it: an STS year or split and a dev split
(`csekit.evaluation.sts.StsTask`), alignment/uniformity on a dev split (`alignment.AlignTask`), a transfer task
(`transfer.TransferTask`), a pairs file and a retrieval folder (`file_tasks.PairsTask`, `file_tasks.RetrievalTask`).
As sentence-transformers' evaluators (`SentenceEvaluator`, `SequentialEvaluator`) and Tevatron's benchmarks, a
task is an object with a primary score; unlike them it scores through an encode function (sentences -> float32
rows), not a model, so a command, bench and the trainer's dev representation (`training/dev_scoring.py`) feed the
same tasks.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol

import numpy as np

from csekit.evaluation.cache import EmbeddingCache
from csekit.evaluation.post_whitening import whitened
from csekit.evaluation.result import STS_AVERAGE, TRANSFER_AVERAGE, EvalResult, metric_key
from csekit.evaluation.tasks import AVG_STS, DEV_SPLITS, TRANSFER_TASKS, table_columns

Encoder = Callable[[list[str]], np.ndarray]

KIND_ORDER = ("sts", "dev", "align", "transfer", "pairs", "retrieval")
"""The kinds of task, in the order a `--tasks` list and a user's files are run (and their sentences encoded)."""

AVERAGE_OF: Mapping[str, tuple[tuple[str, str | None], ...]] = MappingProxyType(
    {
        STS_AVERAGE: tuple((task, key) for _, task, key in table_columns("sts")),
        AVG_STS: tuple((task, None) for task in DEV_SPLITS),
        TRANSFER_AVERAGE: tuple((task, "acc") for task in TRANSFER_TASKS),
    }
)
"""Each average and the (task, score) it is the mean of (None: the task's one number): the papers' STS average of
the seven headline numbers, `avg_sts` of the two dev splits (SimCSE's and DCLR's `eval_avg_sts`), the transfer
average of the seven accuracies."""

SELECTABLE_AVERAGES = (AVG_STS,)
"""The averages a training may select its checkpoint on: of dev splits (the others average test sets)."""


class Task(Protocol):
    """One evaluation task. `TaskSet` reads it (once per `source`: tasks of one source share what was read), lists
    its sentences for the one model pass, and scores it; `name` is its key in the `EvalResult`."""

    @property
    def name(self) -> str: ...

    @property
    def kind(self) -> str:
        """One of `KIND_ORDER`."""
        ...

    @property
    def source(self) -> Hashable:
        """What `read` reads: two tasks of one source (a dev split and alignment on it) are read once."""
        ...

    @property
    def selectable(self) -> tuple[str, ...]:
        """Its keys in `EvalResult.metrics()` a training may select on (higher is better, not a test set)."""
        ...

    def read(self, data_dir: str | Path | None) -> Any:
        """Its data, read and checked (a bad file: one CsekitError naming the file and line)."""
        ...

    def sentences(self, data: Any) -> list[str]:
        """The sentences `score` encodes through the run's one model pass (none: it encodes apart, a corpus)."""
        ...

    def score(self, data: Any, encode: Encoder, encode_raw: Encoder) -> Any:
        """Its scores (a number, or a mapping of named scores) through `encode` (the run's shared, maybe whitened,
        embeddings) or `encode_raw` (the encoder itself, for what is never held in memory at once)."""
        ...

    def primary(self, data: Any) -> str:
        """The key of its primary score in its result ("" when the result is one number)."""
        ...


class TaskSet:
    """Tasks (two of one name are one task, the first kept), each read once, scored with one model pass over the
    union of their sentences; `run` returns their `EvalResult` with every average whose tasks all ran."""

    def __init__(self, tasks: Iterable[Task] = ()) -> None:
        named: dict[str, Task] = {}
        for task in tasks:
            named.setdefault(task.name, task)
        self.tasks: tuple[Task, ...] = tuple(named.values())
        self._data: dict[Hashable, Any] = {}

    def __iter__(self) -> Iterator[Task]:
        return iter(self.tasks)

    def __len__(self) -> int:
        return len(self.tasks)

    def of_kind(self, *kinds: str) -> tuple[Task, ...]:
        return tuple(task for task in self.tasks if task.kind in kinds)

    def names(self, *kinds: str) -> list[str]:
        """The names of its tasks of `kinds` (all of them when none is given), in order."""
        return [task.name for task in self.tasks if not kinds or task.kind in kinds]

    def joined(self, other: TaskSet) -> TaskSet:
        """This set's tasks, then `other`'s, with what either has read."""
        both = TaskSet([*self.tasks, *other.tasks])
        both._data = {**self._data, **other._data}
        return both

    def read(self, data_dir: str | Path | None = None) -> TaskSet:
        """Read every task not read yet, each source once (`data_dir`: SentEval's data folder; None: $CSEKIT_DATA,
        needed only by SentEval's tasks); returns the set."""
        for task in self.tasks:
            if task.source not in self._data:
                self._data[task.source] = task.read(data_dir)
        return self

    def data(self, task: Task) -> Any:
        """What `task` read (`read` first)."""
        if task.source not in self._data:
            raise ValueError(f"task {task.name} is not read yet: call TaskSet.read first")
        return self._data[task.source]

    def sentences(self) -> list[str]:
        """Every task's sentences, in task order (repeats kept: the cache encodes each once)."""
        return [sentence for task in self.tasks for sentence in task.sentences(self.data(task))]

    def run(
        self,
        encode: Encoder,
        data_dir: str | Path | None = None,
        whiten: bool = False,
        whiten_dim: int | None = None,
    ) -> EvalResult:
        """Read what is not read yet, encode the union of the sentences in one call, score each task in its own
        call (with `whiten`, each task's kernel comes from its own sentences, as Su et al.), then the averages."""
        self.read(data_dir)
        cache = EmbeddingCache(encode)
        cache.prefetch(self.sentences())
        shared = whitened(cache, whiten_dim) if whiten else cache
        scores = {task.name: task.score(self.data(task), shared, encode) for task in self.tasks}
        return EvalResult(scores, averages(scores))

    def primary_metrics(self) -> dict[str, str]:
        """Each task's primary score as its key in `EvalResult.metrics()` (the set read first)."""
        return {task.name: metric_key(task.name, task.primary(self.data(task))) for task in self.tasks}

    def selectable(self) -> tuple[str, ...]:
        """The keys of `EvalResult.metrics()` a training may select on, in that view's order: the tasks' one
        numbers, then the averages of dev splits, then named scores (`pairs:NAME/spearman`)."""
        keys = [key for task in self.tasks for key in task.selectable]
        given = [key for key in SELECTABLE_AVERAGES if all(task in self.names() for task, _ in AVERAGE_OF[key])]
        return (*(key for key in keys if "/" not in key), *given, *(key for key in keys if "/" in key))


def averages(scores: Mapping[str, Any]) -> dict[str, float]:
    """Each average of `AVERAGE_OF` whose scores are all there, in that order; the one place csekit averages
    tasks."""
    found: dict[str, float] = {}
    for average, parts in AVERAGE_OF.items():
        values = [_score_at(scores, task, key) for task, key in parts]
        if all(value is not None for value in values):
            found[average] = float(np.mean(values))
    return found


def _score_at(scores: Mapping[str, Any], task: str, key: str | None) -> Any:
    value = scores.get(task)
    if key is None or value is None:
        return value
    return value.get(key) if isinstance(value, Mapping) else None

"""The tasks of a user's own files (`--pairs FILE`, `--retrieval DIR`, `pairs:PATH` and `retrieval:PATH` in a task
list): parsed here, read before the model is loaded (a bad file is one line at once, not after the model pass),
then each scored as one task of a `TaskSet` (`PairsTask`, `RetrievalTask`), by `csekit evaluate`, bench and the
trainer's dev scoring alike."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar

import numpy as np

from csekit.core.errors import CsekitError, did_you_mean
from csekit.evaluation.pairs import DEFAULT_COLUMNS, PairsFile, parse_columns, read_pairs, score_pairs, skipped_lines
from csekit.evaluation.retrieval import METRICS, evaluate_retrieval
from csekit.evaluation.retrieval_data import RetrievalSet, check_split, read_retrieval_set
from csekit.evaluation.task_set import TaskSet
from csekit.evaluation.tasks import FILE_TASK_KINDS, FileTask, PairsColumns, file_task, file_tasks, unique_tasks

Encoder = Callable[[list[str]], np.ndarray]

FILE_TASK_SCORES = {"pairs": ("spearman", "pearson"), "retrieval": METRICS}
"""The scores of each kind of file task (its counts, `pairs`, `queries`..., are facts about the file, not scores):
what a training selects on (`KIND:NAME/score`) and what bench's tables show."""


ENTRY_OPTIONS: Mapping[str, str] = MappingProxyType({"pairs": "columns", "retrieval": "split"})
"""The option a file task's mapping entry may give beside its path, by kind: `{pairs: PATH, columns: [a, b, s]}`
(`--pairs-columns`), `{retrieval: DIR, split: dev}` (`--split`)."""


_MAPPINGS = "{pairs: PATH, columns: [sentence1, sentence2, score]} or {retrieval: DIR, split: test}"


class TaskEntryError(CsekitError):
    """A wrong entry of a task list; `key` places it: `[1]`, `[1].columns` (within the list as written), or ""."""

    def __init__(self, message: str, key: str = "") -> None:
        super().__init__(message)
        self.key = key


def split_file_entries(
    value: Any, base: Path | None = None, given_by: str | None = None
) -> tuple[list[str], list[FileTask]]:
    """A task list (`train.dev_task`, a bench suite's `tasks`: one entry or a list) where `pairs:PATH`,
    `retrieval:PATH` and the mappings of `ENTRY_OPTIONS` name a user's files: the other entries (names, as
    written), and the file tasks, pairs first (their names unique). A relative path is taken from `base` when
    given (a suite's folder), else as it is. A wrong entry is a `TaskEntryError` placing it in the list."""
    listed = isinstance(value, list)
    entries = value if listed else [value]
    others: list[str] = []
    tasks: list[FileTask] = []
    for index, entry in enumerate(entries):
        place = f"[{index}]" if listed else ""
        parsed = _file_entry(entry, place, base)
        if isinstance(parsed, FileTask):
            tasks.append(parsed)
        else:
            others.append(parsed)
    tasks.sort(key=lambda task: list(FILE_TASK_KINDS).index(task.kind))  # stable: pairs, then retrieval
    return others, unique_tasks(tasks, given_by)


def _file_entry(entry: Any, place: str, base: Path | None) -> str | FileTask:
    """One entry: a name (returned as it is), `KIND:PATH`, or a mapping `{KIND: PATH, OPTION: VALUE}`."""
    if isinstance(entry, str):
        kind, colon, path = entry.partition(":")
        if not (colon and kind in FILE_TASK_KINDS):
            return entry
        if not path.strip() or "\0" in path:
            raise TaskEntryError(f"{entry!r} names no file; give {kind}:PATH", place)
        return file_task(kind, _entry_path(path, base))
    if not isinstance(entry, Mapping):
        raise TaskEntryError(f"an entry is a task name, KIND:PATH or a mapping {_MAPPINGS}, not {entry!r}", place)
    keys = [*FILE_TASK_KINDS, *ENTRY_OPTIONS.values()]
    for key in entry:
        if key not in keys:
            named = f'"{key}"' if isinstance(key, str) else repr(key)
            raise TaskEntryError(
                f"unknown key {named}{did_you_mean(str(key), keys)}; a file task is {_MAPPINGS}", _key(place, key)
            )
    kinds = [kind for kind in FILE_TASK_KINDS if kind in entry]
    if len(kinds) != 1:
        raise TaskEntryError(f"a file task gives one of {' or '.join(FILE_TASK_KINDS)}: {_MAPPINGS}", place)
    kind = kinds[0]
    for option, option_kind in ((o, k) for k, o in ENTRY_OPTIONS.items()):
        if option in entry and option_kind != kind:
            raise TaskEntryError(f"{option} goes with {option_kind}, not {kind}: {_MAPPINGS}", _key(place, option))
    path = entry[kind]
    if not isinstance(path, str) or not path.strip() or "\0" in path:
        raise TaskEntryError(f"{kind} must be a path (text without NUL), not {path!r}", _key(place, kind))
    try:
        if kind == "pairs":
            columns = entry_columns(entry.get("columns"))
            return file_task(kind, _entry_path(path, base), columns=columns)
        split = entry.get("split", "test")
        if not isinstance(split, str) or not split:
            raise CsekitError(f"split must name a qrels file (text: dev for qrels/dev.tsv), not {split!r}")
        check_split(split, "split")
        return file_task(kind, _entry_path(path, base), split=split)
    except TaskEntryError:
        raise
    except CsekitError as error:
        raise TaskEntryError(str(error), _key(place, ENTRY_OPTIONS[kind])) from None


def _key(place: str, key: Any) -> str:
    return f"{place}.{key}"


def _entry_path(path: str, base: Path | None) -> Path:
    given = Path(path.strip()).expanduser()
    return given if base is None else base / given


def entry_columns(value: Any) -> PairsColumns | None:
    """A mapping entry's `columns`: a list of three names or 1-based numbers, or their comma text, read by the one
    rule of `--pairs-columns` (`parse_columns`); None (not given) is the default names."""
    if value is None:
        return None
    if isinstance(value, str):
        text = value
    elif isinstance(value, list) and all(  # each item one column: ["a,b", "score"] was read as three
        isinstance(item, str | int) and not isinstance(item, bool) and "," not in str(item) for item in value
    ):
        text = ",".join(str(item) for item in value)
    else:
        raise CsekitError(
            "columns must list three column names or 1-based numbers ([q, d, score], [1, 2, 3]; a name holds no "
            f"comma), not {value!r}"
        )
    return parse_columns(text, "columns")


@dataclass(frozen=True)
class _UserFileTask:
    """What a pairs file's task and a retrieval folder's share: named by the user's entry, their scores and primary
    score (the first) from FILE_TASK_SCORES by kind."""

    kind: ClassVar[str]
    file: FileTask

    @property
    def name(self) -> str:
        return self.file.name

    @property
    def selectable(self) -> tuple[str, ...]:
        return tuple(f"{self.name}/{score}" for score in FILE_TASK_SCORES[self.kind])

    def primary(self, data: Any) -> str:
        return FILE_TASK_SCORES[self.kind][0]


@dataclass(frozen=True)
class PairsTask(_UserFileTask):
    """A pairs file (`--pairs`, `pairs:PATH`): Spearman (its primary score) and Pearson of the cosines against its
    gold scores, with the pairs scored and the lines skipped."""

    kind: ClassVar[str] = "pairs"

    @property
    def source(self) -> Hashable:
        return ("pairs", self.file.path, self.file.columns)

    def read(self, data_dir: str | Path | None) -> PairsFile:
        return read_pairs(self.file.path, self.file.columns or DEFAULT_COLUMNS)

    def sentences(self, data: PairsFile) -> list[str]:
        return [*data.sentences1, *data.sentences2]

    def score(self, data: PairsFile, encode: Encoder, encode_raw: Encoder) -> dict[str, float]:
        return score_pairs(encode, data)


@dataclass(frozen=True)
class RetrievalTask(_UserFileTask):
    """A BEIR-layout folder (`--retrieval`, `retrieval:PATH`) and its qrels split: exact cosine search, nDCG@10
    (its primary score), MRR@10, Recall@10 and @100, the queries and documents counted. Its corpus is encoded
    through the encoder itself a chunk at a time, never held in the run's embeddings."""

    kind: ClassVar[str] = "retrieval"

    @property
    def source(self) -> Hashable:
        return ("retrieval", self.file.path, self.file.split)

    def read(self, data_dir: str | Path | None) -> RetrievalSet:
        return read_retrieval_set(self.file.path, self.file.split)

    def sentences(self, data: RetrievalSet) -> list[str]:
        return []

    def score(self, data: RetrievalSet, encode: Encoder, encode_raw: Encoder) -> dict[str, float]:
        return evaluate_retrieval(encode_raw, data)


def file_task_set(tasks: Sequence[FileTask]) -> TaskSet:
    """The tasks of a user's files (not read yet), in the order given."""
    return TaskSet(PairsTask(task) if task.kind == "pairs" else RetrievalTask(task) for task in tasks)


def read_file_tasks(
    pairs: Sequence[Path] = (), columns: str | None = None, retrieval: Sequence[Path] = (), split: str = "test"
) -> TaskSet:
    """Every `--pairs` file (its columns named by `--pairs-columns`) and `--retrieval` folder (qrels `split`), read
    and checked now (a bad file is one line before the model loads)."""
    parsed = parse_columns(columns)
    tasks = [*file_tasks("pairs", pairs, columns=parsed), *file_tasks("retrieval", retrieval, split=split)]
    return file_task_set(tasks).read()


def skipped_report(tasks: TaskSet) -> dict[str, list[dict[str, Any]]]:
    """The lines each pairs file skipped (the first 100, with their reasons), for a report's facts."""
    return {
        task.name: skipped_lines(tasks.data(task).skipped)
        for task in tasks.of_kind("pairs")
        if tasks.data(task).skipped
    }


def file_paths(tasks: TaskSet) -> dict[str, Path]:
    """The file or folder of each file task, by its name."""
    return {task.name: task.file.path for task in tasks if isinstance(task, _UserFileTask)}

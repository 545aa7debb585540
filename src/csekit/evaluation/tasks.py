"""The evaluation tasks, one table: SentEval's STS and transfer tasks and the dev splits used in training.

Every list of tasks (what `--tasks sts` means, what the STS average covers, what `train.dev_task`
evaluates) is read from here through `csekit.evaluation.tasks.EVAL_TASKS`. `StsSubset`, what an STS or
dev task gives (a registered task's `load` returns them), lives here too, so the readers in
`csekit.evaluation.sts_data` build on this module and not the other way round.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from csekit.core.errors import CsekitError, did_you_mean
from csekit.core.registry import Registry


@dataclass(frozen=True)
class StsSubset:
    """One scored set of sentence pairs; sentences are whitespace-normalised as SentEval does."""

    name: str
    sentences1: list[str]
    sentences2: list[str]
    scores: list[float]

    def __len__(self) -> int:
        return len(self.scores)


@dataclass(frozen=True)
class EvalTask:
    """One task: `group` sts (reported, averaged), dev (model selection) or transfer (a classifier on frozen vectors).

    `folder` is the task's folder in the data folder and `split` the STS-B/SICK split it scores; a task a
    user registers (group sts or dev) gives `load`, which reads its scored subsets from the data folder.
    """

    name: str
    group: str
    folder: str
    split: str | None = None
    label: str | None = None  # the column in the papers' tables, when it differs from the name
    load: Callable[[Path], list[StsSubset]] | None = None


_TASKS = (
    *(EvalTask(year, "sts", year) for year in ("STS12", "STS13", "STS14", "STS15", "STS16")),
    EvalTask("STSBenchmark", "sts", "STSBenchmark", "test", label="STS-B"),
    EvalTask("SICKRelatedness", "sts", "SICK", "test", label="SICK-R"),
    EvalTask("stsb-dev", "dev", "STSBenchmark", "dev"),
    EvalTask("sick-dev", "dev", "SICK", "dev"),
    *(EvalTask(name, "transfer", name) for name in ("MR", "CR", "SUBJ", "MPQA")),
    EvalTask("SST2", "transfer", "SST2", label="SST"),
    *(EvalTask(name, "transfer", name) for name in ("TREC", "MRPC")),
)
BUILTIN: Mapping[str, EvalTask] = MappingProxyType({task.name: task for task in _TASKS})
"""The papers' tasks, in their tables' order; see `EVAL_TASKS`."""

EVAL_TASKS: Registry[EvalTask] = Registry("task", BUILTIN, "evaluation task")
"""`csekit evaluate --tasks` and the training dev task: the SentEval tasks and the dev splits."""

HEADLINE_STS = tuple(task.name for task in _TASKS if task.group == "sts")
"""The seven STS numbers the papers average (registered STS tasks are reported, not averaged)."""
DEV_SPLITS = tuple(task.name for task in _TASKS if task.group == "dev")
TRANSFER_TASKS = tuple(task.name for task in _TASKS if task.group == "transfer")
TRANSFER_CLASSIFIERS = ("sklearn", "pytorch")
"""SentEval's two transfer protocols: scikit-learn's logistic regression (`usepytorch: False`) or its PyTorch one
(`csekit.evaluation.transfer_pytorch`; the papers' transfer numbers)."""
"""SentEval's seven transfer tasks (their average is the papers' transfer average)."""


def table_columns(group: str) -> tuple[tuple[str, str, str], ...]:
    """The papers' table of a built-in group: (column label, task, result key) in their order.

    STS12-16 report SentEval's `all`, STS-B and SICK-R their `test` split, transfer tasks `acc`.
    """
    key = {"sts": lambda task: "all" if task.split is None else "test", "transfer": lambda task: "acc"}[group]
    return tuple((task.label or task.name, task.name, key(task)) for task in _TASKS if task.group == group)


AVG_STS = "avg_sts"
"""The mean of STS-B dev and SICK-R dev: SimCSE's and DCLR's `eval_avg_sts`, a model-selection metric."""

TRAINING_DEV_TASKS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {"sts": ("stsb-dev", "sick-dev"), "stsb-dev": ("stsb-dev",), "sick-dev": ("sick-dev",)}
)
"""`train.dev_task` -> the dev splits evaluated at each evaluation (`sts`: both, giving `avg_sts` too)."""


FILE_TASK_KINDS: Mapping[str, str] = MappingProxyType(
    {"pairs": "a file of scored sentence pairs (--pairs)", "retrieval": "a BEIR-layout retrieval folder (--retrieval)"}
)
"""The tasks a user's own files give, beside the table above: each file (or folder) is one task, `KIND:NAME`."""


PairsColumns = tuple[str, str, str] | tuple[int, int, int]
"""The columns a pairs file is read from: three header names, or three 1-based numbers (a file without a header)."""


@dataclass(frozen=True)
class FileTask:
    """One task read from a user's file or folder; `name` (`pairs:NAME`, `retrieval:NAME`) names it in results.

    `columns` (pairs; None: sentence1, sentence2, score) and `split` (retrieval: qrels/SPLIT.tsv) say how it is
    read, as `--pairs-columns` and `--split` do; they never change its name."""

    kind: str
    path: Path
    name: str
    columns: PairsColumns | None = None
    split: str = "test"


def file_task(kind: str, path: Path, columns: PairsColumns | None = None, split: str = "test") -> FileTask:
    """The task of one file (named after it without the suffix) or folder (named after it)."""
    stem = path.stem if kind == "pairs" else path.resolve().name
    return FileTask(kind, path, f"{kind}:{stem}", columns, split)


def unique_tasks(tasks: Sequence[FileTask], given_by: str | None = None) -> list[FileTask]:
    """The tasks, two of one name refused (`given_by` names where the paths were given: `--KIND` by default)."""
    named: dict[str, FileTask] = {}
    for task in tasks:
        if task.name in named:
            given = given_by or f"--{task.kind}"
            raise CsekitError(
                f"{given} {named[task.name].path} and {task.path} would both be task {task.name}; rename one"
            )
        named[task.name] = task
    return list(named.values())


def file_tasks(
    kind: str,
    paths: Sequence[Path],
    given_by: str | None = None,
    columns: PairsColumns | None = None,
    split: str = "test",
) -> list[FileTask]:
    """Each path one task (see `file_task`), all read alike; two of one name are refused (see `unique_tasks`)."""
    return unique_tasks([file_task(kind, path, columns, split) for path in paths], given_by)


def tasks_of(*groups: str) -> tuple[str, ...]:
    """The names of every task of these groups, built-in then registered."""
    return tuple(name for name in EVAL_TASKS.names() if EVAL_TASKS.get(name).group in groups)


def check_task(name: str, groups: tuple[str, ...], what: str) -> EvalTask:
    """The task `name` of one of `groups`, or one line naming the choices (`what`: "STS task", ...)."""
    if name in EVAL_TASKS and EVAL_TASKS.get(name).group in groups:  # a known name: no list of every task to make
        return EVAL_TASKS.get(name)
    allowed = tasks_of(*groups)
    if name not in allowed:
        raise CsekitError(f'unknown {what} "{name}"{did_you_mean(name, allowed)}; choose from {", ".join(allowed)}')
    return EVAL_TASKS.get(name)

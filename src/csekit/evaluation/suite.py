"""The SentEval tasks a `--tasks` list (or a bench suite's `tasks`) names, as one `TaskSet`, and how their numbers
were computed; shared by `csekit evaluate` and `csekit bench`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from csekit.core.errors import CsekitError, did_you_mean
from csekit.evaluation.alignment import AlignTask
from csekit.evaluation.sts import DEV_TASKS, STS_TASKS, StsTask, sts_task
from csekit.evaluation.task_set import KIND_ORDER, TaskSet
from csekit.evaluation.tasks import EVAL_TASKS
from csekit.evaluation.transfer import TRANSFER_TASKS, TransferTask

if TYPE_CHECKING:
    from csekit.encoding.representation import Representation

TASK_GROUPS = ("all", "sts", "dev", "transfer", "align")
"""The words of `--tasks` that name several tasks (`all`: sts, transfer and align)."""


def parse_tasks(tasks: str, classifier: str = "sklearn", n_jobs: int | None = 1) -> TaskSet:
    """--tasks (comma-separated groups and task names) as STS tasks, dev splits, alignment/uniformity and transfer
    tasks, in that order, each once; the transfer tasks run SentEval's `classifier` protocol, `n_jobs` fits at
    once."""
    named: list[StsTask | AlignTask | TransferTask] = []
    for name in (t.strip() for t in tasks.split(",") if t.strip()):
        named += _named(name, classifier, n_jobs)
    if not named:
        raise CsekitError(f'--tasks "{tasks}": no task given; choose sts, dev, transfer, align, all or task names')
    return TaskSet(sorted(named, key=lambda task: KIND_ORDER.index(task.kind)))  # stable: as named within a kind


def _named(name: str, classifier: str, n_jobs: int | None) -> list[StsTask | AlignTask | TransferTask]:
    """The tasks one word of --tasks names: a group, or one task by name (a registered one too)."""
    if name in TASK_GROUPS:
        transfer = TRANSFER_TASKS if name in ("all", "transfer") else ()
        return [
            *(sts_task(task) for task in (STS_TASKS if name in ("all", "sts") else ())),
            *(sts_task(task) for task in (DEV_TASKS if name == "dev" else ())),
            *(TransferTask(task, classifier, n_jobs) for task in transfer),
            *([AlignTask()] if name in ("all", "align") else []),
        ]
    if name in EVAL_TASKS:
        group = EVAL_TASKS.get(name).group
        return [TransferTask(name, classifier, n_jobs) if group == "transfer" else sts_task(name)]
    choices = [*TASK_GROUPS, *EVAL_TASKS.names()]
    raise CsekitError(f'--tasks: unknown task "{name}"{did_you_mean(name, choices)}; choose from {choices}')


def transfer_classifier(tasks: TaskSet) -> str | None:
    """SentEval's classifier protocol the set's transfer tasks run (None: it has none)."""
    transfer = [task for task in tasks if isinstance(task, TransferTask)]
    return transfer[0].classifier if transfer else None


def protocol_facts(representation: Representation, tasks: TaskSet) -> dict[str, Any]:
    """How an evaluation's numbers were computed, for its report: how the encoder's representation wrote and tokenised
    the text (`Representation.report_facts`: the sentence-end rule, the test template, PromptEOL's demonstration where
    there is one) and, when transfer tasks ran, SentEval's classifier protocol."""
    facts = representation.report_facts()
    classifier = transfer_classifier(tasks)
    if classifier is not None:
        facts["transfer_classifier"] = classifier
    return facts

"""What a run scores at each evaluation and selects its checkpoint on: `train.dev_task` and `train.select_metric`.

`train.dev_task` is one entry or a list of them: SentEval's dev splits (`sts`: STS-B dev and SICK-R dev, giving
their mean `avg_sts` too; `stsb-dev`; `sick-dev`), `none`, and a user's own files as `csekit evaluate` reads
them: `pairs:PATH` (a scored pairs file, `--pairs`) and `retrieval:PATH` (a BEIR-layout folder, `--retrieval`,
its qrels/test.tsv), or as mappings that say how to read them, `{pairs: PATH, columns: [q, d, score]}`
(`--pairs-columns`: names, or 1-based numbers for a file without a header) and `{retrieval: DIR, split: dev}`
(`--split`), parsed by the one reader of task lists (`csekit.evaluation.file_tasks.split_file_entries`). A relative
PATH is read from the current folder, and recorded absolute when the run starts (`csekit.training.recipe_paths`).

The tasks are one `TaskSet` (`dev_task_set`), scored at each evaluation as `csekit evaluate` scores them; a run
logs the flat view of its result (`EvalResult.metrics()`): a split's Spearman by its name (`stsb-dev`), `avg_sts`,
`align` and `uniform`, and a file task's scores under the task's name as `csekit evaluate` names it, one flat key a
score (`pairs:NAME/spearman`, `pairs:NAME/pearson`, `retrieval:NAME/ndcg@10`, ...): metrics.jsonl, the progress
line, the trackers (`dev/tasks/pairs:NAME/spearman`) and the model card carry those keys, and
`train.select_metric` names one of them (`TaskSet.selectable`). The files are read when the recipe is loaded, so a
bad file is one line (file and line) before anything is trained, and read again when the run starts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from csekit.core.errors import CsekitError, did_you_mean
from csekit.evaluation.file_tasks import TaskEntryError, file_task_set, split_file_entries
from csekit.evaluation.sts import dev_tasks
from csekit.evaluation.task_set import TaskSet
from csekit.evaluation.tasks import FILE_TASK_KINDS, TRAINING_DEV_TASKS

NO_DEV_TASK = "none"


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


def dev_task_set(dev_task: Any) -> TaskSet:
    """The tasks `train.dev_task` names, not read yet: the dev splits, with alignment and uniformity on the first,
    then the file tasks; no task for `none`. One CsekitError naming a wrong entry (a `TaskEntryError` placing a
    wrong file entry)."""
    entries = dev_task_entries(dev_task)
    choices = [*TRAINING_DEV_TASKS, NO_DEV_TASK, *(f"{kind}:PATH" for kind in FILE_TASK_KINDS)]
    splits: list[str] = []
    others, files = split_file_entries(dev_task, given_by="train.dev_task")
    for entry in others:
        if entry in TRAINING_DEV_TASKS:
            splits += TRAINING_DEV_TASKS[entry]
        elif entry == NO_DEV_TASK and len(entries) == 1:
            return TaskSet()
        else:
            alone = " (none stands alone)" if entry == NO_DEV_TASK else ""
            raise CsekitError(
                f'unknown dev task "{entry}"{alone}{did_you_mean(entry, choices)}; choose {", ".join(choices)}'
            )
    return TaskSet(dev_tasks(list(dict.fromkeys(splits)), align_uniform=True)).joined(file_task_set(files))


def check_dev_selection(dev_task: Any, select_metric: str, patience: int | None, where: Any) -> None:
    """`dev_task` names known splits and readable files, `select_metric` is one of the scores they give, and
    `patience` has a dev task to count with; `where(key)` places an error in the recipe."""
    key = "train.dev_task"
    try:
        tasks = dev_task_set(dev_task)
        TaskSet(tasks.of_kind(*FILE_TASK_KINDS)).read()  # the files, now; the splits need the run's data folder
    except TaskEntryError as error:
        raise CsekitError(f"{where(key + error.key)}: recipe key {key}{error.key}: {error}") from None
    except CsekitError as error:
        raise CsekitError(f"{where(key)}: recipe key {key}: {error}") from None
    scores = tasks.selectable()
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

"""Evaluation of frozen sentence embeddings with the papers' (SentEval) protocol.

The names below load on first use: importing any `csekit.evaluation` module (the command line's option checks,
a pairs file read) does not import scipy and the STS code with it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from csekit.evaluation.result import EvalResult
    from csekit.evaluation.sts import DEV_TASKS, STS_TASKS, evaluate_dev, evaluate_sts, format_sts_table
    from csekit.evaluation.sts_data import load_sts_task
    from csekit.evaluation.task_set import Task, TaskSet
    from csekit.evaluation.tasks import StsSubset

_PUBLIC = {
    "DEV_TASKS": "csekit.evaluation.sts",
    "STS_TASKS": "csekit.evaluation.sts",
    "EvalResult": "csekit.evaluation.result",
    "StsSubset": "csekit.evaluation.tasks",
    "Task": "csekit.evaluation.task_set",
    "TaskSet": "csekit.evaluation.task_set",
    "evaluate_dev": "csekit.evaluation.sts",
    "evaluate_sts": "csekit.evaluation.sts",
    "format_sts_table": "csekit.evaluation.sts",
    "load_sts_task": "csekit.evaluation.sts_data",
}

__all__ = [
    "DEV_TASKS",
    "STS_TASKS",
    "EvalResult",
    "StsSubset",
    "Task",
    "TaskSet",
    "evaluate_dev",
    "evaluate_sts",
    "format_sts_table",
    "load_sts_task",
]


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'csekit.evaluation' has no attribute {name!r}")

"""Evaluation of frozen sentence embeddings with the papers' (SentEval) protocol."""

from csekit.evaluation.result import EvalResult
from csekit.evaluation.sts import DEV_TASKS, STS_TASKS, evaluate_dev, evaluate_sts, format_sts_table
from csekit.evaluation.sts_data import load_sts_task
from csekit.evaluation.tasks import StsSubset

__all__ = [
    "DEV_TASKS",
    "STS_TASKS",
    "EvalResult",
    "StsSubset",
    "evaluate_dev",
    "evaluate_sts",
    "format_sts_table",
    "load_sts_task",
]

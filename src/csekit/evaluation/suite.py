"""One evaluation run over several task groups (STS, dev, transfer, alignment/uniformity), one model pass.

Shared by `csekit evaluate` and `csekit bench`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from csekit.core.errors import CsekitError, did_you_mean
from csekit.evaluation.alignment import evaluate_align_uniform
from csekit.evaluation.cache import EmbeddingCache
from csekit.evaluation.file_tasks import ReadTask, score_file_tasks
from csekit.evaluation.post_whitening import whitened
from csekit.evaluation.result import STS_AVERAGE, TRANSFER_AVERAGE, EvalResult
from csekit.evaluation.sts import DEV_TASKS, STS_TASKS, dev_average, evaluate_dev, evaluate_sts, sts_average
from csekit.evaluation.sts_data import load_sts_task
from csekit.evaluation.tasks import AVG_STS, EVAL_TASKS
from csekit.evaluation.transfer import (
    TRANSFER_TASKS,
    check_classifier,
    evaluate_transfer,
    load_transfer_task,
    transfer_average,
)


def parse_tasks(tasks: str) -> dict[str, list[str]]:
    """Split --tasks into STS tasks, dev tasks, transfer tasks and the alignment/uniformity task."""
    groups: dict[str, list[str]] = {"sts": [], "dev": [], "transfer": [], "align": []}
    for name in (t.strip() for t in tasks.split(",") if t.strip()):
        if name == "all":
            groups["sts"] += STS_TASKS
            groups["transfer"] += TRANSFER_TASKS
            groups["align"].append("align")
        elif name == "sts":
            groups["sts"] += STS_TASKS
        elif name == "dev":
            groups["dev"] += DEV_TASKS
        elif name == "transfer":
            groups["transfer"] += TRANSFER_TASKS
        elif name == "align":
            groups["align"].append("align")
        elif name in EVAL_TASKS:  # one task by name, a registered one too
            groups[EVAL_TASKS.get(name).group].append(name)
        else:
            choices = ["all", "sts", "dev", "transfer", "align", *EVAL_TASKS.names()]
            raise CsekitError(f'--tasks: unknown task "{name}"{did_you_mean(name, choices)}; choose from {choices}')
    if not any(groups.values()):
        raise CsekitError(f'--tasks "{tasks}": no task given; choose sts, dev, transfer, align, all or task names')
    return {key: list(dict.fromkeys(names)) for key, names in groups.items()}


def run_evaluation(
    encode_raw: Callable[[list[str]], np.ndarray],
    root: Path | None,
    groups: dict[str, list[str]],
    whiten: bool = False,
    whiten_dim: int | None = None,
    n_jobs: int | None = 1,
    files: Sequence[ReadTask] = (),
    classifier: str = "sklearn",
) -> EvalResult:
    """Run the requested evaluations with one model pass over all their distinct sentences.

    Each task is scored in its own call, so that with whitening every task's kernel comes from that
    task's own sentences (Su et al.); the cache keeps the model pass shared. `files` are the user's own tasks
    (`--pairs`, `--retrieval`; `root`, the SentEval data folder, may then be None when no SentEval task runs).
    Returns the tasks' results and the averages whose tasks all ran: `avg`, `avg_sts` (the two dev splits'
    mean), `transfer_avg`. `classifier`: SentEval's transfer protocol, sklearn or pytorch.
    """
    check_classifier(classifier)
    cache = EmbeddingCache(encode_raw)
    sentences: list[str] = []
    for name in [*groups["sts"], *groups["dev"], *(["stsb-dev"] if groups["align"] else [])]:
        for sub in load_sts_task(root, name):
            sentences += sub.sentences1 + sub.sentences2
    for name in groups["transfer"]:
        sentences += load_transfer_task(root, name).sentences()
    for read in files:
        sentences += read.sentences()
    cache.prefetch(sentences)
    encode = whitened(cache, whiten_dim) if whiten else cache

    tasks: dict = {}
    for name in groups["sts"]:
        tasks.update(EvalResult.from_flat(evaluate_sts(encode, root, [name])).tasks)
    for name in groups["dev"]:
        tasks.update(EvalResult.from_flat(evaluate_dev(encode, root, name)).tasks)
    for name in groups["transfer"]:
        tasks.update(EvalResult.from_flat(evaluate_transfer(encode, root, [name], n_jobs, classifier=classifier)).tasks)
    if groups["align"]:
        tasks["align"] = evaluate_align_uniform(encode, root, "stsb-dev")
    tasks.update(score_file_tasks(encode, encode_raw, files))
    averages = {
        STS_AVERAGE: sts_average(tasks),
        AVG_STS: dev_average(tasks),
        TRANSFER_AVERAGE: transfer_average(tasks),
    }
    return EvalResult(tasks, {key: value for key, value in averages.items() if value is not None})


def protocol_facts(
    sentence_end: str,
    groups: dict[str, list[str]],
    classifier: str,
    test_template: str = "none",
    demonstration: dict[str, str] | None = None,
) -> dict[str, Any]:
    """How an evaluation's numbers were computed, for its report: the sentence-end rule the encoder applied
    (`csekit.encoding.sentence_end`), the test template it tokenised whole (`csekit.encoding.whole_template`;
    none: the training ids), PromptEOL's demonstration where there is one (`csekit.encoding.prompteol`) and, when
    transfer tasks ran, SentEval's classifier protocol."""
    facts: dict[str, Any] = {"sentence_end": sentence_end, "test_template": test_template}
    if demonstration is not None:
        facts["demonstration"] = dict(demonstration)
    if groups["transfer"]:
        facts["transfer_classifier"] = classifier
    return facts

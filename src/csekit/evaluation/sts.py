"""SentEval-exact semantic textual similarity (STS) evaluation, with one encoder call.

The readers reproduce SentEval's parsing (``senteval/sts.py``; STS-B and SICK-R as in SimCSE's
fork, which scores cosine on the test split without training), so the numbers match the papers.
Scoring differs only in speed: all sentences of all requested tasks are deduplicated and encoded
once (`csekit.evaluation.task_set.TaskSet`), instead of per batch and per split. Pair order does not matter
for Spearman, so SentEval's length sorting is not reproduced.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from csekit.evaluation.alignment import AlignTask
from csekit.evaluation.sts_data import load_sts_task
from csekit.evaluation.table import score_table
from csekit.evaluation.task_set import TaskSet
from csekit.evaluation.tasks import DEV_SPLITS, HEADLINE_STS, StsSubset, check_task, table_columns

Encoder = Callable[[list[str]], np.ndarray]

STS_TASKS = HEADLINE_STS
DEV_TASKS = DEV_SPLITS
_TABLE_COLUMNS = table_columns("sts")


# --- scoring ---------------------------------------------------------------------------------------


def _encode_all(encode: Encoder, subsets: Iterable[StsSubset]) -> tuple[dict[str, int], np.ndarray]:
    """Encode every distinct sentence once; return the row of each sentence and the embeddings."""
    index: dict[str, int] = {}
    for sub in subsets:
        for sentence in (*sub.sentences1, *sub.sentences2):
            index.setdefault(sentence, len(index))
    emb = np.asarray(encode(list(index)), dtype=np.float32)
    if emb.ndim != 2 or emb.shape[0] != len(index):
        raise ValueError(f"encode returned shape {emb.shape} for {len(index)} sentences; expected one row each")
    return index, emb


def _cosine(index: dict[str, int], emb: np.ndarray, sub: StsSubset) -> np.ndarray:
    """Per-pair float32 cosine; NaN (zero or NaN vectors) becomes 0 as in SentEval's similarity."""
    u = np.nan_to_num(emb[[index[s] for s in sub.sentences1]])
    v = np.nan_to_num(emb[[index[s] for s in sub.sentences2]])
    with np.errstate(divide="ignore", invalid="ignore"):
        cos = np.einsum("ij,ij->i", u, v) / (np.linalg.norm(u, axis=1) * np.linalg.norm(v, axis=1))
    return np.nan_to_num(cos)


def _spearman(sys_scores: np.ndarray, gold: Sequence[float]) -> float:
    from scipy.stats import spearmanr  # here: a training run without dev tasks never pays scipy.stats' import

    return float(spearmanr(sys_scores, np.asarray(gold, dtype=np.float64))[0])


def _score_year(index: dict[str, int], emb: np.ndarray, subsets: list[StsSubset]) -> dict[str, float]:
    """SimCSE's SentEval aggregation: `all` over concatenated pairs, plain and pair-weighted means."""
    sims = [_cosine(index, emb, sub) for sub in subsets]
    per_subset = np.array([_spearman(s, sub.scores) for s, sub in zip(sims, subsets, strict=True)])
    weights = np.array([len(sub) for sub in subsets], dtype=np.float64)
    everything = _spearman(np.concatenate(sims), [y for sub in subsets for y in sub.scores])
    return {
        "all": everything,
        "mean": float(np.average(per_subset)),
        "wmean": float(np.average(per_subset, weights=weights)),
    }


@dataclass(frozen=True)
class StsTask:
    """An STS task of `EVAL_TASKS`, kind sts or dev: a year (STS12-16: SentEval's `all`, `mean` and `wmean` over its
    subsets), a test split (STS-B, SICK-R: `test`), a dev split (stsb-dev, sick-dev: one Spearman, for model
    selection; its first subset) or a registered task (scored as a year when it gives several subsets)."""

    name: str
    kind: str

    @property
    def source(self) -> Hashable:
        return ("sts", self.name)

    @property
    def selectable(self) -> tuple[str, ...]:
        return (self.name,) if self.kind == "dev" else ()

    def read(self, data_dir: str | Path | None) -> list[StsSubset]:
        return load_sts_task(data_dir, self.name)

    def sentences(self, data: list[StsSubset]) -> list[str]:
        return [sentence for sub in self._scored(data) for sentence in (*sub.sentences1, *sub.sentences2)]

    def score(self, data: list[StsSubset], encode: Encoder, encode_raw: Encoder) -> float | dict[str, float]:
        """Spearman x (in [-1, 1]) of the cosine similarities; `encode` is called once, on the distinct sentences."""
        subsets = self._scored(data)
        index, emb = _encode_all(encode, subsets)
        if self.kind == "dev":
            (dev,) = subsets
            return _spearman(_cosine(index, emb, dev), dev.scores)
        if len(subsets) > 1:  # STS12-16: SentEval's per-year aggregation
            return _score_year(index, emb, subsets)
        (test,) = subsets
        return {"test": _spearman(_cosine(index, emb, test), test.scores)}

    def primary(self, data: list[StsSubset]) -> str:
        return "" if self.kind == "dev" else "all" if len(data) > 1 else "test"

    def _scored(self, data: list[StsSubset]) -> list[StsSubset]:
        return data[:1] if self.kind == "dev" else data


def sts_task(name: str, kinds: tuple[str, ...] = ("sts", "dev")) -> StsTask:
    """The task `name` of `kinds`, or one line naming the choices."""
    return StsTask(name, check_task(name, kinds, "STS task").group)


def dev_tasks(names: Sequence[str], align_uniform: bool = False) -> list[StsTask | AlignTask]:
    """The dev splits `names` and, with `align_uniform`, alignment and uniformity on the first (for model
    selection during training: SimCSE's STS-B dev, SICK trial)."""
    tasks: list[StsTask | AlignTask] = [sts_task(name, ("dev",)) for name in names]
    return [*tasks, AlignTask(names[0])] if align_uniform and names else tasks


def evaluate_sts(encode: Encoder, data_dir: str | Path | None, tasks: Sequence[str] = STS_TASKS) -> dict:
    """Spearman x (in [-1, 1]) of cosine similarity for each task, plus `avg` of the seven headline numbers.

    Returns {"STS12": {"all", "mean", "wmean"}, ..., "STSBenchmark": {"test"}, "SICKRelatedness":
    {"test"}, "avg"}; `encode` is called once, on the deduplicated sentences of all tasks.
    """
    names = (tasks,) if isinstance(tasks, str) else tasks
    task_set = TaskSet([sts_task(name, ("sts",)) for name in names])
    return task_set.run(encode, data_dir).flat()


def evaluate_dev(
    encode: Encoder,
    data_dir: str | Path | None,
    task: str | Sequence[str] = "stsb-dev",
    align_uniform: bool = False,
) -> dict[str, float | None]:
    """Spearman on development splits (STS-B dev, SICK trial), for model selection during training.

    `task` is one dev task or several; with both, `avg_sts` (their mean) is added, as SimCSE's and
    DCLR's code report it. All splits are encoded in one call. With `align_uniform`, the same
    embeddings also give `align` and `uniform` (on the first split).
    """
    names = [task] if isinstance(task, str) else list(task)
    return TaskSet(dev_tasks(names, align_uniform)).run(encode, data_dir).metrics()


def format_sts_table(results: dict) -> str:
    """The papers' STS table: Spearman x 100 with two decimals; '-' where a task was not run."""
    heads = [label for label, _, _ in _TABLE_COLUMNS] + ["Avg."]
    values = [results.get(task, {}).get(key) for _, task, key in _TABLE_COLUMNS] + [results.get("avg")]
    return score_table(heads, values)

"""SentEval-exact semantic textual similarity (STS) evaluation, with one encoder call.

The readers reproduce SentEval's parsing (``senteval/sts.py``; STS-B and SICK-R as in SimCSE's
fork, which scores cosine on the test split without training), so the numbers match the papers.
Scoring differs only in speed: all sentences of all requested tasks are deduplicated and encoded
once, instead of per batch and per split. Pair order does not matter for Spearman, so SentEval's
length sorting is not reproduced.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np

from csekit.data.data_dir import resolve_data_dir
from csekit.evaluation.alignment import align_uniform_from_embeddings
from csekit.evaluation.sts_data import load_sts_task
from csekit.evaluation.table import score_table
from csekit.evaluation.tasks import AVG_STS, DEV_SPLITS, HEADLINE_STS, StsSubset, check_task, table_columns

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


def evaluate_sts(encode: Encoder, data_dir: str | Path | None, tasks: Sequence[str] = STS_TASKS) -> dict:
    """Spearman x (in [-1, 1]) of cosine similarity for each task, plus `avg` of the seven headline numbers.

    Returns {"STS12": {"all", "mean", "wmean"}, ..., "STSBenchmark": {"test"}, "SICKRelatedness":
    {"test"}, "avg"}; `encode` is called once, on the deduplicated sentences of all tasks.
    """
    if isinstance(tasks, str):
        tasks = (tasks,)
    for name in tasks:
        check_task(name, ("sts",), "STS task")
    root = resolve_data_dir(data_dir)
    loaded = {name: load_sts_task(root, name) for name in dict.fromkeys(tasks)}
    index, emb = _encode_all(encode, (sub for subs in loaded.values() for sub in subs))

    results: dict = {}
    for name, subsets in loaded.items():
        if len(subsets) > 1:  # STS12-16: SentEval's per-year aggregation
            results[name] = _score_year(index, emb, subsets)
        else:
            (test,) = subsets
            results[name] = {"test": _spearman(_cosine(index, emb, test), test.scores)}
    average = sts_average(results)
    if average is not None:
        results["avg"] = average
    return results


def sts_average(results: dict) -> float | None:
    """The papers' STS average over the seven headline numbers, or None when one is missing."""
    headline = [results.get(task, {}).get(key) for _, task, key in _TABLE_COLUMNS]
    return float(np.mean(headline)) if all(x is not None for x in headline) else None


def dev_average(results: dict) -> float | None:
    """`avg_sts`: the mean of STS-B dev and SICK-R dev, or None when one is missing."""
    return float(np.mean([results[name] for name in DEV_TASKS])) if set(DEV_TASKS) <= set(results) else None


def evaluate_dev(
    encode: Encoder,
    data_dir: str | Path | None,
    task: str | Sequence[str] = "stsb-dev",
    align_uniform: bool = False,
) -> dict[str, float]:
    """Spearman on development splits (STS-B dev, SICK trial), for model selection during training.

    `task` is one dev task or several; with both, `avg_sts` (their mean) is added, as SimCSE's and
    DCLR's code report it. All splits are encoded in one call. With `align_uniform`, the same
    embeddings also give `align` and `uniform` (on STS-B dev when it is evaluated).
    """
    tasks = [task] if isinstance(task, str) else list(task)
    for name in tasks:
        check_task(name, ("dev",), "STS task")
    devs = [load_sts_task(data_dir, name)[0] for name in tasks]
    index, emb = _encode_all(encode, devs)
    scores = {name: _spearman(_cosine(index, emb, dev), dev.scores) for name, dev in zip(tasks, devs, strict=True)}
    average = dev_average(scores)
    if average is not None:
        scores[AVG_STS] = average
    if align_uniform:
        scores.update(align_uniform_from_embeddings(index, emb, devs[0]))
    return scores


def format_sts_table(results: dict) -> str:
    """The papers' STS table: Spearman x 100 with two decimals; '-' where a task was not run."""
    heads = [label for label, _, _ in _TABLE_COLUMNS] + ["Avg."]
    values = [results.get(task, {}).get(key) for _, task, key in _TABLE_COLUMNS] + [results.get("avg")]
    return score_table(heads, values)

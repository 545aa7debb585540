"""SentEval-exact semantic textual similarity (STS) evaluation, with one encoder call.

The readers reproduce SentEval's parsing (``senteval/sts.py``; STS-B and SICK-R as in SimCSE's
fork, which scores cosine on the test split without training), so the numbers match the papers.
Scoring differs only in speed: all sentences of all requested tasks are deduplicated and encoded
once, instead of per batch and per split. Pair order does not matter for Spearman, so SentEval's
length sorting is not reproduced.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

from csekit.data_dir import STS_SUBSETS, find_task_dir, resolve_data_dir
from csekit.errors import CsekitError, at, did_you_mean
from csekit.evaluation.files import read_text, universal_lines
from csekit.evaluation.table import score_table

Encoder = Callable[[list[str]], np.ndarray]

STS_TASKS = ("STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark", "SICKRelatedness")
DEV_TASKS = ("stsb-dev", "sick-dev")
AVG_STS = "avg_sts"
"""The mean of STS-B dev and SICK-R dev: SimCSE's and DCLR's `eval_avg_sts`, a model-selection metric."""
DEV_SCORES = (*DEV_TASKS, AVG_STS)
TRAINING_DEV_TASKS = {"sts": DEV_TASKS, "stsb-dev": ("stsb-dev",), "sick-dev": ("sick-dev",)}
"""`train.dev_task` -> the dev splits evaluated at each evaluation (`sts`: both, giving `avg_sts` too)."""


def dev_scores(dev_task: str) -> tuple[str, ...]:
    """The scores a training run's dev evaluation gives for `train.dev_task` (what `select_metric` may name)."""
    tasks = TRAINING_DEV_TASKS.get(dev_task, ())
    return (*tasks, AVG_STS) if len(tasks) > 1 else tasks


_STSB_FILES = {"train": "sts-train.csv", "dev": "sts-dev.csv", "test": "sts-test.csv"}
_SICK_FILES = {"train": "SICK_train.txt", "dev": "SICK_trial.txt", "test": "SICK_test_annotated.txt"}
# Task name -> (data folder, split) for the pair tasks; STS12-16 are listed in STS_SUBSETS.
_PAIR_TASKS = {
    "STSBenchmark": ("STSBenchmark", "test"),
    "SICKRelatedness": ("SICK", "test"),
    "stsb-dev": ("STSBenchmark", "dev"),
    "sick-dev": ("SICK", "dev"),
}
_TABLE_COLUMNS = (
    ("STS12", "STS12", "all"),
    ("STS13", "STS13", "all"),
    ("STS14", "STS14", "all"),
    ("STS15", "STS15", "all"),
    ("STS16", "STS16", "all"),
    ("STS-B", "STSBenchmark", "test"),
    ("SICK-R", "SICKRelatedness", "test"),
)


@dataclass(frozen=True)
class StsSubset:
    """One scored set of sentence pairs; sentences are whitespace-normalised as SentEval does."""

    name: str
    sentences1: list[str]
    sentences2: list[str]
    scores: list[float]

    def __len__(self) -> int:
        return len(self.scores)


# --- reading ---------------------------------------------------------------------------------------


def _gold(path: Path, line: int, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise CsekitError(f"{at(path, line)}: gold score {raw.strip()[:40]!r} is not a number") from None
    if not np.isfinite(value):
        raise CsekitError(f"{at(path, line)}: gold score {raw.strip()!r} is not a finite number")
    return value


def _check_scorable(path: Path, scores: Sequence[float]) -> None:
    """Spearman's correlation needs two pairs with different gold scores; otherwise it is NaN, not a score."""
    if len(scores) == 0:
        raise CsekitError(f"{path}: no scored sentence pairs (an empty or truncated file?)")
    if len(set(scores)) < 2:
        raise CsekitError(
            f"{path}: {len(scores)} scored pair(s), all with gold score {scores[0]}; "
            "a correlation needs at least two different gold scores"
        )


def _norm(sentence: str) -> str:
    """SentEval splits on whitespace and the batcher re-joins with single spaces."""
    return " ".join(sentence.split())


def _read_sts_subset(folder: Path, subset: str) -> StsSubset:
    """Read STS.input/STS.gs like SentEval's STSEval.loadFile; pairs with an empty gold line are skipped."""
    input_path = folder / f"STS.input.{subset}.txt"
    gs_path = folder / f"STS.gs.{subset}.txt"
    # str.splitlines, not file iteration: SentEval uses .read().splitlines() for these files.
    inputs = read_text(input_path).splitlines()
    golds = read_text(gs_path).splitlines()
    if len(inputs) != len(golds):
        raise CsekitError(
            f"{at(gs_path, min(len(inputs), len(golds)) + 1)}: {gs_path.name} has {len(golds)} lines "
            f"but {input_path.name} has {len(inputs)}; they must pair up line by line"
        )
    s1: list[str] = []
    s2: list[str] = []
    scores: list[float] = []
    for i, (pair, raw) in enumerate(zip(inputs, golds, strict=True), start=1):
        fields = pair.split("\t")
        if len(fields) != 2:
            raise CsekitError(f"{at(input_path, i)}: expected 2 tab-separated sentences, found {len(fields)} fields")
        if raw == "":
            continue  # unscored pair (STS15, STS16)
        scores.append(_gold(gs_path, i, raw))
        s1.append(_norm(fields[0]))
        s2.append(_norm(fields[1]))
    _check_scorable(gs_path, scores)
    return StsSubset(subset, s1, s2, scores)


def _read_pair_file(path: Path, header: bool, cols: tuple[int, int, int]) -> list[tuple[str, str, float]]:
    """Read STS-B / SICK rows as SimCSE's SentEval does: `line.strip().split('\\t')`, fields by index."""
    out = []
    need = max(cols) + 1
    for i, line in enumerate(universal_lines(read_text(path)), start=1):
        if header and i == 1:
            continue
        fields = line.strip().split("\t")
        if len(fields) < need:
            raise CsekitError(f"{at(path, i)}: expected at least {need} tab-separated fields, found {len(fields)}")
        a, b, y = cols
        out.append((_norm(fields[a]), _norm(fields[b]), _gold(path, i, fields[y])))
    _check_scorable(path, [row[2] for row in out])
    return out


def _read_split(data_dir: Path, folder: str, split: str) -> StsSubset:
    task_dir = find_task_dir(data_dir, folder)
    if folder == "STSBenchmark":
        rows = _read_pair_file(task_dir / _STSB_FILES[split], header=False, cols=(5, 6, 4))
    else:
        rows = _read_pair_file(task_dir / _SICK_FILES[split], header=True, cols=(1, 2, 3))
    return StsSubset(split, [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows])


def _check_name(name: str, allowed: Sequence[str]) -> None:
    if name not in allowed:
        raise CsekitError(f'unknown STS task "{name}"{did_you_mean(name, allowed)}; choose from {", ".join(allowed)}')


def load_sts_task(data_dir: str | Path | None, name: str) -> list[StsSubset]:
    """Load the scored subsets of one task: STS12-16 subsets, or the one split STS-B/SICK-R report.

    STSBenchmark and SICKRelatedness give their `test` split, stsb-dev and sick-dev their `dev`
    split (SICK's trial file). `data_dir=None` falls back to $CSEKIT_DATA.
    """
    _check_name(name, (*STS_TASKS, *DEV_TASKS))
    root = resolve_data_dir(data_dir)
    if name in STS_SUBSETS:
        folder = find_task_dir(root, name)
        return [_read_sts_subset(folder, subset) for subset in STS_SUBSETS[name]]
    folder_name, split = _PAIR_TASKS[name]
    return [_read_split(root, folder_name, split)]


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
        _check_name(name, STS_TASKS)
    root = resolve_data_dir(data_dir)
    loaded = {name: load_sts_task(root, name) for name in dict.fromkeys(tasks)}
    index, emb = _encode_all(encode, (sub for subs in loaded.values() for sub in subs))

    results: dict = {}
    for name, subsets in loaded.items():
        if name in STS_SUBSETS:
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
        _check_name(name, DEV_TASKS)
    devs = [load_sts_task(data_dir, name)[0] for name in tasks]
    index, emb = _encode_all(encode, devs)
    scores = {name: _spearman(_cosine(index, emb, dev), dev.scores) for name, dev in zip(tasks, devs, strict=True)}
    if set(DEV_TASKS) <= set(scores):
        scores[AVG_STS] = float(np.mean([scores[name] for name in DEV_TASKS]))
    if align_uniform:
        from csekit.evaluation.alignment import align_uniform_from_embeddings

        scores.update(align_uniform_from_embeddings(index, emb, devs[0]))
    return scores


def format_sts_table(results: dict) -> str:
    """The papers' STS table: Spearman x 100 with two decimals; '-' where a task was not run."""
    heads = [label for label, _, _ in _TABLE_COLUMNS] + ["Avg."]
    values = [results.get(task, {}).get(key) for _, task, key in _TABLE_COLUMNS] + [results.get("avg")]
    return score_table(heads, values)

"""SentEval's transfer tasks (MR, CR, SUBJ, MPQA, SST-2, TREC, MRPC): logistic regression on frozen embeddings.

The readers and the classifier protocol reproduce SentEval's scikit-learn mode (``senteval/binary.py``,
``sst.py``, ``trec.py``, ``mrpc.py``, ``tools/validation.py``) so that accuracies match the papers':

* files are decoded as SentEval does (latin-1 for MR/CR/SUBJ/MPQA/TREC, UTF-8 for SST-2 and MRPC),
  each sentence split on whitespace and re-joined with single spaces (SimCSE's batcher);
* samples are put in SentEval's order (sorted by token count, then label; stable), because the
  shuffled StratifiedKFold splits depend on the order of the rows;
* accuracies are rounded the way SentEval rounds them (per fold, x100, 2 decimals).

Only the encoding differs: every distinct sentence of every requested task is encoded in one call
(`csekit.evaluation.task_set.TaskSet`).
The ``acc`` values returned are fractions (SentEval's percentage / 100), like the STS scores.

`classifier="pytorch"` runs SentEval's PyTorch protocol instead (`csekit.evaluation.transfer_pytorch`: Adam,
the L2 grid 1e-5..1e-2, early stopping), the one the papers' transfer numbers were computed with.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from joblib import Parallel, delayed
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import f1_score
from sklearn.model_selection import StratifiedKFold

from csekit.core.errors import CsekitError, at, did_you_mean
from csekit.data.data_dir import find_task_dir, resolve_data_dir
from csekit.evaluation import transfer_pytorch
from csekit.evaluation.files import read_text, universal_lines
from csekit.evaluation.table import score_table
from csekit.evaluation.task_set import TaskSet
from csekit.evaluation.tasks import TRANSFER_CLASSIFIERS, TRANSFER_TASKS, table_columns

Encoder = Callable[[list[str]], np.ndarray]

SEED = 1111
KFOLD = 10
# Regularisation grids of SentEval's scikit-learn mode.
C_INNER = tuple(2.0**t for t in range(-2, 4))  # MR, CR, SUBJ, MPQA (inner CV) and SST-2 (dev)
C_KFOLD = tuple(2.0**t for t in range(-1, 6))  # TREC, MRPC
_TABLE_COLUMNS = table_columns("transfer")

# Binary tasks: (file with label 1, file with label 0), as SentEval's constructors pass them.
_BINARY_FILES = {
    "MR": ("rt-polarity.pos", "rt-polarity.neg"),
    "CR": ("custrev.pos", "custrev.neg"),
    "SUBJ": ("subj.objective", "subj.subjective"),
    "MPQA": ("mpqa.pos", "mpqa.neg"),
}
_TREC_CLASSES = {"ABBR": 0, "DESC": 1, "ENTY": 2, "HUM": 3, "LOC": 4, "NUM": 5}


@dataclass(frozen=True)
class TransferSplit:
    """Labelled sentences (or sentence pairs, for MRPC) in SentEval's sorted order."""

    sentences: list[str]
    labels: np.ndarray
    sentences2: list[str] | None = None

    def __len__(self) -> int:
        return len(self.labels)

    def all_sentences(self) -> list[str]:
        return self.sentences + (self.sentences2 or [])


@dataclass(frozen=True)
class TransferData:
    """One task's data: `all` (cross-validated binary tasks), `train`/`test` (TREC, MRPC) or `train`/`dev`/`test`
    (SST-2)."""

    name: str
    splits: dict[str, TransferSplit] = field(default_factory=dict)

    def sentences(self) -> list[str]:
        return [s for split in self.splits.values() for s in split.all_sentences()]


# --- reading ---------------------------------------------------------------------------------------


def _join(tokens: list[str]) -> str:
    """SentEval gives the batcher token lists; SimCSE's batcher joins them with single spaces."""
    return " ".join(tokens)


def _sorted_split(sentences: list[str], labels: list[int], sentences2: list[str] | None = None) -> TransferSplit:
    """Order rows as SentEval does before encoding: by token count (of each sentence), then label; stable."""
    if sentences2 is None:
        order = sorted(range(len(labels)), key=lambda i: (len(sentences[i].split()), labels[i]))
    else:
        pair = sentences2
        order = sorted(range(len(labels)), key=lambda i: (len(sentences[i].split()), len(pair[i].split()), labels[i]))
    return TransferSplit(
        [sentences[i] for i in order],
        np.asarray([labels[i] for i in order], dtype=np.int64),
        None if sentences2 is None else [sentences2[i] for i in order],
    )


def _read_binary_file(path: Path) -> list[str]:
    """SentEval's BinaryClassifierEval.loadFile: latin-1, `.read().splitlines()`, empty lines kept."""
    return [_join(line.split()) for line in read_text(path, "latin-1").splitlines()]


def read_binary(folder: Path, name: str) -> TransferData:
    pos_file, neg_file = _BINARY_FILES[name]
    pos = _read_binary_file(folder / pos_file)
    neg = _read_binary_file(folder / neg_file)
    return TransferData(name, {"all": _sorted_split(pos + neg, [1] * len(pos) + [0] * len(neg))})


def read_sst_file(path: Path) -> tuple[list[str], list[int]]:
    """SentEval's SSTEval.loadFile (binary): UTF-8, `sentence<TAB>label` per line."""
    sentences, labels = [], []
    for i, line in enumerate(universal_lines(read_text(path, "utf-8")), start=1):
        fields = line.strip().split("\t")
        if len(fields) < 2:
            raise CsekitError(f"{at(path, i)}: expected `sentence<TAB>label`, found no tab")
        try:
            label = int(fields[1])
        except ValueError:
            raise CsekitError(f"{at(path, i)}: label {fields[1][:20]!r} is not 0 or 1") from None
        if label not in (0, 1):
            raise CsekitError(f"{at(path, i)}: label {label} is not 0 or 1")
        sentences.append(_join(fields[0].split()))
        labels.append(label)
    return sentences, labels


def read_trec_file(path: Path) -> tuple[list[str], list[int]]:
    """SentEval's TRECEval.loadFile: latin-1, `COARSE:fine question`; the fine label is dropped."""
    sentences, labels = [], []
    for i, line in enumerate(universal_lines(read_text(path, "latin-1")), start=1):
        target, colon, sample = line.strip().partition(":")
        parts = sample.split(" ", 1)
        if not colon or len(parts) < 2:
            raise CsekitError(f"{at(path, i)}: expected `COARSE:fine question`, found {line.strip()[:40]!r}")
        if target not in _TREC_CLASSES:
            raise CsekitError(
                f"{at(path, i)}: unknown TREC class {target[:20]!r}{did_you_mean(target, _TREC_CLASSES)}; "
                f"expected one of {', '.join(_TREC_CLASSES)}"
            )
        sentences.append(_join(parts[1].split()))
        labels.append(_TREC_CLASSES[target])
    return sentences, labels


def read_mrpc_file(path: Path) -> tuple[list[str], list[str], list[int]]:
    """SentEval's MRPCEval.loadFile: UTF-8 (the BOM sits in the dropped header), fields 0, 3 and 4."""
    first, second, labels = [], [], []
    for i, line in enumerate(universal_lines(read_text(path, "utf-8")), start=1):
        if i == 1:
            continue  # header: Quality, #1 ID, #2 ID, #1 String, #2 String
        fields = line.strip().split("\t")
        if len(fields) < 5:
            raise CsekitError(f"{at(path, i)}: expected 5 tab-separated fields, found {len(fields)}")
        if fields[0] not in ("0", "1"):
            raise CsekitError(f"{at(path, i)}: label {fields[0][:20]!r} is not 0 or 1")
        first.append(_join(fields[3].split()))
        second.append(_join(fields[4].split()))
        labels.append(int(fields[0]))
    return first, second, labels


def _check_name(name: str) -> None:
    if name not in TRANSFER_TASKS:
        choices = ", ".join(TRANSFER_TASKS)
        raise CsekitError(f'unknown transfer task "{name}"{did_you_mean(name, TRANSFER_TASKS)}; choose from {choices}')


def load_transfer_task(data_dir: str | Path | None, name: str) -> TransferData:
    """Read one transfer task from `data_dir` (csekit's `transfer/NAME` or SentEval's layout)."""
    _check_name(name)
    folder = find_task_dir(resolve_data_dir(data_dir), name)
    if name in _BINARY_FILES:
        return read_binary(folder, name)
    if name == "SST2":
        splits = {
            split: _sorted_split(*read_sst_file(folder / f"sentiment-{split}")) for split in ("train", "dev", "test")
        }
        return TransferData(name, splits)
    if name == "TREC":
        train = _sorted_split(*read_trec_file(folder / "train_5500.label"))
        test = _sorted_split(*read_trec_file(folder / "TREC_10.label"))
        return TransferData(name, {"train": train, "test": test})
    splits = {}
    for split in ("train", "test"):
        a, b, y = read_mrpc_file(folder / f"msr_paraphrase_{split}.txt")
        splits[split] = _sorted_split(a, y, b)
    return TransferData(name, splits)


# --- classifiers (SentEval's InnerKFoldClassifier, KFoldClassifier, SplitClassifier) -------------


def _fit(c: float, x_train: np.ndarray, y_train: np.ndarray) -> LogisticRegression:
    """The one classifier of the protocol; lbfgs may stop at its 100-iteration default as in SentEval."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return LogisticRegression(C=c, random_state=SEED).fit(x_train, y_train)


def _fit_score(c: float, x: np.ndarray, y: np.ndarray, train: np.ndarray, test: np.ndarray) -> float:
    return float(_fit(c, x[train], y[train]).score(x[test], y[test]))


def _pick(cs: Sequence[float], scores: list[float]) -> tuple[float, float]:
    """SentEval's choice: the first C with the highest score (scores already rounded)."""
    best = int(np.argmax(scores))
    return cs[best], scores[best]


def inner_kfold(x: np.ndarray, y: np.ndarray, n_jobs: int | None = 1, k: int = KFOLD) -> dict:
    """MR/CR/SUBJ/MPQA: k outer folds; in each, inner k-fold CV picks C; mean test accuracy over folds.

    `k` is SentEval's `params.kfold` (10 in the papers' setting; smaller only to make tests fast).
    """
    outer = list(StratifiedKFold(n_splits=k, shuffle=True, random_state=SEED).split(x, y))
    inner_cv = StratifiedKFold(n_splits=k, shuffle=True, random_state=SEED)
    jobs = []
    for fold, (train, _) in enumerate(outer):
        inner = list(inner_cv.split(x[train], y[train]))
        for j, c in enumerate(C_INNER):
            jobs += [(fold, j, c, train[a], train[b]) for a, b in inner]
    scores = Parallel(n_jobs=n_jobs)(delayed(_fit_score)(c, x, y, a, b) for _, _, c, a, b in jobs)
    per_c = np.zeros((k, len(C_INNER), k))
    counts = np.zeros((k, len(C_INNER)), dtype=int)
    for (fold, j, *_), score in zip(jobs, scores, strict=True):
        per_c[fold, j, counts[fold, j]] = score
        counts[fold, j] += 1
    chosen = [
        _pick(C_INNER, [round(100 * float(np.mean(per_c[f, j])), 2) for j in range(len(C_INNER))]) for f in range(k)
    ]
    tests = Parallel(n_jobs=n_jobs)(
        delayed(_fit_score)(c, x, y, train, test) for (c, _), (train, test) in zip(chosen, outer, strict=True)
    )
    test_acc = [round(100 * t, 2) for t in tests]
    return {
        "acc": round(float(np.mean(test_acc)), 2) / 100,
        "devacc": round(float(np.mean([d for _, d in chosen])), 2) / 100,
        "C": [c for c, _ in chosen],
    }


def kfold(
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_test: np.ndarray,
    y_test: np.ndarray,
    n_jobs: int | None = 1,
    k: int = KFOLD,
) -> tuple[dict, np.ndarray]:
    """TREC/MRPC: k-fold CV on train picks C; refit on all of train; accuracy on test (and predictions)."""
    folds = list(StratifiedKFold(n_splits=k, shuffle=True, random_state=SEED).split(x_train, y_train))
    scores = Parallel(n_jobs=n_jobs)(delayed(_fit_score)(c, x_train, y_train, a, b) for c in C_KFOLD for a, b in folds)
    grid = np.asarray(scores).reshape(len(C_KFOLD), k)
    c, dev = _pick(C_KFOLD, [round(100 * float(np.mean(row)), 2) for row in grid])
    clf = _fit(c, x_train, y_train)
    predicted = clf.predict(x_test)
    return {"acc": round(100 * float(clf.score(x_test, y_test)), 2) / 100, "devacc": dev / 100, "C": c}, predicted


def split_classifier(x: dict[str, np.ndarray], y: dict[str, np.ndarray], n_jobs: int | None = 1) -> dict:
    """SST-2: C chosen by dev accuracy among fits on train; refit on train; accuracy on test."""
    models = Parallel(n_jobs=n_jobs)(delayed(_fit)(c, x["train"], y["train"]) for c in C_INNER)
    c, dev = _pick(C_INNER, [round(100 * float(m.score(x["dev"], y["dev"])), 2) for m in models])
    clf = models[C_INNER.index(c)]  # the refit with the chosen C is the same deterministic fit
    return {"acc": round(100 * float(clf.score(x["test"], y["test"])), 2) / 100, "devacc": dev / 100, "C": c}


# --- evaluation ------------------------------------------------------------------------------------


def _encode_all(encode: Encoder, tasks: Sequence[TransferData]) -> tuple[dict[str, int], np.ndarray]:
    index: dict[str, int] = {}
    for task in tasks:
        for sentence in task.sentences():
            index.setdefault(sentence, len(index))
    emb = np.asarray(encode(list(index)), dtype=np.float32)
    if emb.ndim != 2 or emb.shape[0] != len(index):
        raise ValueError(f"encode returned shape {emb.shape} for {len(index)} sentences; expected one row each")
    return index, emb


def _rows(index: dict[str, int], emb: np.ndarray, sentences: list[str]) -> np.ndarray:
    return emb[[index[s] for s in sentences]]


def check_classifier(classifier: str) -> None:
    if classifier not in TRANSFER_CLASSIFIERS:
        raise CsekitError(f"transfer classifier must be one of {', '.join(TRANSFER_CLASSIFIERS)}, found {classifier!r}")


def run_transfer_task(
    task: TransferData,
    index: dict[str, int],
    emb: np.ndarray,
    n_jobs: int | None = 1,
    k: int = KFOLD,
    classifier: str = "sklearn",
) -> dict:
    """Classify one loaded task from precomputed embeddings with SentEval's `classifier` protocol; returns acc,
    devacc, the chosen C (sklearn) or l2reg (pytorch), ndev/ntest."""
    check_classifier(classifier)
    return _classify(task, index, emb, n_jobs, k, classifier == "pytorch")


def _classify(
    task: TransferData, index: dict[str, int], emb: np.ndarray, n_jobs: int | None, k: int, pytorch: bool
) -> dict:
    splits = task.splits
    classes = len(_TREC_CLASSES) if task.name == "TREC" else 2
    if "all" in splits:
        data = splits["all"]
        x = _rows(index, emb, data.sentences)
        if pytorch:
            result = transfer_pytorch.inner_kfold(x, data.labels, classes, n_jobs, k)
        else:
            result = inner_kfold(x, data.labels, n_jobs, k)
        return {**result, "ndev": len(data), "ntest": len(data)}
    if task.name == "SST2":
        x = {key: _rows(index, emb, s.sentences) for key, s in splits.items()}
        y = {key: s.labels for key, s in splits.items()}
        result = transfer_pytorch.split_classifier(x, y, classes, n_jobs) if pytorch else split_classifier(x, y, n_jobs)
        return {**result, "ndev": len(splits["dev"]), "ntest": len(splits["test"])}
    features = {}
    for key, split in splits.items():
        u = _rows(index, emb, split.sentences)
        if split.sentences2 is None:
            features[key] = u
        else:  # MRPC
            v = _rows(index, emb, split.sentences2)
            features[key] = np.c_[np.abs(u - v), u * v]
    train, test = splits["train"], splits["test"]
    data = (features["train"], train.labels, features["test"], test.labels)
    if pytorch:
        result, predicted = transfer_pytorch.kfold(*data, classes, n_jobs, k)
    else:
        result, predicted = kfold(*data, n_jobs, k)
    if task.name == "MRPC":
        result["f1"] = round(100 * float(f1_score(test.labels, predicted)), 2) / 100
    return {**result, "ndev": len(train), "ntest": len(test)}


@dataclass(frozen=True)
class TransferTask:
    """A SentEval transfer task (`TRANSFER_TASKS`): a classifier on frozen embeddings, SentEval's `classifier`
    protocol (sklearn or pytorch) with `k` folds, its fits `n_jobs` at once (-1: all cores; the results do not
    change). Its result: `acc` (the primary score), `devacc`, the chosen C or l2reg, `ndev`, `ntest`."""

    name: str
    classifier: str = "sklearn"
    n_jobs: int | None = 1
    k: int = KFOLD

    def __post_init__(self) -> None:
        _check_name(self.name)
        check_classifier(self.classifier)

    @property
    def kind(self) -> str:
        return "transfer"

    @property
    def source(self) -> Hashable:
        return ("transfer", self.name)

    @property
    def selectable(self) -> tuple[str, ...]:
        return ()

    def read(self, data_dir: str | Path | None) -> TransferData:
        return load_transfer_task(data_dir, self.name)

    def sentences(self, data: TransferData) -> list[str]:
        return data.sentences()

    def score(self, data: TransferData, encode: Encoder, encode_raw: Encoder) -> dict:
        index, emb = _encode_all(encode, [data])
        return run_transfer_task(data, index, emb, self.n_jobs, self.k, self.classifier)

    def primary(self, data: TransferData) -> str:
        return "acc"


def evaluate_transfer(
    encode: Encoder,
    data_dir: str | Path | None,
    tasks: Sequence[str] = TRANSFER_TASKS,
    n_jobs: int | None = 1,
    k: int = KFOLD,
    classifier: str = "sklearn",
) -> dict:
    """Accuracy (fraction) of each transfer task, plus `transfer_avg` when all seven ran.

    `encode` is called once on the deduplicated sentences of all tasks; `n_jobs` parallelises the
    (fold, C) fits with joblib (-1: all cores), which changes nothing in the results. `k` is SentEval's
    `kfold` parameter; keep the default 10 for the papers' protocol. `classifier`: SentEval's sklearn or
    pytorch protocol (`TRANSFER_CLASSIFIERS`).
    """
    check_classifier(classifier)
    names = (tasks,) if isinstance(tasks, str) else tasks
    task_set = TaskSet([TransferTask(name, classifier, n_jobs, k) for name in names])
    return task_set.run(encode, data_dir).flat()


def format_transfer_table(results: dict) -> str:
    """The papers' transfer table: accuracy x 100 with two decimals; '-' where a task was not run."""
    heads = [label for label, _, _ in _TABLE_COLUMNS] + ["Avg."]
    values = [results.get(task, {}).get(key) for _, task, key in _TABLE_COLUMNS] + [results.get("transfer_avg")]
    return score_table(heads, values)

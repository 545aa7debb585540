"""SentEval's PyTorch transfer protocol (`usepytorch: True`), the one the published transfer numbers come from.

SimCSE's `evaluation.py` (test mode), which WhitenedCSE and OssCSE evaluate with, sets `usepytorch: True`,
`kfold: 10` and the classifier `{nhid: 0, optim: adam, batch_size: 64, tenacity: 5, epoch_size: 4}`: a
logistic regression trained by Adam with early stopping on a validation set, its L2 penalty chosen from
1e-5, 1e-4, 1e-3, 1e-2. This module is that protocol as SentEval's `tools/classifier.py` (`PyTorchClassifier`,
`MLP` with nhid 0) and `tools/validation.py` (the `usepytorch` branches) run it, step for step:

* every classifier is seeded with 1111 (SentEval's `np.random.seed`, `torch.manual_seed` in its constructor):
  csekit draws the same numbers from its own generators, so a fit does not touch the process's random state;
* an epoch of `fit` is `epoch_size` passes over the training rows, each in a fresh `np.random.permutation`,
  batches of 64; after each epoch the validation accuracy is read, the best model kept, and training stops
  after `tenacity` + 1 epochs without gain counted over the whole fit (SentEval never resets the count), or
  after `max_epoch` (200);
* the loss is the batch mean: SentEval sets `loss_fn.size_average = False` after building the loss, which
  PyTorch >= 0.4.1 ignores (the reduction is fixed when it is built), and the authors ran PyTorch 1.x;
* validation: the held-out fold in the grid search; a random 5% of the training rows (`validation_split`)
  in the final fit of the k-fold protocols; SST-2's dev set in both fits of its split protocol.

It runs on the CPU (SentEval ran it on CUDA: the same computation up to float rounding).
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from joblib import Parallel, delayed
from sklearn.model_selection import StratifiedKFold
from torch import nn

SEED = 1111
L2_GRID = tuple(10**t for t in range(-5, -1))
"""SentEval's `regs` with `usepytorch`: 1e-5, 1e-4, 1e-3, 1e-2."""
VALIDATION_SPLIT = 0.05


@dataclass(frozen=True)
class ClassifierConfig:
    """SentEval's `params['classifier']` in SimCSE's test mode (nhid 0, Adam) and the MLP's other defaults."""

    batch_size: int = 64
    tenacity: int = 5
    epoch_size: int = 4
    max_epoch: int = 200


class LogisticRegressionAdam:
    """SentEval's `MLP` with nhid 0: one linear layer, cross-entropy, Adam with `l2reg` as weight decay."""

    def __init__(self, dim: int, classes: int, l2reg: float, config: ClassifierConfig = ClassifierConfig()) -> None:
        self.config = config
        self.rng = np.random.RandomState(SEED)  # np.random.seed(seed): the permutations
        generator = torch.Generator().manual_seed(SEED)  # torch.manual_seed(seed): nn.Linear's initialisation
        self.model = nn.Sequential(torch.nn.utils.skip_init(nn.Linear, dim, classes))
        linear = self.model[0]
        nn.init.kaiming_uniform_(linear.weight, a=math.sqrt(5), generator=generator)
        bound = 1 / math.sqrt(dim)
        nn.init.uniform_(linear.bias, -bound, bound, generator=generator)
        self.loss = nn.CrossEntropyLoss()
        self.optimizer = torch.optim.Adam(self.model.parameters())
        self.optimizer.param_groups[0]["weight_decay"] = l2reg

    @staticmethod
    @contextlib.contextmanager
    def _one_thread() -> Iterator[None]:
        """A fit's matrices are a few rows by a few hundred: one thread runs them tens of times faster than several
        contending ones (the fits run side by side in processes instead, `n_jobs`); the setting is restored."""
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            yield
        finally:
            torch.set_num_threads(threads)

    def fit(
        self,
        x: np.ndarray,
        y: np.ndarray,
        validation_data: tuple[np.ndarray, np.ndarray] | None = None,
        validation_split: float | None = None,
    ) -> float:
        """Train with early stopping on the validation rows; keeps the best model; returns its validation accuracy."""
        with self._one_thread():
            return self._fit(x, y, validation_data, validation_split)

    def _fit(
        self,
        x: np.ndarray,
        y: np.ndarray,
        validation_data: tuple[np.ndarray, np.ndarray] | None,
        validation_split: float | None,
    ) -> float:
        if validation_data is not None:
            (train_x, train_y), (dev_x, dev_y) = (x, y), validation_data
        else:
            assert validation_split is not None
            permutation = self.rng.permutation(len(x))
            train, dev = np.split(permutation, [int(validation_split * len(x))])[::-1]
            train_x, train_y, dev_x, dev_y = x[train], y[train], x[dev], y[dev]
        features, labels = torch.as_tensor(train_x, dtype=torch.float32), torch.as_tensor(train_y, dtype=torch.long)
        epochs, best, best_model, without_gain = 0, -1.0, self.model, 0
        while epochs <= self.config.max_epoch:
            self._train_epoch(features, labels)
            epochs += self.config.epoch_size
            accuracy = self.score(dev_x, dev_y)
            if accuracy > best:
                best, best_model = accuracy, copy.deepcopy(self.model)
            else:
                if without_gain >= self.config.tenacity:
                    break
                without_gain += 1
        self.model = best_model
        return best

    def _train_epoch(self, features: torch.Tensor, labels: torch.Tensor) -> None:
        self.model.train()
        size = self.config.batch_size
        for _ in range(self.config.epoch_size):
            permutation = torch.as_tensor(self.rng.permutation(len(features)))
            for start in range(0, len(features), size):
                rows = permutation[start : start + size]
                loss = self.loss(self.model(features[rows]), labels[rows])
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()

    def predict(self, x: np.ndarray) -> np.ndarray:
        """The most likely class of each row (batches of `batch_size`, as SentEval scores)."""
        self.model.eval()
        features, size = torch.as_tensor(x, dtype=torch.float32), self.config.batch_size
        with torch.no_grad():
            parts = [self.model(features[start : start + size]).argmax(1) for start in range(0, len(features), size)]
        return torch.cat(parts).numpy() if parts else np.zeros(0, dtype=np.int64)

    def score(self, x: np.ndarray, y: np.ndarray) -> float:
        return float(np.mean(self.predict(x) == np.asarray(y))) if len(y) else 0.0


def _fit_score(x: np.ndarray, y: np.ndarray, train: np.ndarray, test: np.ndarray, classes: int, l2reg: float) -> float:
    """One grid cell: fit on `train` with `test` as the validation rows, the accuracy on `test`."""
    classifier = LogisticRegressionAdam(x.shape[1], classes, l2reg)
    classifier.fit(x[train], y[train], validation_data=(x[test], y[test]))
    return classifier.score(x[test], y[test])


def _final(x: np.ndarray, y: np.ndarray, classes: int, l2reg: float) -> LogisticRegressionAdam:
    """The refit on all training rows, early-stopped on a random 5% of them."""
    classifier = LogisticRegressionAdam(x.shape[1], classes, l2reg)
    classifier.fit(x, y, validation_split=VALIDATION_SPLIT)
    return classifier


def _pick(scores: Sequence[float]) -> tuple[float, float]:
    """SentEval's choice: the first L2 penalty with the highest (rounded) score."""
    best = int(np.argmax(scores))
    return L2_GRID[best], float(scores[best])


def inner_kfold(x: np.ndarray, y: np.ndarray, classes: int, n_jobs: int | None = 1, k: int = 10) -> dict:
    """MR, CR, SUBJ, MPQA: SentEval's `InnerKFoldClassifier` with `usepytorch`."""
    folds = StratifiedKFold(n_splits=k, shuffle=True, random_state=SEED)
    outer = list(folds.split(x, y))
    cells = [
        (fold, j, train[a], train[b])
        for fold, (train, _) in enumerate(outer)
        for j in range(len(L2_GRID))
        for a, b in folds.split(x[train], y[train])
    ]
    scores = Parallel(n_jobs=n_jobs)(delayed(_fit_score)(x, y, a, b, classes, L2_GRID[j]) for _, j, a, b in cells)
    grid = np.asarray(scores).reshape(k, len(L2_GRID), k)
    chosen = [_pick([round(100 * float(np.mean(grid[f, j])), 2) for j in range(len(L2_GRID))]) for f in range(k)]
    refits = zip(chosen, outer, strict=True)
    finals = Parallel(n_jobs=n_jobs)(delayed(_final)(x[tr], y[tr], classes, l2reg) for (l2reg, _), (tr, _) in refits)
    tests = [round(100 * c.score(x[test], y[test]), 2) for c, (_, test) in zip(finals, outer, strict=True)]
    return {
        "acc": round(float(np.mean(tests)), 2) / 100,
        "devacc": round(float(np.mean([dev for _, dev in chosen])), 2) / 100,
        "l2reg": [l2reg for l2reg, _ in chosen],
    }


def kfold(
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_test: np.ndarray,
    y_test: np.ndarray,
    classes: int,
    n_jobs: int | None = 1,
    k: int = 10,
) -> tuple[dict, np.ndarray]:
    """TREC, MRPC: SentEval's `KFoldClassifier` with `usepytorch` (and the test predictions, for MRPC's F1)."""
    folds = list(StratifiedKFold(n_splits=k, shuffle=True, random_state=SEED).split(x_train, y_train))
    scores = Parallel(n_jobs=n_jobs)(
        delayed(_fit_score)(x_train, y_train, a, b, classes, l2reg) for l2reg in L2_GRID for a, b in folds
    )
    grid = np.asarray(scores).reshape(len(L2_GRID), k)
    l2reg, dev = _pick([round(100 * float(np.mean(row)), 2) for row in grid])
    classifier = _final(x_train, y_train, classes, l2reg)
    predicted = classifier.predict(x_test)
    accuracy = round(100 * classifier.score(x_test, y_test), 2) / 100
    return {"acc": accuracy, "devacc": dev / 100, "l2reg": l2reg}, predicted


def _fit_split(
    x: dict[str, np.ndarray], y: dict[str, np.ndarray], classes: int, l2reg: float
) -> LogisticRegressionAdam:
    classifier = LogisticRegressionAdam(x["train"].shape[1], classes, l2reg)
    classifier.fit(x["train"], y["train"], validation_data=(x["dev"], y["dev"]))
    return classifier


def split_classifier(x: dict[str, np.ndarray], y: dict[str, np.ndarray], classes: int, n_jobs: int | None = 1) -> dict:
    """SST-2: SentEval's `SplitClassifier` with `usepytorch`; the final fit is the chosen cell's (the same seeded
    computation SentEval repeats)."""
    models = Parallel(n_jobs=n_jobs)(delayed(_fit_split)(x, y, classes, l2reg) for l2reg in L2_GRID)
    l2reg, dev = _pick([round(100 * m.score(x["dev"], y["dev"]), 2) for m in models])
    accuracy = round(100 * models[L2_GRID.index(l2reg)].score(x["test"], y["test"]), 2) / 100
    return {"acc": accuracy, "devacc": dev / 100, "l2reg": l2reg}

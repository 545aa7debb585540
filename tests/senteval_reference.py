"""SentEval's PyTorch transfer protocol as its code runs it, the reference
`tests/unit/evaluation/test_transfer_pytorch.py` compares csekit's with (SentEval is not on PyPI).

Written from facebookresearch/SentEval `senteval/tools/classifier.py` (`PyTorchClassifier`, `MLP` with nhid 0) and
`senteval/tools/validation.py` (the `usepytorch` branches of `InnerKFoldClassifier`, `KFoldClassifier`,
`SplitClassifier`), keeping their statements and their use of the global random generators; only `.cuda()` is left
out (the test runs on the CPU) and `Variable` is gone (a plain tensor since PyTorch 0.4).
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from sklearn.model_selection import StratifiedKFold
from torch import nn


class MLP:
    """`PyTorchClassifier.__init__` + `MLP.__init__` (nhid 0, optim adam) + `fit`, `trainepoch`, `score`, `predict`."""

    def __init__(self, params: dict, inputdim: int, nclasses: int, l2reg: float = 0.0, seed: int = 1111) -> None:
        np.random.seed(seed)
        torch.manual_seed(seed)
        self.inputdim, self.nclasses, self.l2reg = inputdim, nclasses, l2reg
        self.tenacity = params.get("tenacity", 5)
        self.epoch_size = params.get("epoch_size", 4)
        self.max_epoch = params.get("max_epoch", 200)
        self.batch_size = params.get("batch_size", 64)
        self.model = nn.Sequential(nn.Linear(self.inputdim, self.nclasses))
        self.loss_fn = nn.CrossEntropyLoss()
        self.loss_fn.size_average = False  # as SentEval; PyTorch >= 0.4.1 ignores it (the reduction stays mean)
        self.optimizer = torch.optim.Adam(self.model.parameters())
        self.optimizer.param_groups[0]["weight_decay"] = self.l2reg

    def prepare_split(self, X, y, validation_data=None, validation_split=None):
        assert validation_split or validation_data
        if validation_data is not None:
            trainX, trainy = X, y
            devX, devy = validation_data
        else:
            permutation = np.random.permutation(len(X))
            trainidx = permutation[int(validation_split * len(X)) :]
            devidx = permutation[0 : int(validation_split * len(X))]
            trainX, trainy = X[trainidx], y[trainidx]
            devX, devy = X[devidx], y[devidx]
        return torch.FloatTensor(trainX), torch.LongTensor(trainy), torch.FloatTensor(devX), torch.LongTensor(devy)

    def fit(self, X, y, validation_data=None, validation_split=None, early_stop=True):
        self.nepoch = 0
        bestaccuracy = -1
        stop_train = False
        early_stop_count = 0
        trainX, trainy, devX, devy = self.prepare_split(X, y, validation_data, validation_split)
        while not stop_train and self.nepoch <= self.max_epoch:
            self.trainepoch(trainX, trainy, epoch_size=self.epoch_size)
            accuracy = self.score(devX, devy)
            if accuracy > bestaccuracy:
                bestaccuracy = accuracy
                bestmodel = copy.deepcopy(self.model)
            elif early_stop:
                if early_stop_count >= self.tenacity:
                    stop_train = True
                early_stop_count += 1
        self.model = bestmodel
        return bestaccuracy

    def trainepoch(self, X, y, epoch_size=1):
        self.model.train()
        for _ in range(self.nepoch, self.nepoch + epoch_size):
            permutation = np.random.permutation(len(X))
            for i in range(0, len(X), self.batch_size):
                idx = torch.LongTensor(permutation[i : i + self.batch_size])
                Xbatch = X.index_select(0, idx)
                ybatch = y.index_select(0, idx)
                output = self.model(Xbatch)
                loss = self.loss_fn(output, ybatch)
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()
        self.nepoch += epoch_size

    def score(self, devX, devy):
        self.model.eval()
        correct = 0
        devX, devy = torch.FloatTensor(devX), torch.LongTensor(devy)
        with torch.no_grad():
            for i in range(0, len(devX), self.batch_size):
                output = self.model(devX[i : i + self.batch_size])
                pred = output.data.max(1)[1]
                correct += pred.long().eq(devy[i : i + self.batch_size].long()).sum().item()
        return 1.0 * correct / len(devX)

    def predict(self, devX):
        self.model.eval()
        devX = torch.FloatTensor(devX)
        yhat = np.array([])
        with torch.no_grad():
            for i in range(0, len(devX), self.batch_size):
                yhat = np.append(yhat, self.model(devX[i : i + self.batch_size]).data.max(1)[1].cpu().numpy())
        return np.vstack(yhat)


REGS = [10**t for t in range(-5, -1)]


def inner_kfold(X, y, nclasses, params, k):
    """`InnerKFoldClassifier.run` with usepytorch: (devaccuracy, testaccuracy)."""
    skf = StratifiedKFold(n_splits=k, shuffle=True, random_state=1111)
    innerskf = StratifiedKFold(n_splits=k, shuffle=True, random_state=1111)
    devresults, testresults = [], []
    for train_idx, test_idx in skf.split(X, y):
        X_train, X_test = X[train_idx], X[test_idx]
        y_train, y_test = y[train_idx], y[test_idx]
        scores = []
        for reg in REGS:
            regscores = []
            for inner_train_idx, inner_test_idx in innerskf.split(X_train, y_train):
                X_in_train, X_in_test = X_train[inner_train_idx], X_train[inner_test_idx]
                y_in_train, y_in_test = y_train[inner_train_idx], y_train[inner_test_idx]
                clf = MLP(params, inputdim=X.shape[1], nclasses=nclasses, l2reg=reg, seed=1111)
                clf.fit(X_in_train, y_in_train, validation_data=(X_in_test, y_in_test))
                regscores.append(clf.score(X_in_test, y_in_test))
            scores.append(round(100 * np.mean(regscores), 2))
        optreg = REGS[np.argmax(scores)]
        devresults.append(np.max(scores))
        clf = MLP(params, inputdim=X.shape[1], nclasses=nclasses, l2reg=optreg, seed=1111)
        clf.fit(X_train, y_train, validation_split=0.05)
        testresults.append(round(100 * clf.score(X_test, y_test), 2))
    return round(np.mean(devresults), 2), round(np.mean(testresults), 2)


def kfold(train, test, nclasses, params, k):
    """`KFoldClassifier.run` with usepytorch: (devaccuracy, testaccuracy, yhat)."""
    skf = StratifiedKFold(n_splits=k, shuffle=True, random_state=1111)
    scores = []
    for reg in REGS:
        scanscores = []
        for train_idx, test_idx in skf.split(train["X"], train["y"]):
            X_train, y_train = train["X"][train_idx], train["y"][train_idx]
            X_test, y_test = train["X"][test_idx], train["y"][test_idx]
            clf = MLP(params, inputdim=train["X"].shape[1], nclasses=nclasses, l2reg=reg, seed=1111)
            clf.fit(X_train, y_train, validation_data=(X_test, y_test))
            scanscores.append(clf.score(X_test, y_test))
        scores.append(round(100 * np.mean(scanscores), 2))
    optreg = REGS[np.argmax(scores)]
    devaccuracy = np.max(scores)
    clf = MLP(params, inputdim=train["X"].shape[1], nclasses=nclasses, l2reg=optreg, seed=1111)
    clf.fit(train["X"], train["y"], validation_split=0.05)
    yhat = clf.predict(test["X"])
    return devaccuracy, round(100 * clf.score(test["X"], test["y"]), 2), yhat


def split(X, y, nclasses, params):
    """`SplitClassifier.run` with usepytorch: (devaccuracy, testaccuracy)."""
    scores = []
    for reg in REGS:
        clf = MLP(params, inputdim=X["train"].shape[1], nclasses=nclasses, l2reg=reg, seed=1111)
        clf.fit(X["train"], y["train"], validation_data=(X["valid"], y["valid"]))
        scores.append(round(100 * clf.score(X["valid"], y["valid"]), 2))
    optreg = REGS[np.argmax(scores)]
    devaccuracy = np.max(scores)
    clf = MLP(params, inputdim=X["train"].shape[1], nclasses=nclasses, l2reg=optreg, seed=1111)
    clf.fit(X["train"], y["train"], validation_data=(X["valid"], y["valid"]))
    return devaccuracy, round(100 * clf.score(X["test"], y["test"]), 2)

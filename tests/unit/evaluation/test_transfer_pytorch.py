"""SentEval's PyTorch transfer protocol (issue #53 item 4): csekit's equals SentEval's own code on fixed embeddings.

The reference (`tests/senteval_reference.py`) is SentEval's `classifier.py` and `validation.py` with their global
seeding; each test runs both on the same small embeddings (a few dimensions, tens of rows, 3 folds) and compares
every number SentEval reports.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import senteval_reference as senteval
import torch
from conftest import assert_one_line_error, run_main
from recipe_trace import one_thread
from test_transfer import make_transfer_dir, marker_encoder

from csekit.evaluation import transfer_pytorch
from csekit.evaluation.transfer import TRANSFER_TASKS, evaluate_transfer


@pytest.fixture(autouse=True)
def single_thread() -> Iterator[None]:
    """SentEval's fits on a CPU: tiny matrices, many threads contend (csekit's fit runs on one thread itself)."""
    with one_thread():
        yield


PARAMS = {"nhid": 0, "optim": "adam", "batch_size": 64, "tenacity": 5, "epoch_size": 4}
"""SimCSE's `evaluation.py` test mode (`usepytorch: True`, `kfold: 10`), the papers' transfer setting."""


def _embeddings(rows: int, dim: int, classes: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Noisy, partly separable rows: early stopping and the L2 grid both have something to choose."""
    rng = np.random.default_rng(seed)
    y = np.arange(rows) % classes
    centres = rng.standard_normal((classes, dim))
    x = 0.6 * centres[y] + rng.standard_normal((rows, dim))
    return x.astype(np.float32), y.astype(np.int64)


@pytest.mark.parametrize("seed", [0, 1])
def test_inner_kfold_equals_senteval(seed: int) -> None:
    x, y = _embeddings(72, 6, 2, seed)
    dev, test = senteval.inner_kfold(x, y, 2, PARAMS, k=3)
    ours = transfer_pytorch.inner_kfold(x, y, 2, n_jobs=1, k=3)
    assert 100 * ours["acc"] == pytest.approx(test, abs=1e-9)
    assert 100 * ours["devacc"] == pytest.approx(dev, abs=1e-9)


def test_kfold_equals_senteval_with_six_classes_and_its_predictions() -> None:
    x, y = _embeddings(96, 5, 6, 2)
    x_test, y_test = _embeddings(30, 5, 6, 3)
    dev, test, predicted = senteval.kfold({"X": x, "y": y}, {"X": x_test, "y": y_test}, 6, PARAMS, k=3)
    ours, ours_predicted = transfer_pytorch.kfold(x, y, x_test, y_test, 6, n_jobs=1, k=3)
    assert 100 * ours["acc"] == pytest.approx(test, abs=1e-9)
    assert 100 * ours["devacc"] == pytest.approx(dev, abs=1e-9)
    assert ours_predicted.tolist() == predicted.ravel().astype(int).tolist()


def test_split_classifier_equals_senteval() -> None:
    x = {
        split: _embeddings(rows, 4, 2, seed)[0]
        for split, rows, seed in (("train", 80, 4), ("dev", 30, 5), ("test", 30, 6))
    }
    y = {
        split: _embeddings(rows, 4, 2, seed)[1]
        for split, rows, seed in (("train", 80, 4), ("dev", 30, 5), ("test", 30, 6))
    }
    dev, test = senteval.split(
        {"train": x["train"], "valid": x["dev"], "test": x["test"]}, {**y, "valid": y["dev"]}, 2, PARAMS
    )
    ours = transfer_pytorch.split_classifier(x, y, 2, n_jobs=1)
    assert 100 * ours["acc"] == pytest.approx(test, abs=1e-9)
    assert 100 * ours["devacc"] == pytest.approx(dev, abs=1e-9)


def test_one_fit_stops_early_and_draws_from_its_own_generators() -> None:
    """The same fit as SentEval's MLP (validation accuracy and the weights kept), and the process's random state
    untouched (SentEval reseeds the global generators; csekit does not)."""
    x, y = _embeddings(120, 6, 2, 7)
    reference = senteval.MLP(PARAMS, 6, 2, l2reg=1e-3)
    best = reference.fit(x, y, validation_split=0.05)
    torch.manual_seed(5)
    np.random.seed(5)
    state, numpy_state = torch.get_rng_state(), np.random.get_state()[1].copy()
    ours = transfer_pytorch.LogisticRegressionAdam(6, 2, 1e-3)
    assert ours.fit(x, y, validation_split=0.05) == best
    assert torch.equal(torch.get_rng_state(), state) and np.array_equal(np.random.get_state()[1], numpy_state)
    assert reference.nepoch < 200  # it stopped early
    torch.testing.assert_close(ours.model[0].weight, reference.model[0].weight)


def test_evaluate_transfer_runs_every_task_with_the_pytorch_protocol(tmp_path: Path) -> None:
    """Every task through the PyTorch protocol (its grid's l2reg reported, not sklearn's C). On these 40-row made-up
    tasks SentEval's early stopping ends a fit after a few epochs of one batch, so accuracies are not 100% as
    with scikit-learn (the reference gives the same numbers: the tests above)."""
    data = make_transfer_dir(tmp_path / "data", n=12)
    results = evaluate_transfer(marker_encoder, data, TRANSFER_TASKS, n_jobs=1, k=3, classifier="pytorch")
    for name in TRANSFER_TASKS:
        assert 0.0 <= results[name]["acc"] <= 1.0, name
        assert "l2reg" in results[name] and "C" not in results[name]
    assert "transfer_avg" in results and "f1" in results["MRPC"]


def test_an_unknown_classifier_is_one_line(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    data = make_transfer_dir(tmp_path / "data", n=4)
    args = ["evaluate", str(tiny_model_dir), "--tasks", "MR", "--classifier", "svm", "--data-dir", str(data)]
    code, err = run_main(monkeypatch, capsys, *args)
    assert_one_line_error(code, err, "transfer classifier must be one of sklearn, pytorch")


def test_the_report_names_the_transfer_protocol_and_reads_back(tmp_path: Path) -> None:
    """The report says which protocol computed the transfer numbers, and reads back with the per-fold choices (MR's C
    for each fold, a list: results.json with transfer tasks did not read back before)."""
    from csekit.encoding.representation import Representation
    from csekit.evaluation.result import EvalResult
    from csekit.evaluation.suite import parse_tasks, protocol_facts
    from csekit.evaluation.task_set import TaskSet

    data = make_transfer_dir(tmp_path / "data", n=20)
    tasks = parse_tasks("MR")
    result = EvalResult.from_flat(evaluate_transfer(marker_encoder, data, ["MR"], n_jobs=1, k=3))
    report = json.loads(json.dumps(result.report(protocol_facts(Representation(), tasks))))
    assert report["transfer_classifier"] == "sklearn" and report["sentence_end"] == "none"
    assert isinstance(report["tasks"]["MR"]["C"], list)
    assert EvalResult.from_json(report, "results.json").tasks["MR"]["acc"] == pytest.approx(1.0)
    sncse = Representation(sentence_end="sncse")
    assert protocol_facts(Representation(), parse_tasks("MR", classifier="pytorch"))["transfer_classifier"] == "pytorch"
    assert "transfer_classifier" not in protocol_facts(sncse, TaskSet())
    assert "transfer_classifier" not in protocol_facts(sncse, parse_tasks("sts,align"))


def test_bench_names_the_protocol_beside_each_compared_number() -> None:
    from csekit.bench.papers import protocol

    runs = [{"transfer_classifier": "pytorch", "sentence_end": "sncse"}, {"sentence_end": "sncse"}]
    assert protocol("MR", runs) == "SentEval pytorch and sklearn classifier (paper: pytorch)"
    assert protocol("Transfer Avg.", runs[:1]) == "SentEval pytorch classifier (paper: pytorch)"
    assert protocol("STS-B", runs) == "sentence end sncse"
    assert protocol("STS-B", [{}]) == "sentence end none"  # a results.json from before the protocol was recorded

"""Transfer tasks: SentEval's readers and classifier protocol, on made-up folders and on the real data."""

from __future__ import annotations

import json
import random
import zlib
from pathlib import Path

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedKFold

from csekit.core.errors import CsekitError
from csekit.evaluation.transfer import (
    TRANSFER_TASKS,
    evaluate_transfer,
    format_transfer_table,
    inner_kfold,
    kfold,
    load_transfer_task,
)

REPO = Path(__file__).resolve().parents[3]
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma".split()


def _sentence(rng: random.Random, marker: str) -> str:
    return " ".join([marker, *rng.choices(WORDS, k=rng.randint(2, 6))])


def make_transfer_dir(root: Path, n: int = 40, seed: int = 0) -> Path:
    """A made-up folder in SentEval's downstream layout; the class is the first word (`good`/`bad` etc.)."""
    rng = random.Random(seed)
    for name, (pos, neg) in {
        "MR": ("rt-polarity.pos", "rt-polarity.neg"),
        "CR": ("custrev.pos", "custrev.neg"),
        "SUBJ": ("subj.objective", "subj.subjective"),
        "MPQA": ("mpqa.pos", "mpqa.neg"),
    }.items():
        (root / name).mkdir(parents=True)
        (root / name / pos).write_bytes("".join(_sentence(rng, "good") + "\n" for _ in range(n)).encode("latin-1"))
        (root / name / neg).write_bytes("".join(_sentence(rng, "bad") + "\n" for _ in range(n)).encode("latin-1"))
    sst = root / "SST" / "binary"
    sst.mkdir(parents=True)
    for split in ("train", "dev", "test"):
        rows = [f"{_sentence(rng, m)} \t{y}" for _ in range(n) for m, y in (("good", 1), ("bad", 0))]
        (sst / f"sentiment-{split}").write_text("\n".join(rows) + "\n", encoding="utf-8")
    (root / "TREC").mkdir()
    classes = ["ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM"]
    for file, count in (("train_5500.label", n), ("TREC_10.label", n // 4)):
        rows = [f"{c}:fine {_sentence(rng, c.lower())}" for _ in range(count) for c in classes]
        (root / "TREC" / file).write_bytes(("\n".join(rows) + "\n").encode("latin-1"))
    (root / "MRPC").mkdir()
    for split in ("train", "test"):
        rows = ["\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String"]
        for i in range(n):
            a = _sentence(rng, "same")
            rows.append(f"1\t{i}\t{i}\t{a}\t{a}")
            rows.append(f"0\t{i}\t{i}\t{_sentence(rng, 'one')}\t{_sentence(rng, 'two')}")
        (root / "MRPC" / f"msr_paraphrase_{split}.txt").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return root


MARKERS = ["good", "bad", "same", "one", "two", "abbr", "desc", "enty", "hum", "loc", "num"]


def marker_encoder(sentences: list[str]) -> np.ndarray:
    """A made-up encoder: a one-hot of the first word plus small deterministic noise (linearly separable)."""
    rows = []
    for s in sentences:
        rng = np.random.default_rng(zlib.crc32(s.encode()))
        onehot = [float(s.split()[0] == m) for m in MARKERS] if s else [0.0] * len(MARKERS)
        rows.append(np.r_[onehot, 0.1 * rng.standard_normal(4)])
    return np.asarray(rows, dtype=np.float32)


def test_separable_tasks_reach_100_percent(tmp_path: Path) -> None:
    data = make_transfer_dir(tmp_path / "data", n=20)
    calls: list[int] = []

    def encode(sentences: list[str]) -> np.ndarray:
        calls.append(len(sentences))
        return marker_encoder(sentences)

    results = evaluate_transfer(encode, data, TRANSFER_TASKS, n_jobs=1, k=3)
    assert len(calls) == 1 and calls[0] == len(
        set().union(*(load_transfer_task(data, t).sentences() for t in TRANSFER_TASKS))
    )
    for name in TRANSFER_TASKS:
        assert results[name]["acc"] == pytest.approx(1.0), name
    assert results["transfer_avg"] == pytest.approx(1.0)
    assert results["MRPC"]["f1"] == pytest.approx(1.0)
    head, _, row = format_transfer_table(results).splitlines()
    assert [c.strip() for c in head.strip("|").split("|")] == [
        "MR",
        "CR",
        "SUBJ",
        "MPQA",
        "SST",
        "TREC",
        "MRPC",
        "Avg.",
    ]
    assert [c.strip() for c in row.strip("|").split("|")] == ["100.00"] * 8


def test_shuffled_labels_give_chance() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((200, 8)).astype(np.float32)
    y = rng.permutation(np.repeat([0, 1], 100))
    assert 0.35 <= inner_kfold(x, y, n_jobs=1, k=3)["acc"] <= 0.65
    # the same features with a learnable label are classified far above chance: the test can fail
    learnable = (x[:, 0] > 0).astype(int)
    assert kfold(x[:150], learnable[:150], x[150:], learnable[150:])[0]["acc"] > 0.9


def senteval_inner_kfold(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """SentEval's InnerKFoldClassifier.run (scikit-learn mode), written out as in tools/validation.py."""
    regs = [2**t for t in range(-2, 4, 1)]
    skf = StratifiedKFold(n_splits=10, shuffle=True, random_state=1111)
    innerskf = StratifiedKFold(n_splits=10, shuffle=True, random_state=1111)
    devresults, testresults = [], []
    for train_idx, test_idx in skf.split(x, y):
        x_train, x_test, y_train, y_test = x[train_idx], x[test_idx], y[train_idx], y[test_idx]
        scores = []
        for reg in regs:
            regscores = []
            for a, b in innerskf.split(x_train, y_train):
                clf = LogisticRegression(C=reg, random_state=1111).fit(x_train[a], y_train[a])
                regscores.append(clf.score(x_train[b], y_train[b]))
            scores.append(round(100 * np.mean(regscores), 2))
        optreg = regs[np.argmax(scores)]
        devresults.append(np.max(scores))
        clf = LogisticRegression(C=optreg, random_state=1111).fit(x_train, y_train)
        testresults.append(round(100 * clf.score(x_test, y_test), 2))
    return round(np.mean(devresults), 2), round(np.mean(testresults), 2)


def senteval_kfold(xtr: np.ndarray, ytr: np.ndarray, xte: np.ndarray, yte: np.ndarray) -> tuple[float, float]:
    """SentEval's KFoldClassifier.run (scikit-learn mode)."""
    regs = [2**t for t in range(-1, 6, 1)]
    skf = StratifiedKFold(n_splits=10, shuffle=True, random_state=1111)
    scores = []
    for reg in regs:
        scan = [
            LogisticRegression(C=reg, random_state=1111).fit(xtr[a], ytr[a]).score(xtr[b], ytr[b])
            for a, b in skf.split(xtr, ytr)
        ]
        scores.append(round(100 * np.mean(scan), 2))
    optreg = regs[np.argmax(scores)]
    clf = LogisticRegression(C=optreg, random_state=1111).fit(xtr, ytr)
    return np.max(scores), round(100 * clf.score(xte, yte), 2)


@pytest.mark.slow
def test_classifiers_equal_senteval_loops() -> None:
    """The flattened, parallel (fold, C) jobs give SentEval's numbers, also with noisy, hard labels."""
    n_jobs = 2
    rng = np.random.default_rng(3)
    x = rng.standard_normal((80, 5)).astype(np.float32)
    y = (x[:, 0] + 1.5 * rng.standard_normal(80) > 0).astype(int)
    dev, test = senteval_inner_kfold(x, y)
    ours = inner_kfold(x, y, n_jobs=n_jobs)
    assert (100 * ours["devacc"], 100 * ours["acc"]) == pytest.approx((dev, test), abs=1e-9)
    y3 = np.digitize(x[:, 1] + rng.standard_normal(80), [-0.5, 0.5])
    xte = rng.standard_normal((40, 5)).astype(np.float32)
    yte = np.digitize(xte[:, 1], [-0.5, 0.5])
    dev, test = senteval_kfold(x, y3, xte, yte)
    ours, _ = kfold(x, y3, xte, yte, n_jobs=n_jobs)
    assert (100 * ours["devacc"], 100 * ours["acc"]) == pytest.approx((dev, test), abs=1e-9)


def test_readers_match_senteval_parsing(tmp_path: Path) -> None:
    folder = tmp_path / "MR"
    folder.mkdir()
    # latin-1 bytes (é = 0xe9), runs of spaces, an empty line: SentEval keeps every line of splitlines()
    (folder / "rt-polarity.pos").write_bytes(b"caf\xe9   au  lait\n\nlong one two three four\n")
    (folder / "rt-polarity.neg").write_bytes(b"bad\r\nworse thing\n")
    task = load_transfer_task(tmp_path, "MR")
    split = task.splits["all"]
    assert len(split) == 5
    # SentEval order: by token count, then label (stable): "", "bad"(0), "café au lait"(1)...
    assert split.sentences == ["", "bad", "worse thing", "café au lait", "long one two three four"]
    assert split.labels.tolist() == [1, 0, 0, 1, 1]

    trec = tmp_path / "TREC"
    trec.mkdir()
    (trec / "train_5500.label").write_bytes(b"NUM:date When was Ferdinand Magellan born ?\nHUM:ind Who  is \xe9 ?\n")
    (trec / "TREC_10.label").write_bytes(b"LOC:other Where is it ?\n")
    t = load_transfer_task(tmp_path, "TREC")
    assert t.splits["train"].sentences == ["Who is é ?", "When was Ferdinand Magellan born ?"]
    assert t.splits["train"].labels.tolist() == [3, 5]

    mrpc = tmp_path / "MRPC"
    mrpc.mkdir()
    header = "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
    body = "1\t1\t2\tThe cat sat .\tA cat sat  .\n0\t3\t4\tNo .\tYes it is .\n"
    for split in ("train", "test"):
        (mrpc / f"msr_paraphrase_{split}.txt").write_text(header + body, encoding="utf-8")
    m = load_transfer_task(tmp_path, "MRPC").splits["train"]
    assert m.sentences == ["No .", "The cat sat ."] and m.sentences2 == ["Yes it is .", "A cat sat ."]
    assert m.labels.tolist() == [0, 1]


@pytest.mark.parametrize(
    ("task", "file", "content", "needle"),
    [
        ("TREC", "train_5500.label", b"NUM:date fine\nXYZ:foo what ?\n", "train_5500.label:2: unknown TREC class"),
        ("TREC", "TREC_10.label", b"no colon here\n", "TREC_10.label:1: expected `COARSE:fine question`"),
        ("SST2", "sentiment-dev", b"good movie\t1\nno label here\n", "sentiment-dev:2: expected"),
        ("SST2", "sentiment-test", b"good\t7\n", "sentiment-test:1: label 7"),
        ("SST2", "sentiment-train", b"bad \xff\t0\n", "sentiment-train:1: not valid UTF-8"),
        ("MRPC", "msr_paraphrase_test.txt", b"h\n1\t2\t3\tonly four\n", "msr_paraphrase_test.txt:2: expected 5"),
    ],
)
def test_malformed_files_name_file_and_line(tmp_path: Path, task: str, file: str, content: bytes, needle: str) -> None:
    data = make_transfer_dir(tmp_path / "data", n=10)
    folder = {"SST2": data / "SST" / "binary"}.get(task, data / task)
    (folder / file).write_bytes(content)
    with pytest.raises(CsekitError, match=needle.replace("`", ".").replace("?", r"\?")):
        load_transfer_task(data, task)


def test_unknown_task_and_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(CsekitError, match='did you mean "MRPC"'):
        load_transfer_task(tmp_path, "MRCP")
    with pytest.raises(CsekitError, match="CR data not found"):
        load_transfer_task(tmp_path, "CR")


REAL_COUNTS = {
    "MR": {"all": 10662},
    "CR": {"all": 3775},
    "SUBJ": {"all": 10000},
    "MPQA": {"all": 10606},
    "SST2": {"train": 67349, "dev": 872, "test": 1821},
    "TREC": {"train": 5452, "test": 500},
    "MRPC": {"train": 4076, "test": 1725},
}


@pytest.mark.data
def test_counts_on_real_data(data_dir: Path) -> None:
    if not (data_dir / "transfer").is_dir():
        pytest.skip("transfer data not staged")
    for name, counts in REAL_COUNTS.items():
        task = load_transfer_task(data_dir, name)
        assert {k: len(v) for k, v in task.splits.items()} == counts, name
    trec = load_transfer_task(data_dir, "TREC").splits["train"]
    assert sorted(set(trec.labels.tolist())) == [0, 1, 2, 3, 4, 5]
    mrpc = load_transfer_task(data_dir, "MRPC").splits
    assert int(mrpc["train"].labels.sum()) == 2753 and int(mrpc["test"].labels.sum()) == 1147
    # MR is read as latin-1 like SentEval: every line decodes, none is dropped
    assert all("\ufffd" not in s for s in load_transfer_task(data_dir, "MR").splits["all"].sentences)


def test_cli_transfer_and_align(tmp_path: Path, tiny_model_dir: Path) -> None:
    from conftest import make_data_dir, run_cli

    data = make_transfer_dir(make_data_dir(tmp_path / "data"), n=12)
    args = ["--tasks", "SST2,MRPC,align", "--data-dir", str(data), "--output", "r.json", "--n-jobs", "1"]
    result = run_cli("evaluate", str(tiny_model_dir), *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert set(report["tasks"]) == {"SST2", "MRPC", "align"} and report["averages"] == {}
    assert all(0 <= report["tasks"][t]["acc"] <= 1 for t in ("SST2", "MRPC"))
    assert set(report["tasks"]["align"]) == {"align", "uniform"}
    assert "MRPC" in result.stdout and "Avg." in result.stdout and "alignment" in result.stdout


def test_task_groups() -> None:
    from csekit.evaluation.sts import STS_TASKS
    from csekit.evaluation.suite import parse_tasks as _parse_tasks

    tasks = _parse_tasks("all")
    assert tasks.names("sts") == list(STS_TASKS) and tasks.names("dev") == []
    assert tasks.names("transfer") == list(TRANSFER_TASKS) and tasks.names("align") == ["align"]
    assert tasks.names() == [*STS_TASKS, "align", *TRANSFER_TASKS]  # the order they are encoded and reported in
    named = _parse_tasks("transfer,MR,stsb-dev", classifier="pytorch", n_jobs=2)
    assert named.names() == ["stsb-dev", *TRANSFER_TASKS]
    assert {(task.classifier, task.n_jobs) for task in named.of_kind("transfer")} == {("pytorch", 2)}
    with pytest.raises(CsekitError, match='did you mean "SUBJ"'):
        _parse_tasks("SUBJJ")

"""Evaluation as task objects (issue 66, item 1): a `TaskSet` reads each task once, encodes the union of its sentences
in one call, scores each task and computes the averages in one place; `csekit evaluate` and the trainer's dev scoring
score a user's file with the one scorer; `train.select_metric` reads `EvalResult.metrics()`, one flat view."""

from __future__ import annotations

import ast
import json
import math
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import add_sick_trial, make_corpus, make_data_dir, read_metrics, run_main, tiny_recipe
from hypothesis import given, settings
from hypothesis import strategies as st
from test_dev_selection import make_pairs, make_retrieval
from test_transfer import make_transfer_dir, marker_encoder

import csekit.evaluation.alignment
import csekit.evaluation.file_tasks
import csekit.evaluation.sts
import csekit.evaluation.transfer
from csekit.encoding.encoder import SentenceEncoder
from csekit.evaluation.alignment import AlignTask
from csekit.evaluation.file_tasks import FILE_TASK_SCORES, PairsTask, RetrievalTask, file_task_set
from csekit.evaluation.result import ALIGN_SCORES, EvalResult
from csekit.evaluation.retrieval_data import corpus_texts
from csekit.evaluation.sts import dev_tasks, evaluate_dev, sts_task
from csekit.evaluation.suite import parse_tasks
from csekit.evaluation.task_set import TaskSet, averages
from csekit.evaluation.tasks import DEV_SPLITS, file_task
from csekit.evaluation.transfer import TransferTask
from csekit.training.best_model import keep_if_best
from csekit.training.dev_scoring import score_dev
from csekit.training.dev_selection import dev_task_set
from csekit.training.recipe import load_recipe
from csekit.training.run_folder import TrainerState
from csekit.training.trainer import train

SRC = Path(__file__).resolve().parents[3] / "src" / "csekit"


def _data(root: Path) -> Path:
    """STS-B dev and test, a SICK trial and the transfer tasks' folders, in one data folder."""
    data = add_sick_trial(make_data_dir(root))
    stsb = data / "sts" / "STSBenchmark"
    (stsb / "sts-test.csv").write_text((stsb / "sts-dev.csv").read_text(encoding="utf-8"), encoding="utf-8")
    return make_transfer_dir(data, n=20)


def _spy(monkeypatch: pytest.MonkeyPatch, module: Any, name: str, reads: Counter[str], key: Callable) -> None:
    """Count the calls of `module.name` by `key(args)`, the reader still reading."""
    reader = getattr(module, name)

    def counted(*args: Any) -> Any:
        reads[key(args)] += 1
        return reader(*args)

    monkeypatch.setattr(module, name, counted)


def _every_kind(pairs: Path, folder: Path) -> TaskSet:
    """An STS split, both dev splits, alignment, a transfer task (two folds: fast), a pairs file, a retrieval folder."""
    senteval = parse_tasks("STSBenchmark,dev,align").joined(TaskSet([TransferTask("MR", k=2)]))
    return senteval.joined(file_task_set([file_task("pairs", pairs), file_task("retrieval", folder)]))


class RecordingEncoder:
    """`marker_encoder`, recording each call's sentences."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, sentences: list[str]) -> np.ndarray:
        self.calls.append(list(sentences))
        return marker_encoder(sentences)


# --- each task read once ------------------------------------------------------------------------------------------


def test_each_source_is_read_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same task twice is one task; a dev split and alignment on it share one read; reading again (run after
    read, the next evaluation of a training) reads nothing."""
    data = _data(tmp_path / "data")
    pairs = make_pairs(tmp_path / "domain.tsv")
    reads: Counter[str] = Counter()
    for module in (csekit.evaluation.sts, csekit.evaluation.alignment):
        _spy(monkeypatch, module, "load_sts_task", reads, lambda args: args[1])
    _spy(monkeypatch, csekit.evaluation.transfer, "load_transfer_task", reads, lambda args: args[1])
    _spy(monkeypatch, csekit.evaluation.file_tasks, "read_pairs", reads, lambda args: args[0].name)

    tasks = TaskSet(
        [
            sts_task("stsb-dev"),
            sts_task("STSBenchmark"),
            AlignTask("stsb-dev"),
            sts_task("stsb-dev"),
            TransferTask("MR", k=2),
            TransferTask("MR", k=2),
            PairsTask(file_task("pairs", pairs)),
            PairsTask(file_task("pairs", pairs)),
        ]
    )
    assert tasks.names() == ["stsb-dev", "STSBenchmark", "align", "MR", "pairs:domain"]
    tasks.read(data)
    first = tasks.run(marker_encoder, data)
    second = tasks.run(marker_encoder, data)
    assert reads == {"stsb-dev": 1, "STSBenchmark": 1, "MR": 1, "domain.tsv": 1}
    assert first == second

    reads.clear()
    parse_tasks("dev,stsb-dev,align,dev").run(marker_encoder, data)  # STS-B dev named thrice, align reads it too
    assert reads == {"stsb-dev": 1, "sick-dev": 1}


def test_a_training_reads_its_dev_tasks_once(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three evaluations (steps 0, 2, 4) of STS-B dev with alignment on it and a pairs file: each read once, when the
    run starts (each evaluation read STS-B dev again before)."""
    data = make_data_dir(tmp_path / "data")
    pairs = make_pairs(tmp_path / "domain.tsv")
    recipe = tiny_recipe(
        tiny_model_dir,
        make_corpus(tmp_path / "corpus.txt"),
        "train.max_steps=4",
        "train.eval_every=2",
        f"train.dev_task=[stsb-dev, 'pairs:{pairs}']",
    )
    # the recipe's check has read the pairs file; the run reads each task once more
    reads: Counter[str] = Counter()
    for module in (csekit.evaluation.sts, csekit.evaluation.alignment):
        _spy(monkeypatch, module, "load_sts_task", reads, lambda args: args[1])
    _spy(monkeypatch, csekit.evaluation.file_tasks, "read_pairs", reads, lambda args: args[0].name)
    train(recipe, tmp_path / "run", data_dir=data, show_progress=False)
    evaluations = [record for record in read_metrics(tmp_path / "run") if "stsb-dev" in record]
    assert [record["step"] for record in evaluations] == [0, 2, 4]
    assert reads == {"stsb-dev": 1, "domain.tsv": 1}


# --- one model pass ------------------------------------------------------------------------------------------------


def test_the_union_of_sentences_is_encoded_once(tmp_path: Path) -> None:
    """STS, dev splits, alignment, a transfer task and a pairs file: one encode call on their distinct sentences; a
    retrieval corpus and its queries are encoded apart, through the encoder itself."""
    data = _data(tmp_path / "data")
    pairs, folder = make_pairs(tmp_path / "domain.tsv"), make_retrieval(tmp_path / "helpdesk")
    tasks = _every_kind(pairs, folder)
    encoder = RecordingEncoder()
    result = tasks.run(encoder, data)
    tasks.read(data)
    union = list(dict.fromkeys(tasks.sentences()))
    first, *rest = encoder.calls
    assert first == union  # every distinct sentence once, in task order
    retrieval = tasks.data(tasks.of_kind("retrieval")[0])
    apart = {*retrieval.query_texts, *(text for chunk in corpus_texts(retrieval, 10**6) for text in chunk)}
    assert rest and {sentence for call in rest for sentence in call} <= apart
    assert list(result.tasks) == [
        "STSBenchmark",
        "stsb-dev",
        "sick-dev",
        "align",
        "MR",
        *tasks.names("pairs", "retrieval"),
    ]


# --- averages in one place, tasks loaded in one place ---------------------------------------------------------------

AVERAGE_NAMES = {"STS_AVERAGE", "AVG_STS", "TRANSFER_AVERAGE"}
AVERAGE_KEYS = {"avg", "avg_sts", "transfer_avg"}
TASK_READERS = {"load_sts_task", "load_transfer_task", "read_pairs", "read_retrieval_set"}
FILE_SCORERS = {"score_pairs", "evaluate_retrieval"}


def _is_average_key(node: ast.expr | None) -> bool:
    return (isinstance(node, ast.Name) and node.id in AVERAGE_NAMES) or (
        isinstance(node, ast.Constant) and node.value in AVERAGE_KEYS
    )


def _called(node: ast.Call) -> str:
    return node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")


def one_home_violations(source: str, where: str) -> list[str]:
    """What `source` does that only the task set and the task kinds may: define a function named for an average of
    tasks (`*_average`), write an average's key into a mapping, call a task's reader outside a `read` method or a
    file task's scorer outside a `score` method (the innermost function around a call decides)."""
    found: list[str] = []

    def visit(node: ast.AST, function: str) -> None:
        if isinstance(node, ast.FunctionDef):
            if node.name.endswith("_average"):  # sts_average, dev_average, transfer_average were three
                found.append(f"{where}:{node.lineno}: defines {node.name}")
            function = node.name
        if isinstance(node, ast.Call) and _called(node) in TASK_READERS and function != "read":
            found.append(f"{where}:{node.lineno}: {function} reads a task ({_called(node)})")
        if isinstance(node, ast.Call) and _called(node) in FILE_SCORERS and function != "score":
            found.append(f"{where}:{node.lineno}: {function} scores a file task ({_called(node)})")
        stored = isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store) and _is_average_key(node.slice)
        if stored or (isinstance(node, ast.Dict) and any(_is_average_key(key) for key in node.keys)):
            found.append(f"{where}:{node.lineno}: {function} writes an average")
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(ast.parse(source), "<module>")
    return found


def test_only_the_task_set_averages_and_only_task_objects_read_and_score_tasks() -> None:
    """The STS average was added, stripped and computed again in three files, each SentEval task read twice and a
    file task scored by two functions: now `task_set.py` alone averages, a task kind's `read` alone calls its
    reader, its `score` alone scores a file."""
    home = SRC / "evaluation" / "task_set.py"
    violations = [
        found
        for path in sorted(SRC.rglob("*.py"))
        if path != home
        for found in one_home_violations(path.read_text(encoding="utf-8"), str(path.relative_to(SRC)))
    ]
    assert violations == []
    assert one_home_violations(home.read_text(encoding="utf-8"), "task_set.py")  # the check sees the one home


def test_the_check_finds_an_average_or_a_read_elsewhere() -> None:
    source = (
        "def dev_average(scores):\n    return sum(scores.values()) / 2\n\n\n"
        "def report(scores):\n    scores['avg_sts'] = 0.5\n    return {AVG_STS: 1}\n\n\n"
        "def evaluate(root):\n    return load_sts_task(root, 'stsb-dev')\n\n\n"
        "class Pairs:\n    def read(self):\n        return read_pairs(self.path)\n\n"
        "    def score(self, encode, data):\n        def inner():\n            return score_pairs(encode, data)\n"
    )
    assert [line.split(": ", 1)[1] for line in one_home_violations(source, "x.py")] == [
        "defines dev_average",
        "report writes an average",
        "report writes an average",
        "evaluate reads a task (load_sts_task)",
        "inner scores a file task (score_pairs)",
    ]


def test_the_averages_are_the_means_of_their_tasks() -> None:
    sts = {task: {"all": 0.1 * i} for i, task in enumerate(("STS12", "STS13", "STS14", "STS15", "STS16"), start=1)}
    scores = {**sts, "STSBenchmark": {"test": 0.6}, "SICKRelatedness": {"test": 0.7}, "stsb-dev": 0.8}
    assert averages(scores) == {"avg": pytest.approx(0.4)}  # avg_sts needs sick-dev too
    assert averages({**scores, "sick-dev": 0.6}) == {"avg": pytest.approx(0.4), "avg_sts": pytest.approx(0.7)}
    assert averages({task: {"acc": 0.5} for task in ("MR", "CR", "SUBJ", "MPQA", "SST2", "TREC")}) == {}


# --- one file-task scorer ------------------------------------------------------------------------------------------


def test_evaluate_and_dev_scoring_give_a_file_task_the_same_numbers(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`csekit evaluate --pairs --retrieval --output` and a training's dev scoring of the same model on the same files
    (two scorers with two result shapes before): the same numbers, under the same flat keys."""
    pairs, folder = make_pairs(tmp_path / "domain.tsv"), make_retrieval(tmp_path / "helpdesk")
    report = tmp_path / "r.json"
    args = ["--pairs", str(pairs), "--retrieval", str(folder), "--batch-size", "8", "--output", str(report)]
    code, err = run_main(monkeypatch, capsys, "evaluate", str(tiny_model_dir), *args)
    assert code == 0, err
    evaluated = EvalResult.from_json(json.loads(report.read_text(encoding="utf-8")), "r.json")

    dev = dev_task_set([f"pairs:{pairs}", f"retrieval:{folder}"]).read()
    saved = SentenceEncoder.load(tiny_model_dir)
    scores = score_dev(saved, torch.nn.Identity(), load_recipe(None, []).train, "fp32", 8, dev)
    expected = [f"pairs:domain/{key}" for key in FILE_TASK_SCORES["pairs"]]
    expected += [f"retrieval:helpdesk/{key}" for key in FILE_TASK_SCORES["retrieval"]]
    assert list(scores) == list(evaluated.metrics()) == list(dev.selectable()) == expected
    assert scores == pytest.approx(evaluated.metrics(), abs=1e-9)
    assert evaluated.tasks["pairs:domain"]["pairs"] == 40 and evaluated.tasks["retrieval:helpdesk"]["queries"] == 8


def test_each_task_names_its_primary_score_in_the_flat_view(tmp_path: Path) -> None:
    data = _data(tmp_path / "data")
    pairs, folder = make_pairs(tmp_path / "domain.tsv"), make_retrieval(tmp_path / "helpdesk")
    tasks = _every_kind(pairs, folder)
    view = tasks.run(marker_encoder, data).metrics()
    assert tasks.primary_metrics() == {
        "STSBenchmark": "STSBenchmark/test",
        "stsb-dev": "stsb-dev",
        "sick-dev": "sick-dev",
        "align": "align",
        "MR": "MR/acc",
        "pairs:domain": "pairs:domain/spearman",
        "retrieval:helpdesk": "retrieval:helpdesk/ndcg@10",
    }
    assert set(tasks.primary_metrics().values()) <= set(view)
    assert {"MR/C", "MR/ndev", "pairs:domain/pairs", "retrieval:helpdesk/documents"}.isdisjoint(view)  # facts


# --- select_metric reads the flat view ----------------------------------------------------------------------------

STEMS = st.text(alphabet="abcdefghij0123456789_-", min_size=1, max_size=8)
SCORES = st.one_of(st.floats(-1, 1), st.just(math.nan))


@settings(max_examples=80, deadline=None)
@given(
    splits=st.lists(st.sampled_from(DEV_SPLITS), unique=True, max_size=2),
    pairs=st.lists(STEMS, unique=True, max_size=3),
    retrieval=st.lists(STEMS, unique=True, max_size=2),
    data=st.data(),
)
def test_select_metric_reads_the_flat_view(
    splits: list[str], pairs: list[str], retrieval: list[str], data: st.DataObject
) -> None:
    """Whatever dev tasks and file names: the view holds each split by its name, `avg_sts` with both, `align` and
    `uniform` with a split, each file task's scores as `KIND:NAME/score` and nothing else; what a training may
    select on is the view less the distances, in its order; the view read back from metrics.jsonl is itself; and
    `keep_if_best` keeps the score the view gives the selected key."""
    files = [file_task("pairs", Path(f"{stem}.tsv")) for stem in pairs]
    files += [file_task("retrieval", Path("folders") / stem) for stem in retrieval]
    tasks = TaskSet(dev_tasks(splits, align_uniform=True)).joined(file_task_set(files))
    scores: dict[str, Any] = {split: data.draw(SCORES) for split in splits}
    if splits:
        scores["align"] = {key: data.draw(st.floats(0, 4)) for key in ALIGN_SCORES}
    for task in tasks.of_kind("pairs"):
        scores[task.name] = {"spearman": data.draw(SCORES), "pearson": data.draw(SCORES), "pairs": 9, "skipped": 1}
    for task in tasks.of_kind("retrieval"):
        metrics = {key: data.draw(st.floats(0, 1)) for key in FILE_TASK_SCORES["retrieval"]}
        scores[task.name] = {**metrics, "queries": 3, "documents": 7}
    result = EvalResult(scores, averages(scores))
    view = result.metrics()

    file_keys = [
        f"{task.name}/{key}" for task in tasks.of_kind("pairs", "retrieval") for key in FILE_TASK_SCORES[task.kind]
    ]
    both = ["avg_sts"] if len(splits) == 2 else []
    assert list(view) == [*splits, *both, *(ALIGN_SCORES if splits else ()), *file_keys]
    assert list(tasks.selectable()) == [key for key in view if key not in ALIGN_SCORES]
    assert EvalResult.from_dev_scores(view).metrics().keys() == view.keys()
    assert all(_same(EvalResult.from_dev_scores(view).metrics()[key], value) for key, value in view.items())
    if tasks.selectable():
        metric = data.draw(st.sampled_from(tasks.selectable()))
        state = TrainerState()
        keep_if_best(state, view, metric)
        assert _same(state.best_score, view[metric]) and state.start_scores == view


def _same(one: Any, other: Any) -> bool:
    return one == other or (
        isinstance(one, float) and isinstance(other, float) and math.isnan(one) and math.isnan(other)
    )


def test_evaluate_dev_gives_the_view_a_training_logs(tmp_path: Path) -> None:
    data = add_sick_trial(make_data_dir(tmp_path / "data"))
    scores = evaluate_dev(marker_encoder, data, ["stsb-dev", "sick-dev"], align_uniform=True)
    assert list(scores) == ["stsb-dev", "sick-dev", "avg_sts", "align", "uniform"]  # metrics.jsonl's order
    assert list(evaluate_dev(marker_encoder, data, "sick-dev", align_uniform=True)) == ["sick-dev", "align", "uniform"]
    assert scores["avg_sts"] == pytest.approx((scores["stsb-dev"] + scores["sick-dev"]) / 2)
    assert isinstance(TaskSet(dev_tasks(["sick-dev"], True)).tasks[1], AlignTask)
    assert [type(task) for task in file_task_set([file_task("retrieval", tmp_path)])] == [RetrievalTask]

"""End-to-end training of a tiny random model: falling loss, outputs, metrics, errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import WORDS, TinyRun, TinyTrainer, add_sick_trial, make_data_dir, read_metrics, run_cli, tiny_recipe

from csekit.core.errors import CsekitError
from csekit.encoding.encoder import SentenceEncoder
from csekit.training.recipe import load_recipe
from csekit.training.trainer import train


def test_tiny_model_trains_with_falling_loss(train_tiny: TinyTrainer) -> None:
    # Mean pooling: a random model's [CLS] state carries too little to learn from in 30 steps.
    run = train_tiny("train.lr=1e-3", "model.pooler=mean", steps=30, lines=256)
    assert run.result.steps == 30
    losses = [r["loss"] for r in run.losses]
    assert len(losses) == 30
    assert np.mean(losses[-5:]) < 0.8 * np.mean(losses[:5])
    for name in ("best", "last", "checkpoint", "recipe.yaml"):
        assert (run.folder / name).exists()
    record = run.metrics[1]
    assert {"step", "loss", "infonce", "lr", "sentences_per_second"} <= set(record)
    reloaded = SentenceEncoder.load(run.folder / "best")
    assert reloaded.encode(["a man plays"]).shape == (1, 32)


def assert_best_is_the_best_evaluation(run: TinyRun, data: Path, metric: str, steps: list[int]) -> None:
    """The run evaluated at `steps` (0: the starting model), kept the step with the best `metric` in best/, and
    best/ holds that step's weights: re-scoring it reproduces the logged score."""
    from csekit.evaluation.sts import evaluate_dev

    evaluations = [r for r in run.metrics if metric in r]
    assert [r["step"] for r in evaluations] == steps
    best = max(evaluations, key=lambda r: r[metric])
    assert (run.result.best_step, run.result.best_score) == (best["step"], pytest.approx(best[metric]))
    model = SentenceEncoder.load(run.folder / "best")
    assert model.pooler.name == "mean"
    tasks = ["stsb-dev", "sick-dev"] if metric == "avg_sts" else metric
    assert evaluate_dev(model.encode, data, tasks)[metric] == pytest.approx(best[metric], abs=1e-6)


def test_dev_evaluation_selects_the_best_checkpoint(tmp_path: Path, train_tiny: TinyTrainer) -> None:
    data = make_data_dir(tmp_path / "data")
    run = train_tiny("train.dev_task=stsb-dev", "model.pooler=mean", steps=6, eval_every=2, lines=256, data_dir=data)
    assert_best_is_the_best_evaluation(run, data, "stsb-dev", [0, 2, 4, 6])


def test_refuses_to_overwrite_a_finished_run(train_tiny: TinyTrainer) -> None:
    run = train_tiny(steps=2, lines=256)
    with pytest.raises(CsekitError, match="already holds a run"):
        train(run.recipe, run.folder, show_progress=False)


def test_corpus_smaller_than_a_batch_is_an_error(train_tiny: TinyTrainer) -> None:
    with pytest.raises(CsekitError, match=r"fewer than train\.batch_size"):
        train_tiny(lines=5)


def test_cli_bad_corpus_is_one_line_with_exit_status_2(tmp_path: Path, tiny_model_dir: Path) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"good line\n\xff\xfe broken\n")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"model:\n  backbone: {tiny_model_dir}\ndata:\n  corpus: {bad}\ntrain:\n  dev_task: none\n")
    result = run_cli("train", str(recipe), "--output", str(tmp_path / "out"), cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert f"{bad}:2: not valid UTF-8" in result.stderr and "Traceback" not in result.stderr


def test_cli_encode_writes_one_row_per_line(tmp_path: Path, tiny_model_dir: Path) -> None:
    (tmp_path / "in.txt").write_text("a man plays\n\nthe dog runs\n", encoding="utf-8")
    result = run_cli("encode", str(tiny_model_dir), "--input", "in.txt", "--output", "out.npy", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert np.load(tmp_path / "out.npy").shape == (3, 32)


def test_nan_dev_scores_never_win_the_selection() -> None:
    from csekit.training.best_model import improves as _improves

    assert _improves(float("nan"), None)
    assert not _improves(float("nan"), 0.2)
    assert _improves(0.1, float("nan"))
    assert _improves(0.3, 0.2) and not _improves(0.2, 0.3)


def test_cli_evaluate_writes_the_documented_json(tmp_path: Path, tiny_model_dir: Path, data_dir: Path) -> None:
    result = run_cli("evaluate", str(tiny_model_dir), "--data-dir", str(data_dir), "--output", "r.json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "| STS12 | STS13 | STS14 | STS15 | STS16 | STS-B | SICK-R |  Avg. |" in result.stdout
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["model"] == str(tiny_model_dir) and report["pooler"] == "cls"
    tasks = report["tasks"]
    assert list(tasks) == ["STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark", "SICKRelatedness"]
    for year in ("STS12", "STS13", "STS14", "STS15", "STS16"):
        assert set(tasks[year]) == {"all", "mean", "wmean"}
    headline = [tasks[y]["all"] for y in ("STS12", "STS13", "STS14", "STS15", "STS16")]
    headline += [tasks["STSBenchmark"]["test"], tasks["SICKRelatedness"]["test"]]
    assert all(-1 <= x <= 1 for x in headline)
    assert report["averages"]["avg"] == pytest.approx(np.mean(headline))


def test_cli_evaluate_dev_task(tmp_path: Path, tiny_model_dir: Path) -> None:
    data = make_data_dir(tmp_path / "data")
    result = run_cli(
        "evaluate",
        str(tiny_model_dir),
        "--tasks",
        "stsb-dev",
        "--pooler",
        "mean",
        "--data-dir",
        str(data),
        "--output",
        "r.json",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["pooler"] == "mean" and set(report["tasks"]) == {"stsb-dev"} and report["averages"] == {}


def test_cli_unknown_task_and_missing_data_dir(tmp_path: Path, tiny_model_dir: Path) -> None:
    result = run_cli("evaluate", str(tiny_model_dir), "--tasks", "STS21", cwd=tmp_path)
    assert result.returncode == 2 and 'unknown task "STS21"' in result.stderr
    env_free = run_cli("evaluate", str(tiny_model_dir), "--data-dir", str(tmp_path / "nowhere"), cwd=tmp_path)
    assert env_free.returncode == 2 and "CSEKIT_DATA" in env_free.stderr


FAULTS_PER_REALLOCATION = """
import resource, sys, torch
import csekit.training.trainer  # what a training process has imported (the heap's state depends on it)
from csekit.training.processes import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
for _ in range(2):  # blocks of the vocabulary gradient's size; the heap grows to hold them
    torch.ones(48 << 20, dtype=torch.uint8)
counts = []
for _ in range(5):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    torch.ones(48 << 20, dtype=torch.uint8)
    counts.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(sorted(counts)[2])  # the median: now and then one block comes from fresh pages even when kept
"""


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_freed_memory_is_reused_without_page_faults() -> None:
    """48 MB freed and allocated again: about 12,000 page faults each time, unless glibc keeps the block."""

    def faults(mode: str) -> int:
        result = subprocess.run(
            [sys.executable, "-c", FAULTS_PER_REALLOCATION, mode], capture_output=True, text=True, check=True
        )
        return int(result.stdout.split()[-1])

    assert faults("default") > 10_000
    assert faults("keep") < 100


LONG_SENTENCES = [
    " ".join(WORDS[i % len(WORDS)] for i in range(start, start + 40)) for start in range(0, 120, 17)
]  # 40 words each: far beyond the training max_length of 8 tokens, within the tiny model's 64 positions


@pytest.mark.parametrize(
    "parts",
    [
        ["model.pooler=cls"],  # SimCSE
        [  # WhitenedCSE with its head kept at test time (exported as a folded Dense layer)
            "model.pooler=cls",
            "model.head={name: whitening, whitening: shuffled_group, num_groups: 8, num_positives: 3}",
            "model.head_at_test=true",
            "objectives=[{name: multi_positive, temperature: 0.05}]",
        ],
    ],
    ids=["simcse", "whitenedcse-head"],
)
def test_a_trained_model_encodes_untruncated_and_sentence_transformers_agrees(
    train_tiny: TinyTrainer, parts: list[str]
) -> None:
    """model.max_length bounds training only: evaluation, encode and the export see whole sentences."""
    st = pytest.importorskip("sentence_transformers")
    best = train_tiny("model.max_length=8", *parts, lines=256).folder / "best"
    encoder = SentenceEncoder.load(best)
    ours = encoder.encode(LONG_SENTENCES)

    truncated = [
        encoder.tokenizer.decode(encoder.tokenizer(s, truncation=True, max_length=8)["input_ids"][1:-1])
        for s in LONG_SENTENCES
    ]
    assert not np.allclose(ours, encoder.encode(truncated), atol=1e-4)  # the words past token 8 count
    config = json.loads((best / "sentence_bert_config.json").read_text())
    assert config["max_seq_length"] == encoder.max_seq_length == 64  # the backbone's limit, not 8

    theirs = st.SentenceTransformer(str(best), device="cpu").encode(LONG_SENTENCES)
    cosine = (ours * theirs).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(theirs, axis=1)
    assert cosine.min() >= 0.9999


def test_selection_on_avg_sts_evaluates_both_dev_sets(tmp_path: Path, train_tiny: TinyTrainer) -> None:
    """SimCSE's and DCLR's eval_avg_sts: the mean of STS-B dev and SICK-R dev picks the best model."""
    data = add_sick_trial(make_data_dir(tmp_path / "data"))
    selection = ("train.dev_task=sts", "train.select_metric=avg_sts", "model.pooler=mean")
    run = train_tiny(*selection, steps=4, eval_every=2, lines=256, data_dir=data)
    for record in (r for r in run.metrics if "avg_sts" in r):
        assert record["avg_sts"] == pytest.approx((record["stsb-dev"] + record["sick-dev"]) / 2)
    assert_best_is_the_best_evaluation(run, data, "avg_sts", [0, 2, 4])


def test_select_metric_must_be_a_score_of_the_dev_task() -> None:
    with pytest.raises(CsekitError, match=r"avg_sts.*not a score of dev_task stsb-dev; choose stsb-dev"):
        load_recipe(None, ["train.dev_task=stsb-dev", "train.select_metric=avg_sts"])
    with pytest.raises(CsekitError, match='unknown dev task "stsb"'):
        load_recipe(None, ["train.dev_task=stsb"])
    assert load_recipe(None, ["train.dev_task=none", "train.select_metric=anything"]).train.dev_task == "none"


def test_a_run_interrupted_and_resumed_writes_the_records_of_a_straight_run(
    tmp_path: Path, tiny_model_dir: Path, corpus: Path, test_parts: None
) -> None:
    """metrics.jsonl of a run that crashed at step 5 and was resumed from step 4: the straight run's records.

    Locks the loop's records (which, in which order, with which keys) and its bit-exact resume, dev evaluation
    included: the same losses, lr and dev scores at every step.
    """
    data = make_data_dir(tmp_path / "data")
    marker = tmp_path / "raised"

    def run(output: Path, resume: bool = False) -> None:
        recipe = tiny_recipe(
            tiny_model_dir,
            corpus,
            "train.max_steps=6",
            "train.eval_every=2",
            "train.log_every=2",
            "train.dev_task=stsb-dev",
            "model.pooler=mean",
            f"objectives=[{{name: infonce}}, {{name: raise_once, weight: 0.0, at_call: 5, marker: '{marker}'}}]",
        )
        train(recipe, output, data_dir=data, resume=resume, show_progress=False)

    marker.write_text("not this run", encoding="utf-8")
    run(tmp_path / "straight")
    marker.unlink()
    with pytest.raises(RuntimeError, match="crash for the test"):
        run(tmp_path / "resumed")
    run(tmp_path / "resumed", resume=True)

    straight, resumed = read_metrics(tmp_path / "straight"), read_metrics(tmp_path / "resumed")
    loss_keys = {"step", "loss", "infonce", "raise_once", "lr", "sentences_per_second"}
    dev_keys = {"step", "stsb-dev", "align", "uniform"}
    assert [(r["step"], set(r)) for r in straight] == [
        (0, {"event", "step", "corpus", "total_steps", "processes", "precision", "duplicates", "long_sentences"}),
        (0, dev_keys),  # the starting model
        (2, loss_keys),
        (2, dev_keys),
        (4, loss_keys),
        (4, dev_keys),
        (6, loss_keys),
        (6, dev_keys),
    ]
    without_timing = [{k: v for k, v in r.items() if k != "sentences_per_second"} for r in straight]
    assert [{k: v for k, v in r.items() if k != "sentences_per_second"} for r in resumed] == without_timing

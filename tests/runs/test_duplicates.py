"""data.duplicates: keep, drop or separate the copies of a sentence; the report at the start of a run."""

from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from accelerate.data_loader import prepare_data_loader
from conftest import DISTINCT_SENTENCES, TinyTrainer, read_metrics, run_cli, tiny_recipe
from test_distributed import free_port
from torch.utils.data import DataLoader

from csekit.core.errors import CsekitError
from csekit.data.corpus import Corpus
from csekit.data.duplicates import (
    SentenceGroups,
    SeparatingSampler,
    normalise_sentence,
    share_of_batches_with_a_duplicate,
)
from csekit.training.recipe import load_recipe
from csekit.training.trainer import train

SENTENCES = DISTINCT_SENTENCES[:8]


def eight_by_eight(path: Path) -> Path:
    """8 sentences x 8 copies, each sentence's copies on consecutive lines (64 lines)."""
    path.write_text("".join(f"{sentence}\n" * 8 for sentence in SENTENCES), encoding="utf-8")
    return path


def recorded_batches(path: Path, rank: int = 0) -> list[list[str]]:
    file = Path(f"{path}.{rank}")
    return [json.loads(line) for line in file.read_text(encoding="utf-8").splitlines()]


def recording(path: Path, *extra: str) -> list[str]:
    """Recipe overrides: InfoNCE plus the test part that writes each step's sentences to `path`."""
    return [f"objectives=[{{name: infonce}}, {{name: record_batches, path: '{path}'}}{''.join(extra)}]"]


def test_share_of_batches_with_a_duplicate_equals_counting_every_batch() -> None:
    counts = [3, 2, 2, 1, 1, 1]
    rows = [sentence for sentence, count in enumerate(counts) for _ in range(count)]
    for batch_size in range(1, len(rows) + 1):
        batches = list(itertools.combinations(rows, batch_size))
        with_pair = sum(len(set(batch)) < batch_size for batch in batches) / len(batches)
        assert share_of_batches_with_a_duplicate(counts, batch_size) == pytest.approx(with_pair, abs=1e-12)
    # 8 x 8 in batches of 8: only the batches holding one copy of each sentence are free of pairs
    assert share_of_batches_with_a_duplicate([8] * 8, 8) == pytest.approx(1 - 8**8 / math.comb(64, 8), rel=1e-12)


def test_normalisation_compares_case_surrounding_space_and_final_punctuation() -> None:
    assert normalise_sentence("  A man is playing a guitar .  ") == "a man is playing a guitar"
    assert normalise_sentence("Is it?!") == "is it"
    assert normalise_sentence("a man, playing") == "a man, playing"  # inner punctuation stays
    texts = ["B", "A man is playing a guitar", "b", "a man is playing a guitar .", "c"]
    assert SentenceGroups.of(texts).distinct == 5
    normalised = SentenceGroups.of(texts, normalise=True)
    assert normalised.distinct == 3
    assert normalised.distinct_rows() == [0, 1, 4]  # the first occurrence of each, in corpus order
    assert normalised.most_repeated() == (0, 2)


def test_separate_puts_no_two_copies_in_a_batch_and_keeps_every_copy(
    tmp_path: Path, train_tiny: TinyTrainer, test_parts: None
) -> None:
    record = tmp_path / "batches"
    extra = ["data.duplicates=separate", "train.batch_size=8", *recording(record)]
    train_tiny(*extra, steps=16, corpus=eight_by_eight(tmp_path / "corpus.txt"))
    batches = recorded_batches(record)
    assert len(batches) == 16
    assert all(sorted(batch) == sorted(SENTENCES) for batch in batches)  # 8 distinct in each batch
    for epoch in (batches[:8], batches[8:]):  # every copy in every epoch
        assert sorted(sentence for batch in epoch for sentence in batch) == sorted(SENTENCES * 8)
    assert batches[:8] != batches[8:]  # each epoch its own order


def test_separate_is_deterministic_for_a_seed_and_holds_for_every_epoch() -> None:
    groups = SentenceGroups.of([f"s{i % 9}" for i in range(90)] + [f"t{i}" for i in range(70)])  # 10 copies, 10 batches
    first, again, other = (SeparatingSampler(groups, 16, seed) for seed in (1, 1, 2))
    for epoch in range(4):
        for sampler in (first, again, other):
            sampler.set_epoch(epoch)
        batches = first.epoch_batches()
        assert batches.shape == (10, 16)
        assert all(len(set(groups.group_of[batch].tolist())) == 16 for batch in batches)
        assert list(first) == list(again)
        assert list(first) != list(other)


def test_separate_holds_for_each_global_batch_across_two_processes(tmp_path: Path) -> None:
    """Each process's share comes through accelerate's sharding of the loader, as the trainer prepares it."""
    corpus = Corpus(eight_by_eight(tmp_path / "corpus.txt"))
    sampler = SeparatingSampler(SentenceGroups.of(corpus[i] for i in range(len(corpus))), 8, seed=3)
    shares = []
    for rank in (0, 1):
        loader = DataLoader(corpus, batch_size=4, sampler=sampler, drop_last=True, collate_fn=list)
        shards = prepare_data_loader(loader, num_processes=2, process_index=rank, put_on_device=False)
        shards.set_epoch(1)
        shares.append(list(shards))
    assert len(shares[0]) == len(shares[1]) == 8
    for first_half, second_half in zip(*shares, strict=True):
        assert len(first_half) == len(second_half) == 4
        assert sorted(first_half + second_half) == sorted(SENTENCES)


@pytest.mark.slow
def test_separate_on_two_real_processes(tmp_path: Path, tiny_model_dir: Path, test_parts: None) -> None:
    """torchrun, 2 processes, batch 8 (4 a process): the two shares of each step hold 8 distinct sentences."""
    from parts_for_tests import write_entry_points

    corpus = eight_by_eight(tmp_path / "corpus.txt")
    record = tmp_path / "batches"
    recipe = tiny_recipe(
        tiny_model_dir,
        corpus,
        "data.duplicates=separate",
        "train.batch_size=8",
        "train.max_steps=10",
        *recording(record),
    )
    recipe_file = tmp_path / "recipe.yaml"
    recipe_file.write_text(recipe.to_yaml(), encoding="utf-8")
    tests = Path(__file__).resolve().parents[1]
    path = [str(tests), str(write_entry_points(tmp_path / "plugin")), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path), "OMP_NUM_THREADS": "1"}
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(free_port()),
    ]
    command += ["-m", "csekit.cli", "train", str(recipe_file), "--output", str(tmp_path / "out"), "--no-progress"]
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    shares = recorded_batches(record, 0), recorded_batches(record, 1)
    assert len(shares[0]) == len(shares[1]) == 10
    for first_half, second_half in zip(*shares, strict=True):
        assert sorted(first_half + second_half) == sorted(SENTENCES)
    assert read_metrics(tmp_path / "out")[0]["processes"] == 2


def test_drop_trains_on_the_distinct_sentences(tmp_path: Path, train_tiny: TinyTrainer, test_parts: None) -> None:
    record = tmp_path / "batches"
    extra = ["data.duplicates=drop", "train.batch_size=4", *recording(record)]
    run = train_tiny(*extra, steps=4, corpus=eight_by_eight(tmp_path / "corpus.txt"))
    batches = recorded_batches(record)
    for epoch in (batches[:2], batches[2:]):  # 8 rows: two batches of 4 an epoch
        assert sorted(epoch[0] + epoch[1]) == sorted(SENTENCES)
    start = run.metrics[0]
    assert start["duplicates"]["training_rows"] == 8


def test_resume_mid_epoch_continues_the_same_batches(tmp_path: Path, tiny_model_dir: Path, test_parts: None) -> None:
    """A crash in step 7 of 12 (8 batches an epoch), resumed from step 6's checkpoint: the straight run's batches."""
    corpus = eight_by_eight(tmp_path / "corpus.txt")
    marker = tmp_path / "raised"

    def run(name: str, resume: bool = False) -> None:
        extra = ["data.duplicates=separate", "train.batch_size=8", "train.max_steps=12", "train.eval_every=3"]
        crash = f", {{name: raise_once, weight: 0.0, at_call: 7, marker: '{marker}'}}"
        recipe = tiny_recipe(tiny_model_dir, corpus, *extra, *recording(tmp_path / name, crash))
        train(recipe, tmp_path / f"run-{name}", resume=resume, show_progress=False)

    marker.write_text("not this run", encoding="utf-8")
    run("straight")
    marker.unlink()
    with pytest.raises(RuntimeError, match="crash for the test"):
        run("resumed")
    run("resumed", resume=True)
    straight, resumed = recorded_batches(tmp_path / "straight"), recorded_batches(tmp_path / "resumed")
    assert len(straight) == 12
    assert resumed == straight[:7] + straight[6:]  # steps 1-7 (7 crashed), then 7-12 again from the checkpoint


def test_an_unsatisfiable_corpus_is_one_line_with_the_fix(tmp_path: Path, tiny_model_dir: Path) -> None:
    """One sentence 100 times among 1,100 rows, batch 64: 17 batches cannot hold 100 copies one each."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the same sentence\n" * 100 + "".join(f"sentence number {i}\n" for i in range(1000)))
    with pytest.raises(CsekitError) as caught:
        train(
            tiny_recipe(tiny_model_dir, corpus, "data.duplicates=separate", "train.batch_size=64"),
            tmp_path / "run",
            show_progress=False,
        )
    message = str(caught.value)
    assert "cannot keep apart the 100 copies of 'the same sentence'" in message
    assert "only 17 batches of 64" in message
    assert "train.batch_size: 11 or less" in message and "data.duplicates: drop" in message
    assert not (tmp_path / "run").exists()  # decided before anything is written
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        f"model:\n  backbone: {tiny_model_dir}\ndata:\n  corpus: {corpus}\n  duplicates: separate\n"
        "train:\n  dev_task: none\n"
    )
    result = run_cli("train", str(recipe), "--output", str(tmp_path / "out"), cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "cannot keep apart the 100 copies" in result.stderr


def test_the_start_reports_the_duplicates_in_the_log_and_metrics(
    tmp_path: Path, train_tiny: TinyTrainer, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = eight_by_eight(tmp_path / "corpus.txt")
    with corpus.open("a", encoding="utf-8") as handle:
        handle.write("A man plays the guitar.\n" * 3)  # the same sentence to a reader
    start = train_tiny("train.batch_size=8", "data.duplicates_normalise=true", steps=1, corpus=corpus).metrics[0]
    assert start["event"] == "start"
    report = start["duplicates"]
    assert report["mode"] == "keep" and report["normalise"] is True
    assert (report["sentences"], report["distinct"], report["training_rows"]) == (67, 8, 67)
    assert (report["most_repeated"], report["most_repeated_count"]) == ("a man plays the guitar", 11)
    expected = share_of_batches_with_a_duplicate([11] + [8] * 7, 8)
    assert report["share_with_duplicate_under_keep"] == pytest.approx(expected)
    log = capsys.readouterr().err
    assert "8 distinct sentences among 67 after normalisation" in log
    assert "(11 times): 'a man plays the guitar'" in log and f"{100 * expected:.1f}% of random batches of 8" in log


def test_data_duplicates_takes_only_its_modes() -> None:
    with pytest.raises(CsekitError, match=r"recipe key data\.duplicates must be one of keep, drop, separate"):
        load_recipe(None, ["data.duplicates=sometimes"])
    assert load_recipe(None, []).data.duplicates == "keep"

"""Hostile files II (issue #39): links where csekit writes, names that leave their folder, reads that block or
never end, and values in run files that bench trusted. Each case failed (wrote outside the folder, hung, ran out
of memory or gave a traceback) before the mechanism in core/ that now guards it.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_one_line_error, make_corpus, run_main, train_finished_run, write_recipe

from csekit.core.errors import CsekitError

CaptureErr = pytest.CaptureFixture[str]
HANG_LIMIT_S = 120
"""A command that should fail in a second is killed after this long, so a regression fails instead of hanging."""


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-step run with a checkpoint at step 2, and its recipe file (copy the run before changing it)."""
    return train_finished_run(tmp_path_factory.mktemp("finished"))


@pytest.fixture
def run(finished_run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(finished_run / "run", tmp_path / "run", symlinks=True))


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`csekit ARGS` in a fresh interpreter, killed after HANG_LIMIT_S (a hang fails the test, not the suite)."""
    try:
        return subprocess.run(
            [sys.executable, "-m", "csekit.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=HANG_LIMIT_S
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"csekit {' '.join(args)} hung for {HANG_LIMIT_S} s")


def assert_one_line(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert_one_line_error(result.returncode, result.stderr, *needles)


# --- 1. csekit never writes through a link in a folder it owns ----------------------------------------


def test_a_dangling_metrics_link_is_not_followed_by_a_new_run(
    finished_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr
) -> None:
    """The link made `.exists()` false, so the folder looked empty and the run created the link's target outside."""
    output, outside = tmp_path / "out", tmp_path / "elsewhere" / "stolen.jsonl"
    output.mkdir()
    outside.parent.mkdir()
    (output / "metrics.jsonl").symlink_to(outside)
    code, err = run_main(
        monkeypatch, capsys, "train", str(finished_run / "recipe.yaml"), "--output", str(output), "--no-progress"
    )
    assert_one_line_error(code, err, "metrics.jsonl", "symbolic link")
    assert not outside.exists()


@pytest.mark.parametrize("to_a_file", [False, True], ids=["dangling", "to-a-file"])
def test_a_metrics_link_is_neither_followed_nor_appended_to_on_resume(
    to_a_file: bool, run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr
) -> None:
    """A dangling link would make its target outside the run; a link to someone's file would append to it."""
    target = tmp_path / "victim.txt"
    if to_a_file:
        target.write_text("mine\n", encoding="utf-8")
    (run / "metrics.jsonl").unlink()
    (run / "metrics.jsonl").symlink_to(target)
    code, err = run_main(monkeypatch, capsys, "train", "--output", str(run), "--resume", "--no-progress")
    assert_one_line_error(code, err, "metrics.jsonl", "symbolic link")
    if to_a_file:
        assert target.read_text(encoding="utf-8") == "mine\n"
    else:
        assert not target.exists()


def test_a_link_left_at_a_backup_name_is_never_adopted(tmp_path: Path) -> None:
    """`best.old` that is a link (and no `best`): recover_directory renamed the link into place as the model."""
    from csekit.core.atomic import recover_directory

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "best.old").symlink_to(elsewhere)
    with pytest.raises(CsekitError, match=r"best\.old.*link"):
        recover_directory(tmp_path / "best")
    assert not (tmp_path / "best").exists() and not (tmp_path / "best").is_symlink()


def test_swapping_in_refuses_a_link_at_the_backup_name(tmp_path: Path) -> None:
    from csekit.core.atomic import swap_in

    elsewhere, target, staged = tmp_path / "elsewhere", tmp_path / "out" / "best", tmp_path / "out" / ".staged"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("keep", encoding="utf-8")
    staged.mkdir(parents=True)
    target.mkdir()
    (tmp_path / "out" / "best.old").symlink_to(elsewhere)
    with pytest.raises(CsekitError, match="link"):
        swap_in(staged, target)
    assert (elsewhere / "keep.txt").read_text(encoding="utf-8") == "keep" and target.is_dir()


# --- 2. a name from a file never becomes a path outside its folder ------------------------------------


@pytest.mark.parametrize("name", ["../../x", "/tmp/abs-x", "a/b", "..", "x\\y", "a\x00b"])
def test_a_suite_recipe_name_cannot_leave_the_output_folder(tmp_path: Path, name: str) -> None:
    from csekit.bench import load_suite

    (tmp_path / "a.yaml").write_text("name: a\n", encoding="utf-8")
    suite = tmp_path / "suite.yaml"
    suite.write_text(f"recipes:\n  - recipe: a.yaml\n    name: {json.dumps(name)}\n", encoding="utf-8")
    with pytest.raises(CsekitError, match=r"suite\.yaml:3: .*name"):
        load_suite(suite)


def test_bench_trains_nothing_outside_output_for_a_hostile_name(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr
) -> None:
    recipe = write_recipe(tmp_path, tiny_model_dir, make_corpus(tmp_path / "corpus.txt", lines=32), "  max_steps: 1\n")
    suite = tmp_path / "suites" / "s.yaml"
    suite.parent.mkdir()
    suite.write_text(f"recipes:\n  - {{recipe: {recipe}, name: ../../escaped}}\n", encoding="utf-8")
    code, err = run_main(monkeypatch, capsys, "bench", str(suite), "--output", str(tmp_path / "a" / "b"))
    assert_one_line_error(code, err, "s.yaml:2")
    assert not list(tmp_path.glob("escaped*"))


def test_child_path_refuses_a_link_that_leaves_the_folder(tmp_path: Path) -> None:
    from csekit.core.safe_names import child_path

    folder, outside = tmp_path / "folder", tmp_path / "outside"
    folder.mkdir()
    outside.mkdir()
    (folder / "inside").mkdir()
    (folder / "away").symlink_to(outside)
    (folder / "near").symlink_to(folder / "inside")
    assert child_path(folder, "inside", "test") == folder / "inside"
    assert child_path(folder, "near", "test") == folder / "near"  # a link that stays inside is fine
    with pytest.raises(CsekitError, match=r"away.*outside"):
        child_path(folder, "away", "test")
    assert child_path(folder, "1_Pooling/sub", "test", nested=True) == folder / "1_Pooling" / "sub"
    assert child_path(folder, "", "test", nested=True) == folder
    for bad in ("../x", "/etc", "a/../../x"):
        with pytest.raises(CsekitError):
            child_path(folder, bad, "test", nested=True)


# --- 3. reads are bounded and never block -------------------------------------------------------------


def test_resume_with_a_fifo_as_metrics_is_one_line_not_a_hang(run: Path) -> None:
    (run / "metrics.jsonl").unlink()
    os.mkfifo(run / "metrics.jsonl")
    result = cli("train", "--output", str(run), "--resume", "--no-progress", cwd=run.parent)
    assert_one_line(result, "metrics.jsonl", "not a regular file")


def _summary_suite(tmp_path: Path) -> tuple[Path, Path]:
    """A suite of one recipe `m` over seed 1 and its output folder with the run folder `m-seed1` (no files yet)."""
    (tmp_path / "a.yaml").write_text("name: a\n", encoding="utf-8")
    suite = tmp_path / "suite.yaml"
    suite.write_text("seeds: [1]\nrecipes:\n  - {recipe: a.yaml, name: m}\n", encoding="utf-8")
    out = tmp_path / "bench"
    (out / "m-seed1").mkdir(parents=True)
    return suite, out


GOOD_RESULTS = {"recipe": "m", "seed": 1, "tasks": {"STS12": {"all": 0.5}}, "avg": 0.5}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_summary_only_with_a_results_fifo_or_endless_device_is_one_line(tmp_path: Path, kind: str) -> None:
    suite, out = _summary_suite(tmp_path)
    results = out / "m-seed1" / "results.json"
    if kind == "fifo":
        os.mkfifo(results)
    else:
        results.symlink_to("/dev/zero")
    result = cli("bench", str(suite), "--output", str(out), "--summary-only", cwd=tmp_path)
    assert_one_line(result, "results.json", "not a regular file")


@pytest.mark.parametrize(
    ("file", "content", "needle"),
    [
        ("results.json", b"{not json", "results.json:1"),
        ("results.json", b"[1, 2]", "results.json"),
        ("results.json", json.dumps({**GOOD_RESULTS, "wall_seconds": {"train": "x"}}).encode(), "results.json"),
        ("metrics.jsonl", b'{"step": 1, "align": "x", "uniform": 1.0}\n', "metrics.jsonl:1"),
        ("metrics.jsonl", b'{"step": "one", "align": 0.1, "uniform": 1.0}\n', "metrics.jsonl:1"),
        ("metrics.jsonl", b"[1]\n", "metrics.jsonl:1"),
        ("cosines.npy", None, "cosines.npy"),
    ],
    ids=["not-json", "a-list", "wall-text", "align-text", "step-text", "record-list", "object-array"],
)
def test_a_bad_run_file_in_a_bench_summary_is_one_line(
    tmp_path: Path, file: str, content: bytes | None, needle: str, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr
) -> None:
    suite, out = _summary_suite(tmp_path)
    folder = out / "m-seed1"
    (folder / "results.json").write_text(json.dumps(GOOD_RESULTS), encoding="utf-8")
    if content is None:
        np.save(folder / file, np.array([{"a": 1}, 2], dtype=object), allow_pickle=True)
    else:
        (folder / file).write_bytes(content)
    code, err = run_main(monkeypatch, capsys, "bench", str(suite), "--output", str(out), "--summary-only")
    assert_one_line_error(code, err, needle)


def test_resume_reads_metrics_streaming_and_bounds_a_line(run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole log was read, decoded and split at once (a 2 GB log took 4.9 GB); now it is streamed line by
    line into the rewritten copy, and a line longer than the bound is refused, naming it."""
    from csekit.training import run_folder
    from csekit.training.run_folder import MetricsLog

    path = run / "metrics.jsonl"
    record = json.dumps({"step": 1, "loss": 0.5, "note": "x" * 100}) + "\n"
    with open(path, "w", encoding="utf-8") as handle:
        for _ in range(100_000):  # about 13 MB
            handle.write(record)
    log = MetricsLog(path, enabled=True)
    tracemalloc.start()
    log.truncate_after(1)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 4 * 2**20, f"{peak / 2**20:.1f} MiB held to rewrite a {path.stat().st_size / 2**20:.0f} MiB log"
    assert path.read_text(encoding="utf-8") == record * 100_000

    monkeypatch.setattr(run_folder, "METRICS_LINE_LIMIT", 64)
    with pytest.raises(CsekitError, match=r"metrics\.jsonl:1: .*longer than 64 bytes"):
        log.truncate_after(1)


def test_a_huge_gz_corpus_line_is_refused_without_holding_it(tmp_path: Path) -> None:
    """A .gz line was decompressed whole before data.max_chars was checked (a 2 GiB line took 4.5 GB)."""
    from csekit.data.corpus import Corpus

    path = tmp_path / "corpus.txt.gz"
    with gzip.open(path, "wb") as handle:
        handle.write(b"a short line\n" + b"x" * (32 * 2**20) + b"\nanother line\n")
    tracemalloc.start()
    corpus = Corpus(path, max_chars=1000, bad_lines="skip")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert [corpus[i] for i in range(len(corpus))] == ["a short line", "another line"]
    assert corpus.report.skipped[0][0] == 2 and "more than data.max_chars=1,000" in corpus.report.skipped[0][1]
    assert peak < 8 * 2**20, f"{peak / 2**20:.1f} MiB held to skip one long line"


def test_a_long_plain_corpus_line_keeps_the_offsets_of_the_lines_after_it(tmp_path: Path) -> None:
    from csekit.data.corpus import Corpus

    path = tmp_path / "corpus.txt"
    path.write_bytes(b"first\n" + "é".encode() * 5000 + b"\r\nthird\nlast without newline")
    corpus = Corpus(path, max_chars=100, bad_lines="skip")
    assert [corpus[i] for i in range(len(corpus))] == ["first", "third", "last without newline"]
    assert [line for line, _ in corpus.report.skipped] == [2]


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "folder"])
def test_a_corpus_that_is_not_a_regular_file_is_one_line(tmp_path: Path, kind: str) -> None:
    from csekit.data.corpus import Corpus

    path = tmp_path / "corpus.txt.gz"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    else:
        path.mkdir()
    with pytest.raises(CsekitError, match=r"corpus\.txt\.gz"):
        Corpus(path, max_chars=100)

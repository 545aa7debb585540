"""Every file and folder csekit writes, attacked by inventory (issue "Hostile files IV"): a symbolic link, a hard link
and a name taken in advance at each write target are refused in one line that says so, or are never written
through; nothing outside is written.

The inventory is read from the source: every call of a writing function of core/atomic.py or core/run_lock.py in
src/ is a write target and must be in WRITE_TARGETS, with the writer it goes through (a new write target fails
`test_the_inventory_of_write_targets_is_the_sources`). Each writer is attacked below with each plant; the targets of
the same writer share its attack, and the appended files, the one kind a hard link could reach, are attacked
through their real callers too.
"""

from __future__ import annotations

import ast
import os
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import assert_one_line_error, run_main
from test_architecture import SRC, module_name

from csekit.core import atomic
from csekit.core.errors import CsekitError

WRITERS = {
    "atomic_write_text": "replace",
    "write_file": "replace",
    "write_by_name": "replace",
    "move_file": "replace",
    "commit_staged_file": "replace",
    "append_text": "append",
    "open_for_append": "append",
    "open_bytes_for_append": "append",
    "truncate_file": "append",
    "atomic_directory": "folder",
    "staging_folder": "folder",
    "swap_in": "folder",
    "hold_folder": "folder",
    "hold_run_lock": "lock",
    "hold_result_lock": "lock",
    "check_writable": "probe",
}
"""The writing functions of the two core modules, by how they write: a file replaced whole (a fresh temporary
sibling renamed over it), a file appended to or cut in place, a folder staged and swapped in (or held), a lock
file, a probe file (tests/test_hostile_iv.py plants every kind of file at the probe's name)."""

WRITE_TARGETS = {
    ("csekit.bench.plots", "_save", "write_file"): "a suite's plots (OUTPUT/*.png)",
    ("csekit.bench.plots", "write_paper_plot", "write_file"): "OUTPUT/sts_avg_vs_paper.png",
    ("csekit.bench.run", "_run_one", "write_file"): "a bench run's cosines.npy",
    ("csekit.bench.run", "_run_one", "atomic_write_text"): "a bench run's results.json",
    ("csekit.bench.summary", "summarise", "atomic_write_text"): "OUTPUT/results.md and results.csv",
    ("csekit.cli", "evaluate", "atomic_write_text"): "evaluate --output",
    ("csekit.cli", "encode", "write_file"): "encode --output (.npy or .tsv)",
    ("csekit.cli", "probe", "atomic_write_text"): "probe --output",
    ("csekit.cli", "diagnose", "atomic_write_text"): "diagnose --output",
    ("csekit.cli", "freq", "atomic_write_text"): "freq --output",
    ("csekit.data.corpus_download", "download_corpus", "commit_staged_file"): "a downloaded corpus",
    ("csekit.data.corpus_download", "_open_partial", "open_bytes_for_append"): "a download's .part file",
    ("csekit.data.data_dir", "_fetch", "write_file"): "download-data's archives",
    ("csekit.data.data_dir", "_rewrite_columns", "atomic_write_text"): "a SentEval file rewritten",
    ("csekit.data.data_dir", "download_senteval_data", "swap_in"): "DATA/sts/<year>, DATA/sts/STSBenchmark",
    ("csekit.data.data_dir", "download_senteval_data", "atomic_write_text"): "STSBenchmark's tokenised files",
    ("csekit.data.data_dir", "download_senteval_data", "move_file"): "STS and SICK files moved into place",
    ("csekit.encoding.export", "save_model", "atomic_directory"): "a model folder (best/, export, save)",
    ("csekit.encoding.export", "_write", "atomic_write_text"): "a model folder's README.md",
    ("csekit.encoding.export", "_write_pooling", "write_by_name"): "a model folder's layer weights",
    ("csekit.encoding.export", "_append_eos_when_tokenizing", "atomic_write_text"): "a model's tokenizer.json",
    ("csekit.encoding.export", "_write_json", "atomic_write_text"): "a model folder's JSON files",
    ("csekit.encoding.export", "add_dense", "write_by_name"): "a model folder's Dense module weights",
    ("csekit.evaluation.mteb_run", "save_results", "atomic_directory"): "evaluate --mteb's result folder",
    ("csekit.prep.augment", "_resume_point", "truncate_file"): "augment --output, cut back on restart",
    ("csekit.prep.augment", "augment_corpus", "open_for_append"): "augment --output, appended to",
    ("csekit.training.checkpoint", "save_shared_state", "write_by_name"): "checkpoint/model.safetensors",
    ("csekit.training.checkpoint", "save_shared_state", "write_file"): "checkpoint/optimizer.pt, scheduler.pt, ...",
    ("csekit.training.checkpoint", "save_rng_state", "write_file"): "checkpoint/rng_state*.pt",
    ("csekit.training.checkpoint", "write_checkpoint", "staging_folder"): "OUTPUT/.checkpoint.tmp",
    ("csekit.training.checkpoint", "write_checkpoint", "atomic_write_text"): "checkpoint/state.json, recipe.yaml",
    ("csekit.training.checkpoint", "write_checkpoint", "swap_in"): "OUTPUT/checkpoint",
    ("csekit.training.run_folder", "create_output", "check_writable"): "the output folder's write probe",
    ("csekit.training.run_folder", "write", "append_text"): "OUTPUT/metrics.jsonl, appended to",
    ("csekit.training.run_folder", "truncate_after", "write_file"): "OUTPUT/metrics.jsonl, cut back on resume",
    ("csekit.training.trackers", "hold_tracker_logs", "hold_folder"): "OUTPUT/logs and logs/<name> (trackers)",
    ("csekit.training.trainer", "_open_output", "hold_run_lock"): "OUTPUT/.lock",
    ("csekit.training.trainer", "_announce_start", "atomic_write_text"): "OUTPUT/recipe.yaml",
}
"""(module, function, writer) -> what it writes. The writer's attack below covers it."""
WRITER_MODULES = {"csekit.core.atomic", "csekit.core.run_lock"}


def _writer_calls(source: str, module: str) -> Iterator[tuple[str, str, str]]:
    """(module, innermost function, writer) for each call of a WRITERS function in `source`."""

    def visit(node: ast.AST, function: str) -> Iterator[tuple[str, str, str]]:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else function
            if isinstance(child, ast.Call):
                func = child.func
                name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
                if name in WRITERS:
                    yield module, function, name
            yield from visit(child, inner)

    yield from visit(ast.parse(source), "<module>")


def test_the_inventory_of_write_targets_is_the_sources() -> None:
    found = {
        call
        for path in sorted((SRC / "csekit").rglob("*.py"))
        if module_name(path) not in WRITER_MODULES
        for call in _writer_calls(path.read_text(encoding="utf-8"), module_name(path))
    }
    assert not found - set(WRITE_TARGETS), f"new write targets: add them to WRITE_TARGETS: {found - set(WRITE_TARGETS)}"
    assert not set(WRITE_TARGETS) - found, f"gone: {set(WRITE_TARGETS) - found}"


def test_the_inventory_check_finds_a_new_write_target() -> None:
    source = "def save(folder):\n    def inner():\n        atomic_write_text(folder / 'x', '')\n    write_file(p, f)\n"
    assert list(_writer_calls(source, "m")) == [("m", "inner", "atomic_write_text"), ("m", "save", "write_file")]


# --- each writer, with each plant -------------------------------------------------------------------------------

VICTIM_TEXT = "a file of the user's elsewhere\n"


def _replace(writer: str) -> Callable[[Path], None]:
    """Write 'new' at a path through the file-replacing `writer`."""

    def write(path: Path) -> None:
        if writer == "atomic_write_text":
            atomic.atomic_write_text(path, "new")
        elif writer == "write_file":
            atomic.write_file(path, lambda handle: handle.write(b"new"))
        elif writer == "write_by_name":
            atomic.write_by_name(path, lambda name: Path(name).write_bytes(b"new"))
        else:  # move_file, commit_staged_file: a file csekit wrote beside the target
            source = path.with_name(".csekit-own")
            source.write_bytes(b"new")
            (atomic.move_file if writer == "move_file" else atomic.commit_staged_file)(source, path)

    return write


def _append(writer: str) -> Callable[[Path], None]:
    def write(path: Path) -> None:
        if writer == "append_text":
            atomic.append_text(path, "new")
        elif writer == "open_for_append":
            with atomic.open_for_append(path) as handle:
                handle.write("new")
        elif writer == "open_bytes_for_append":
            with atomic.open_bytes_for_append(path) as handle:
                handle.write(b"new")
        else:
            atomic.truncate_file(path, 0)

    return write


def _folder(writer: str) -> Callable[[Path], None]:
    def write(path: Path) -> None:
        if writer == "atomic_directory":
            with atomic.atomic_directory(path) as staging:
                (staging / "weights").write_bytes(b"new")
        elif writer in ("staging_folder", "swap_in"):
            held = atomic.staging_folder(path, ".checkpoint.tmp" if writer == "staging_folder" else None)
            try:
                (held.path / "weights").write_bytes(b"new")
                atomic.swap_in(held, path)
            finally:
                held.close()
        else:
            atomic.hold_folder(path).close()

    return write


FILE_WRITERS = {name: _replace(name) for name, kind in WRITERS.items() if kind == "replace"}
FILE_WRITERS |= {name: _append(name) for name, kind in WRITERS.items() if kind == "append"}
FOLDER_WRITERS = {name: _folder(name) for name, kind in WRITERS.items() if kind == "folder"}


def _victim(tmp_path: Path) -> Path:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    victim = elsewhere / "precious.txt"
    victim.write_text(VICTIM_TEXT, encoding="utf-8")
    return victim


def _assert_untouched(victim: Path) -> None:
    assert victim.read_text(encoding="utf-8") == VICTIM_TEXT
    assert sorted(p.name for p in victim.parent.iterdir()) == [victim.name]


def _written_or_refused(
    write: Callable[[Path], None], target: Path, *needles: str, named: Path | None = None
) -> str | None:
    """None when `write` succeeded; else its one-line message, which must name `named` (default: `target`), the
    path where the plant is, and each needle."""
    try:
        write(target)
    except CsekitError as error:
        message = str(error)
        assert "\n" not in message and str(named or target) in message, message
        assert all(needle in message for needle in needles), message
        return message
    return None


@pytest.mark.parametrize("writer", sorted(FILE_WRITERS))
def test_a_symbolic_link_at_a_file_target_is_refused_and_never_followed(writer: str, tmp_path: Path) -> None:
    victim = _victim(tmp_path)
    (tmp_path / "run").mkdir()
    target = tmp_path / "run" / "result"
    target.symlink_to(victim)
    assert _written_or_refused(FILE_WRITERS[writer], target, "symbolic link", "remove it") is not None
    _assert_untouched(victim)
    assert target.is_symlink()


@pytest.mark.parametrize("writer", sorted(FILE_WRITERS))
def test_a_hard_link_at_a_file_target_is_replaced_or_refused_never_written_through(writer: str, tmp_path: Path) -> None:
    """A file replaced whole gets a new inode (the other name keeps the old content); one appended to or cut in
    place is refused: before, metrics.jsonl or augment's output hard-linked to a file elsewhere was appended to."""
    victim = _victim(tmp_path)
    (tmp_path / "run").mkdir()
    target = tmp_path / "run" / "result"
    os.link(victim, target)
    message = _written_or_refused(FILE_WRITERS[writer], target, "hard link", "remove it")
    _assert_untouched(victim)
    if WRITERS[writer] == "append":
        assert message is not None
    else:
        assert message is None and target.read_bytes() == b"new" and target.stat().st_nlink == 1


@pytest.fixture
def taken_temporary_name(monkeypatch: pytest.MonkeyPatch) -> str:
    """The first temporary name atomic.py draws is one someone put there in advance; later draws are fresh."""
    draws, fresh = iter(["0badcafe"]), secrets.token_hex
    monkeypatch.setattr(atomic.secrets, "token_hex", lambda size: next(draws, None) or fresh(size))
    return "0badcafe"


@pytest.mark.parametrize("writer", sorted(name for name, kind in WRITERS.items() if kind == "replace"))
def test_a_temporary_name_taken_in_advance_is_never_opened(
    writer: str, tmp_path: Path, taken_temporary_name: str
) -> None:
    victim = _victim(tmp_path)
    (tmp_path / "run").mkdir()
    target = tmp_path / "run" / "result"
    planted = tmp_path / "run" / f".result.{taken_temporary_name}.tmp"
    planted.symlink_to(victim)
    assert _written_or_refused(FILE_WRITERS[writer], target) is None
    _assert_untouched(victim)
    assert target.read_bytes() == b"new" and planted.is_symlink()


@pytest.mark.parametrize("writer", sorted(FOLDER_WRITERS))
@pytest.mark.parametrize("plant", ["symbolic-link", "taken-temporary-name", "hard-link-inside"])
def test_a_folder_target_refuses_a_link_and_never_writes_through_one(
    writer: str, plant: str, tmp_path: Path, taken_temporary_name: str
) -> None:
    """A folder cannot be hard-linked: the hard link is planted inside the folder a new version replaces (only its
    name goes) or a library writes into (`hold_folder` refuses it: a tracker could append to it)."""
    victim = _victim(tmp_path)
    (tmp_path / "run").mkdir()
    target = tmp_path / "run" / "checkpoint"
    needles: tuple[str, ...] = ()
    named = target
    if plant == "symbolic-link":
        target.symlink_to(victim.parent, target_is_directory=True)
        needles = ("symbolic link",)
    elif plant == "taken-temporary-name":
        (tmp_path / "run" / f".checkpoint.{taken_temporary_name}.tmp").symlink_to(victim.parent)
        (tmp_path / "run" / ".checkpoint.tmp").symlink_to(victim.parent)
        needles = ("did not make it",) if writer == "staging_folder" else ()
        named = tmp_path / "run" / ".checkpoint.tmp"
    else:
        target.mkdir()
        os.link(victim, target / "events.log")
        needles = ("hard link",) if writer == "hold_folder" else ()
    message = _written_or_refused(FOLDER_WRITERS[writer], target, *needles, named=named)
    assert (message is None) == (not needles), message
    assert victim.read_text(encoding="utf-8") == VICTIM_TEXT and victim.stat().st_nlink in (1, 2)
    assert sorted(p.name for p in victim.parent.iterdir()) == [victim.name]


# --- the appended files, through their real callers ----------------------------------------------------------


def test_a_hard_linked_metrics_log_is_not_appended_to(tmp_path: Path) -> None:
    from csekit.training.run_folder import METRICS_FILE, MetricsLog

    victim = _victim(tmp_path)
    (tmp_path / "run").mkdir()
    os.link(victim, tmp_path / "run" / METRICS_FILE)
    with pytest.raises(CsekitError, match=r"metrics\.jsonl has 1 other name\(s\) \(a hard link\)"):
        MetricsLog(tmp_path / "run" / METRICS_FILE, True).write({"step": 1})
    _assert_untouched(victim)


def test_a_hard_linked_augment_output_is_not_appended_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    victim = tmp_path / "precious.jsonl"
    victim.write_text("", encoding="utf-8")  # an empty file: augment starts from its first line and appends
    corpus = tmp_path / "c.txt"
    corpus.write_text("a man plays the guitar\nthe dog runs\n", encoding="utf-8")
    output = tmp_path / "out.jsonl"
    os.link(victim, output)
    args = ["augment", "--corpus", str(corpus), "--output", str(output), "--engine", "none"]
    code, err = run_main(monkeypatch, capsys, *args)
    assert_one_line_error(code, err, str(output), "hard link")
    assert victim.read_text(encoding="utf-8") == ""

"""Property-based tests of the corpus and STS readers: any bytes give sentences or a CsekitError."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from conftest import hostile_examples
from hypothesis import given
from hypothesis import strategies as st

from csekit.core.errors import CsekitError
from csekit.data.corpus import Corpus
from csekit.evaluation.sts import load_sts_task

FUZZ = hostile_examples(150)  # conftest.py: no deadline, a fixed seed; 40 times as many in make test-hostile
FIELD_NAMES = ["text", "paraphrase", "negation", "step", "insertion", "deletion", "substitution", "random"]
LINE = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n"), max_size=40)


@FUZZ
@given(st.binary(max_size=400))
def test_corpus_reader_never_crashes_on_bytes(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "c.txt"
        path.write_bytes(data)
        try:
            corpus = Corpus(path, max_chars=50)
        except CsekitError as error:
            assert "\n" not in str(error) and "c.txt" in str(error)
            return
        sentences = [corpus[i] for i in range(len(corpus))]
        assert all(s.strip() and "\n" not in s for s in sentences)
        lines = data.split(b"\n")  # binary file iteration ends lines at b"\n" only
        if lines[-1] == b"":
            lines.pop()
        assert len(sentences) + corpus.report.blank_lines == len(lines)


@FUZZ
@given(st.lists(LINE, max_size=30))
def test_corpus_keeps_every_non_blank_line_in_order(lines: list[str]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "c.txt"
        path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        expected = [line for line in lines if line.strip()]
        if not expected:
            return
        corpus = Corpus(path, max_chars=100)
        assert [corpus[i] for i in range(len(corpus))] == expected
        assert corpus.report.blank_lines == len(lines) - len(expected)


@FUZZ
@given(
    st.lists(st.tuples(LINE, LINE, st.one_of(st.floats(0, 5, allow_nan=False), st.just(None))), max_size=20),
    st.binary(max_size=60),
)
def test_sts_reader_gives_scored_pairs_or_a_located_error(rows: list, junk: bytes) -> None:
    with tempfile.TemporaryDirectory() as folder:
        year = Path(folder) / "sts" / "STS13"
        year.mkdir(parents=True)
        for subset in ("FNWN", "headlines", "OnWN"):
            inputs = "".join(f"{a}\t{b}\n" for a, b, _ in rows)
            golds = "".join(("" if y is None else f"{y}") + "\n" for _, _, y in rows)
            (year / f"STS.input.{subset}.txt").write_text(inputs, encoding="utf-8")
            (year / f"STS.gs.{subset}.txt").write_bytes(golds.encode() + (junk if subset == "OnWN" else b""))
        try:
            subsets = load_sts_task(folder, "STS13")
        except CsekitError as error:
            assert "\n" not in str(error) and "STS" in str(error)
            return
        scored = [(a, b, y) for a, b, y in rows if y is not None]
        assert len(subsets[0]) == len(scored)
        assert subsets[0].scores == [float(f"{y}") for _, _, y in scored]
        assert all(" ".join(s.split()) == s for s in subsets[0].sentences1)


def _write(folder: str, name: str, data: bytes) -> Path:
    path = Path(folder) / name
    path.write_bytes(data)
    return path


@FUZZ
@given(st.binary(max_size=300))
def test_transfer_readers_never_crash_on_bytes(data: bytes) -> None:
    from csekit.evaluation.transfer import read_mrpc_file, read_sst_file, read_trec_file

    with tempfile.TemporaryDirectory() as folder:
        for reader, name in ((read_sst_file, "sentiment-dev"), (read_trec_file, "TREC_10.label")):
            path = _write(folder, name, data)
            try:
                sentences, labels = reader(path)
            except CsekitError as error:
                assert "\n" not in str(error) and name in str(error)
                continue
            assert len(sentences) == len(labels)
        path = _write(folder, "msr_paraphrase_test.txt", data)
        try:
            first, second, labels = read_mrpc_file(path)
        except CsekitError as error:
            assert "\n" not in str(error) and "msr_paraphrase_test.txt" in str(error)
        else:
            assert len(first) == len(second) == len(labels) and set(labels) <= {0, 1}


@FUZZ
@given(st.lists(st.tuples(LINE, st.sampled_from(["0", "1"])), max_size=20))
def test_sst_reader_keeps_every_labelled_line(rows: list[tuple[str, str]]) -> None:
    from csekit.evaluation.transfer import read_sst_file

    rows = [(text, label) for text, label in rows if text.strip() and "\t" not in text]
    with tempfile.TemporaryDirectory() as folder:
        path = _write(folder, "sentiment-train", "".join(f"{t}\t{y}\n" for t, y in rows).encode())
        sentences, labels = read_sst_file(path)
    assert labels == [int(y) for _, y in rows]
    assert sentences == [" ".join(t.split()) for t, _ in rows]


# --- JSON-lines readers (issue #49, defect 9) ------------------------------------------------------------


def _read_corpus(path: Path) -> object:
    return Corpus(path, max_chars=300_000)  # long enough for the nested row to reach the JSON parser


def _read_paraphrases(path: Path) -> object:
    from csekit.prep.paraphrase import FileEngine

    return FileEngine(path)


def _read_probe_set(path: Path) -> object:
    from csekit.evaluation.probes import load_transformation_probe

    return load_transformation_probe(path)


def _restart_augment(path: Path) -> object:
    from csekit.prep.augment import _resume_point

    return _resume_point(path)


def _metrics_on_resume(path: Path) -> object:
    from csekit.training.run_folder import MetricsLog

    return MetricsLog(path, True).truncate_after(0)


JSON_LINES_READERS = {
    "jsonl-corpus": _read_corpus,
    "paraphrases": _read_paraphrases,
    "probe-transformations": _read_probe_set,
    "augment-restart": _restart_augment,
    "metrics-resume": _metrics_on_resume,
}
HOSTILE_ROWS = {
    "list": b"[1, 2]",
    "string": b'"x"',
    "number": b"100",
    "null": b"null",
    "nested-100000": b"[" * 100_000 + b"]" * 100_000,
    "nested-object": b'{"text": ' + b'{"a": ' * 100_000 + b"1" + b"}" * 100_001,
    "text-a-number": b'{"text": 5, "negation": null, "paraphrase": null, "step": 1}',
}


@pytest.mark.parametrize("row", HOSTILE_ROWS)
@pytest.mark.parametrize("reader", JSON_LINES_READERS)
def test_a_hostile_json_lines_row_is_one_line_naming_the_file_and_line(tmp_path: Path, reader: str, row: str) -> None:
    """Each JSON-lines reader refuses a row that is not an object of the expected field types (a list, a string,
    brackets nested 100,000 deep: AttributeError and RecursionError tracebacks before) in one line, FILE:LINE."""
    path = tmp_path / "rows.jsonl"
    path.write_bytes(HOSTILE_ROWS[row] + b"\n")
    try:
        JSON_LINES_READERS[reader](path)
    except CsekitError as error:
        assert "\n" not in str(error) and f"{path}:1" in str(error), str(error)
    else:
        assert reader == "metrics-resume" and row == "text-a-number", "a metrics record may have any other fields"


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | LINE,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.sampled_from(FIELD_NAMES), children),
    max_leaves=12,
)


@FUZZ
@given(st.lists(JSON_VALUES, min_size=1, max_size=6))
def test_json_lines_readers_give_rows_or_a_located_error(values: list) -> None:
    """Any JSON values as rows: each reader gives its rows, or one line naming the file and a line."""
    with tempfile.TemporaryDirectory() as folder:
        path = _write(folder, "rows.jsonl", "".join(json.dumps(value) + "\n" for value in values).encode())
        for reader in JSON_LINES_READERS.values():
            try:
                reader(path)
            except CsekitError as error:
                assert "\n" not in str(error) and "rows.jsonl" in str(error), str(error)


def test_deeply_nested_json_in_a_lock_file_or_a_safetensors_header_is_not_a_traceback(tmp_path: Path) -> None:
    """The two other JSON readers of files from elsewhere (a run folder's `.lock`, a model's safetensors header)
    parse through json_row too: brackets nested past Python's recursion limit were a RecursionError traceback."""
    import struct

    from csekit.core.run_lock import _holder
    from csekit.encoding.weight_files import read_safetensors_header

    nested = b"[" * 2000 + b"]" * 2000
    lock = tmp_path / ".lock"
    lock.write_bytes(nested)
    assert _holder(lock, "train") == ("train", "another process")
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(struct.pack("<Q", len(nested)) + nested)
    with pytest.raises(CsekitError, match=r"model.safetensors: cannot read its header \(JSON nested too deeply"):
        read_safetensors_header(weights)

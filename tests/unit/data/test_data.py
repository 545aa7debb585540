"""The corpus reader: what is kept, what is counted, and one-line errors naming file and line."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import pytest

from csekit.core.errors import CsekitError
from csekit.data.corpus import Corpus, TrainCollator, resolve_corpus_path


def write_bytes(tmp_path: Path, data: bytes, name: str = "corpus.txt") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_reads_sentences_and_counts_blank_lines(tmp_path: Path) -> None:
    corpus = Corpus(write_bytes(tmp_path, b"first one\n\n   \nsecond\r\nthird \xc3\xa9t\xc3\xa9\n"))
    assert [corpus[i] for i in range(len(corpus))] == ["first one", "second", "third été"]
    assert corpus.report.blank_lines == 2 and corpus.report.sentences == 3


def test_last_line_without_newline_is_kept(tmp_path: Path) -> None:
    corpus = Corpus(write_bytes(tmp_path, b"one\ntwo"))
    assert [corpus[0], corpus[1]] == ["one", "two"]


def test_a_read_neither_uses_nor_moves_the_shared_file_offset(tmp_path: Path) -> None:
    """DataLoader workers forked after the parent read a line share its descriptor and so its file offset: a
    seek then a read in one worker could read at another's offset (a UnicodeDecodeError on a GPU, 2026-11-27;
    a wrong sentence when the bytes happen to decode). Reads must be positional."""
    corpus = Corpus(write_bytes(tmp_path, "alpha été\nbravo\ncharlie delta\n".encode()))
    assert corpus[0] == "alpha été"  # the parent opens the file, as the duplicate count does before workers start
    descriptor = corpus._handle.fileno()
    for index, expected in [(2, "charlie delta"), (1, "bravo"), (0, "alpha été")]:
        os.lseek(descriptor, 7, os.SEEK_SET)  # where a sibling worker left the shared offset
        assert corpus[index] == expected
        assert os.lseek(descriptor, 0, os.SEEK_CUR) == 7


def test_forked_loader_workers_read_every_line_right(tmp_path: Path) -> None:
    """The same race end to end: the parent reads, then two forked workers read every line many times."""
    from torch.utils.data import DataLoader

    lines = [f"sentence {index} " + "é" * (index % 7) for index in range(400)]
    corpus = Corpus(write_bytes(tmp_path, ("\n".join(lines) + "\n").encode()))
    assert corpus[0] == lines[0]
    loader = DataLoader(
        [index for _ in range(10) for index in range(len(lines))],
        batch_size=50,
        num_workers=2,
        multiprocessing_context="fork",
        collate_fn=lambda indices: [corpus[index] for index in indices],
    )
    read = [text for batch in loader for text in batch]
    assert read == lines * 10


def test_gzip_corpus(tmp_path: Path) -> None:
    path = tmp_path / "c.txt.gz"
    with gzip.open(path, "wb") as handle:
        handle.write(b"alpha\n\nbeta\n")
    corpus = Corpus(path)
    assert [corpus[0], corpus[1]] == ["alpha", "beta"] and corpus.report.blank_lines == 1


def test_jsonl_corpus_keeps_extra_fields(tmp_path: Path) -> None:
    path = write_bytes(tmp_path, b'{"text": "a b", "negation": "not a b"}\n', "c.jsonl")
    corpus = Corpus(path)
    batch = TrainCollator(lambda sentences: {"n": len(sentences)})([corpus[0]])
    assert batch["sentences"] == ["a b"] and batch["fields"] == {"negation": ["not a b"]}


def test_undecodable_line_names_file_and_line(tmp_path: Path) -> None:
    path = write_bytes(tmp_path, b"fine\nalso fine\nbad \xff byte\n")
    with pytest.raises(CsekitError, match=rf"{path.name}:3: not valid UTF-8") as error:
        Corpus(path)
    assert "\n" not in str(error.value)


def test_absurdly_long_line_names_file_and_line(tmp_path: Path) -> None:
    path = write_bytes(tmp_path, b"short\n" + b"x" * 100_000 + b"\n")
    with pytest.raises(CsekitError, match=rf"{path.name}:2: 100,000 characters"):
        Corpus(path, max_chars=10_000)


def test_bad_lines_can_be_skipped_and_are_reported(tmp_path: Path) -> None:
    path = write_bytes(tmp_path, b"ok\n\xff\xfe\nok too\n" + b"y" * 50 + b"\n")
    corpus = Corpus(path, max_chars=20, bad_lines="skip")
    assert len(corpus) == 2
    assert [line for line, _ in corpus.report.skipped] == [2, 4]
    assert "lines 2, 4" in corpus.report.summary()


def test_missing_and_empty_corpora(tmp_path: Path) -> None:
    with pytest.raises(CsekitError, match="does not exist"):
        Corpus(tmp_path / "nope.txt")
    with pytest.raises(CsekitError, match="no sentences"):
        Corpus(write_bytes(tmp_path, b"\n\n  \n"))
    with pytest.raises(CsekitError, match="no sentences"):
        Corpus(write_bytes(tmp_path, b"", "empty.txt"))


def test_relative_corpus_is_looked_up_in_the_data_folder(tmp_path: Path) -> None:
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "c.txt").write_text("x\n", encoding="utf-8")
    assert resolve_corpus_path("corpus/c.txt", tmp_path) == tmp_path / "corpus" / "c.txt"
    with pytest.raises(CsekitError, match="not found"):
        resolve_corpus_path("corpus/missing.txt", tmp_path)


def test_corpus_survives_pickling_for_dataloader_workers(tmp_path: Path) -> None:
    import pickle

    corpus = Corpus(write_bytes(tmp_path, b"one\ntwo\n"))
    assert corpus[1] == "two"  # opens the memory map
    clone = pickle.loads(pickle.dumps(corpus))
    assert clone[0] == "one"


def test_corpus_rewritten_with_the_same_size_is_an_error(tmp_path: Path) -> None:
    path = write_bytes(tmp_path, b"one\ntwo\n")
    corpus = Corpus(path)
    stamp = path.stat().st_mtime_ns
    path.write_bytes(b"six\nten\n")
    os.utime(path, ns=(stamp + 1_000_000_000, stamp + 1_000_000_000))  # a later write, on any clock resolution
    with pytest.raises(CsekitError, match="changed after it was read"):
        corpus[1]


def test_corpus_truncated_during_training_is_an_error_not_a_bus_error(tmp_path: Path) -> None:
    """A memory map read past a truncated end kills the process with SIGBUS; the reader must stop with an error.

    Run in a fresh process, so that a bus error shows as a signal instead of killing the test run.
    """
    import subprocess
    import sys

    path = write_bytes(tmp_path, b"".join(b"line %d\n" % i for i in range(20000)))
    script = (
        "import sys\nfrom csekit.data.corpus import Corpus\nfrom csekit.core.errors import CsekitError\n"
        f"corpus = Corpus({str(path)!r})\ncorpus[0]\n"
        f"open({str(path)!r}, 'r+b').truncate(10)\n"
        "try:\n    corpus[19999]\nexcept CsekitError as error:\n    sys.exit(f'error: {error}')\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 1, (result.returncode, result.stderr)
    assert f"corpus {path} changed after it was read" in result.stderr


def test_a_change_seen_by_a_dataloader_worker_is_still_one_line(tmp_path: Path) -> None:
    """PyTorch re-raises a worker's error with the worker's traceback; the CLI prints the original line."""
    from torch.utils.data import DataLoader

    from csekit.core.errors import message_line

    path = write_bytes(tmp_path, b"".join(b"line %d\n" % i for i in range(64)))
    loader = DataLoader(Corpus(path), batch_size=4, num_workers=1)
    path.write_bytes(b"short\n")
    with pytest.raises(CsekitError) as error:
        next(iter(loader))
    assert "Traceback" not in str(error.value)  # PyTorch re-raises with the worker's traceback; CsekitError keeps
    assert str(error.value) == message_line(error.value)  # the original line (core/errors._raised_message)
    assert message_line(error.value).startswith(f"corpus {path} changed after it was read")
    assert "\n" not in message_line(error.value)

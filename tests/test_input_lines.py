"""One input line is one row: only \\n (or \\r\\n) ends a line in a user's text file.

`str.splitlines` also ends lines at U+2028, U+0085, form feed, vertical tab and the file/group/record
separators, and text-mode file iteration at a lone \\r; each reader below must not.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import run_main

from csekit.encoding.encoder import SentenceEncoder

# Every character str.splitlines ends a line at, besides \n and \r\n.
OTHER_BREAKS = "\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
LINES = ["a man plays" + OTHER_BREAKS + "the guitar", "", "the dog\u2028runs", "x\ry"]


def test_split_lines_ends_lines_at_newline_only() -> None:
    from csekit.core.lines import split_lines

    assert split_lines("\n".join(LINES) + "\n") == LINES
    assert split_lines("\r\n".join(LINES)) == LINES  # \r\n too, and no final newline
    assert split_lines("") == [] and split_lines("\n") == [""] and split_lines("one") == ["one"]


def test_encode_writes_one_row_per_newline(
    tmp_path: Path,
    tiny_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    native_bf16: bool,
) -> None:
    """One row per line, and on any CPU the rows the Python API gives (both compute in fp32 by default)."""
    (tmp_path / "in.txt").write_text("\n".join(LINES) + "\n", encoding="utf-8", newline="")
    out = tmp_path / "out.npy"
    code, err = run_main(
        monkeypatch, capsys, "encode", str(tiny_model_dir), "-i", str(tmp_path / "in.txt"), "-o", str(out)
    )
    assert code == 0, err
    expected = SentenceEncoder.load(tiny_model_dir).encode(LINES)
    np.testing.assert_array_equal(np.load(out), expected)


class NoParse:
    """A stand-in for spaCy: no parse, so no negation (the augmenter's line handling is what is tested)."""

    def pipe(self, texts: list[str], batch_size: int) -> list[list[object]]:
        return [[] for _ in texts]


def test_augment_reads_one_sentence_per_newline(tmp_path: Path) -> None:
    from csekit.prep.augment import augment_corpus

    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(LINES) + "\r\n", encoding="utf-8", newline="")
    output = tmp_path / "out.jsonl"
    report = augment_corpus(corpus, output, None, NoParse())
    rows = [json.loads(line) for line in output.read_text(encoding="utf-8").split("\n") if line]
    assert [row["text"] for row in rows] == [line for line in LINES if line.strip()]
    assert report.blank_lines == 1


def test_paraphrase_file_keeps_a_line_with_a_line_separator_whole(tmp_path: Path) -> None:
    from csekit.prep.paraphrase import FileEngine

    path = tmp_path / "para.tsv"
    path.write_text("one sentence\u2028still the same\tits paraphrase\n", encoding="utf-8")
    assert FileEngine(path)(["one sentence\u2028still the same"]) == [["its paraphrase"]]


def test_probe_file_with_a_raw_line_separator_in_a_json_string(tmp_path: Path) -> None:
    from csekit.evaluation.probes import TRANSFORMATIONS, load_transformation_probe

    row = {"text": "one\u2028sentence", **{name: f"{name} of it" for name in TRANSFORMATIONS}}
    path = tmp_path / "probe.jsonl"
    path.write_text(json.dumps(row, ensure_ascii=False) + "\n", encoding="utf-8")
    assert load_transformation_probe(path) == [row]

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


# --- a line of any length never reaches a tokenizer whole (issue #49, defect 8) ----------------------------------


@pytest.fixture
def tokenizer_inputs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The length in characters of every text any tokenizer is called on (a 300 MB line aborted the process in
    the Rust tokenizer, exit 134 and no message, before it was ever truncated to max_length)."""
    from transformers import PreTrainedTokenizerBase

    lengths: list[int] = []
    call = PreTrainedTokenizerBase.__call__

    def recording(self: object, text: object = None, *args: object, **kwargs: object) -> object:
        lengths.extend(len(t) for t in ([text] if isinstance(text, str) else text or []))  # type: ignore[attr-defined]
        return call(self, text, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(PreTrainedTokenizerBase, "__call__", recording)
    return lengths


LONG_LINE = "the dog runs in the park " * 40_000  # a million characters of words


@pytest.mark.parametrize("pooler", ["cls", "mask"])
def test_a_long_line_reaches_the_tokenizer_cut_and_encodes_as_its_start(
    pooler: str, tiny_model_dir: Path, tokenizer_inputs: list[int]
) -> None:
    """`encode` (csekit encode, evaluate, probes) hands the tokenizer at most CHARS_PER_TOKEN characters a token of
    the backbone's positions, for a plain and a prompt pooler: the long line's vector is its start's vector."""
    from csekit.encoding.token_input import text_bound

    encoder = SentenceEncoder.load(tiny_model_dir, pooler)
    start = LONG_LINE[: text_bound(encoder.max_seq_length)]
    long, short = encoder.encode([LONG_LINE, start])
    assert max(tokenizer_inputs) <= text_bound(encoder.max_seq_length) < len(LONG_LINE)
    np.testing.assert_allclose(long, short, rtol=0, atol=1e-6)


def test_training_inputs_and_token_counts_are_cut_too(tiny_model_dir: Path, tokenizer_inputs: list[int]) -> None:
    """The training views (model.max_length tokens) and csekit freq's and diagnose's token counts (every token of a
    line, at most TEXT_CHAR_LIMIT characters) go through the same bound."""
    from csekit.encoding.token_input import TEXT_CHAR_LIMIT, text_bound, token_ids
    from csekit.parts.views.dropout import DropoutViews

    encoder = SentenceEncoder.load(tiny_model_dir)
    DropoutViews(encoder.tokenizer, encoder.pooler, max_length=16)([LONG_LINE, "a man"])
    assert max(tokenizer_inputs) <= text_bound(16) < 16 * 1000
    tokenizer_inputs.clear()
    counted = token_ids(encoder.tokenizer, [LONG_LINE * 2])
    assert max(tokenizer_inputs) == TEXT_CHAR_LIMIT and len(counted[0]) > 16

"""Issue 61 item 7: what a new user tripped on. A small loss is not shown as 0.0000; `csekit encode --normalize`
and its progress naming the file; a pairs file's CSV/TSV mistakes named by their cause; `csekit evaluate --help`
says how to install MTEB support. (`--help`, `--version` and early errors without torch: test_cli_startup.py.)"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_one_line_error, make_tiny_encoder, run_main
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from csekit.cli import app
from csekit.commands.encode import unit_length
from csekit.core.numbers import format_loss

# --- a loss below 1e-4 is not 0.0000 -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("loss", "shown"),
    [
        (0.6931471805599453, "0.6931"),
        (2.302585092994046, "2.303"),
        (12.3456, "12.35"),
        (0.5, "0.5000"),
        (0.012345, "0.01235"),
        (0.001, "0.001000"),
        (0.00099995, "1.000e-03"),
        (3.2e-05, "3.200e-05"),
        (1.23456e-07, "1.235e-07"),
        (-2e-4, "-2.000e-04"),
        (0.0, "0.000"),
        (12345.6, "1.235e+04"),
        (math.nan, "nan"),
        (math.inf, "inf"),
    ],
)
def test_a_loss_is_shown_with_four_significant_digits_and_small_ones_in_scientific_notation(
    loss: float, shown: str
) -> None:
    assert format_loss(loss) == shown


@given(st.floats(min_value=1e-30, max_value=1e6) | st.floats(min_value=-1e6, max_value=-1e-30))
def test_no_nonzero_loss_reads_as_zero_and_every_one_reads_back_to_four_digits(loss: float) -> None:
    shown = format_loss(loss)
    assert float(shown) != 0 and float(shown) == pytest.approx(loss, rel=5e-4)


# --- csekit encode: --normalize, and the progress names the file ------------------------------------------------


@pytest.fixture
def model_and_input(tmp_path: Path) -> tuple[Path, Path]:
    model = tmp_path / "model"
    make_tiny_encoder(tmp_path / "tok", initializer_range=0.2).save(model)
    sentences = tmp_path / "my sentences.txt"
    sentences.write_text("a man plays the guitar\nthe dog runs\nshe eats food quickly\n", encoding="utf-8")
    return model, sentences


def test_encode_normalize_writes_the_same_directions_at_unit_length(
    model_and_input: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    model, sentences = model_and_input
    raw, unit = tmp_path / "raw.npy", tmp_path / "unit.npy"
    assert run_main(monkeypatch, capsys, "encode", str(model), "-i", str(sentences), "-o", str(raw))[0] == 0
    code, _ = run_main(monkeypatch, capsys, "encode", str(model), "-i", str(sentences), "-o", str(unit), "--normalize")
    assert code == 0
    rows, normalised = np.load(raw), np.load(unit)
    assert not np.allclose(np.linalg.norm(rows, axis=1), 1.0)  # the model's own vectors are not unit length
    np.testing.assert_allclose(np.linalg.norm(normalised, axis=1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(normalised, rows / np.linalg.norm(rows, axis=1, keepdims=True), rtol=1e-6)
    text = tmp_path / "unit.tsv"
    code, _ = run_main(monkeypatch, capsys, "encode", str(model), "-i", str(sentences), "-o", str(text), "--normalize")
    assert code == 0 and np.allclose(np.loadtxt(text, delimiter="\t"), normalised)


def test_unit_length_leaves_a_zero_row_zero() -> None:
    rows = unit_length(np.array([[3.0, 4.0], [0.0, 0.0]], dtype=np.float32))
    np.testing.assert_allclose(rows, [[0.6, 0.8], [0.0, 0.0]])


def test_encodes_progress_names_the_file_it_encodes(
    model_and_input: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    model, sentences = model_and_input
    code, err = run_main(monkeypatch, capsys, "encode", str(model), "-i", str(sentences), "-o", str(tmp_path / "e.npy"))
    assert code == 0
    assert f"encoding {sentences}: 1/1 batches" in err  # stderr is no terminal here: the plain progress lines


# --- a pairs file's CSV/TSV mistakes name their cause ------------------------------------------------------------

PAIRS_CAUSES = {
    "semicolon-csv": (
        "a.csv",
        "sentence1;sentence2;score\na man;a dog;1\n",
        ["a.csv:1:", "one column holding ';'", "semicolon-separated", ".csv file is read comma-separated"],
    ),
    "comma-tsv": ("a.tsv", "sentence1,sentence2,score\na,b,1\n", ["a.tsv:1:", "comma-separated", "name it .csv"]),
    "unquoted-comma": (
        "a.csv",
        "sentence1,sentence2,score\na man,a dog,1\na man, a plan,a canal,2\n",
        ["a.csv:3:", "4 fields, but the header names 3", "unquoted comma"],
    ),
    "tab-in-a-sentence": (
        "a.tsv",
        "sentence1\tsentence2\tscore\na\tb\t1\na\tb\tc\t2\n",
        ["a.tsv:3:", "4 fields, but the header names 3", "a tab inside a sentence"],
    ),
    "headerless-file-given-names": (
        "a.csv",
        "a man plays,a dog runs,3.5\nb,c,1\n",
        ["a.csv:1:", "looks like a pair, not a header", '"3.5" is a number', "--pairs-columns"],
    ),
}


@pytest.mark.parametrize("case", list(PAIRS_CAUSES))
def test_a_pairs_files_mistake_is_one_line_that_names_its_cause(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    name, text, needles = PAIRS_CAUSES[case]
    (tmp_path / name).write_text(text, encoding="utf-8")
    code, err = run_main(monkeypatch, capsys, "evaluate", str(tmp_path / "no-model"), "--pairs", str(tmp_path / name))
    assert_one_line_error(code, err, *needles)


def test_a_header_read_as_a_pair_by_column_numbers_names_the_cause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = (("sentence1\tsentence2\tscore", "leave --pairs-columns out"), ("q\tp\tlabel", "give q,p,label"))
    for header, fix in cases:
        path = tmp_path / "a.tsv"
        path.write_text(f"\n{header}\na\tb\t1\nc\td\t2\n", encoding="utf-8")
        args = ["evaluate", str(tmp_path / "no-model"), "--pairs", str(path), "--pairs-columns", "1,2,3"]
        code, err = run_main(monkeypatch, capsys, *args)
        assert_one_line_error(code, err, "a.tsv:2:", "looks like a header", fix.replace("give ", "--pairs-columns "))


def test_extra_empty_fields_and_a_non_numeric_score_further_down_keep_their_old_meaning(tmp_path: Path) -> None:
    from csekit.core.errors import CsekitError
    from csekit.evaluation.pairs import read_pairs

    (tmp_path / "a.csv").write_text("sentence1,sentence2,score\na,b,1,\nc,d,2,,\n", encoding="utf-8")
    assert read_pairs(tmp_path / "a.csv").scores == [1.0, 2.0]  # a spreadsheet's empty trailing columns
    (tmp_path / "b.tsv").write_text("a\tb\t1\nc\td\thigh\n", encoding="utf-8")
    with pytest.raises(CsekitError, match=r'b.tsv:2: the score \(3\) "high" is not a number$'):
        read_pairs(tmp_path / "b.tsv", (1, 2, 3))


# --- csekit evaluate --help says how to install MTEB support ----------------------------------------------------


def test_evaluate_help_shows_the_mteb_extra() -> None:
    result = CliRunner().invoke(app, ["evaluate", "--help"], terminal_width=100)
    assert result.exit_code == 0
    text = re.sub(r"[\s│]+", " ", result.output)  # the option's help as rich wraps it in its box
    assert "pip install 'csekit[mteb]'" in text

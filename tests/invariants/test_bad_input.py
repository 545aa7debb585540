"""The bad-input matrix: each mistake gives one line naming the file, line or key, exit status 2,
and leaves no output behind."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import assert_one_line_error, make_corpus, make_data_dir, run_main, write_recipe

TRAIN_CASES = {
    "missing corpus": (None, "does not exist"),
    "empty corpus": (b"", "no sentences"),
    "only blank lines": (b"\n \n\t\n", "no sentences"),
    "undecodable bytes": (b"fine\n\xc3\x28 broken\n", ":2: not valid UTF-8"),
    "100,000-character line": (b"ok\nok\n" + b"z" * 100_000 + b"\n", ":3: 100,000 characters"),
}


@pytest.mark.parametrize("case", TRAIN_CASES)
def test_bad_corpus(
    case: str, tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    content, needle = TRAIN_CASES[case]
    corpus = tmp_path / "corpus.txt"
    if content is not None:
        corpus.write_bytes(content)
    recipe = write_recipe(tmp_path, tiny_model_dir, corpus)
    code, err = run_main(monkeypatch, capsys, "train", str(recipe), "--output", str(tmp_path / "out"))
    assert_one_line_error(code, err, str(corpus), needle)
    assert not (tmp_path / "out").exists()


def test_recipe_typo_suggests_the_closest_key(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = make_corpus(tmp_path / "c.txt")
    recipe = write_recipe(tmp_path, tiny_model_dir, corpus, "  eval_evrey: 10\n")
    code, err = run_main(monkeypatch, capsys, "train", str(recipe), "--output", str(tmp_path / "out"))
    assert_one_line_error(code, err, f"{recipe}:8", '"train.eval_evrey"', 'did you mean "train.eval_every"')
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("override", "needles"),
    [
        ("model.pooler=clss", ['unknown pooler "clss"', 'did you mean "cls"']),
        ("objectives=[{name: infonse}]", ["objectives[0].name", 'did you mean "infonce"']),
        ("data.views.name=dropuot", ["data.views.name", 'did you mean "dropout"']),
        ("train.precision=fp8", ["train.precision"]),
    ],
)
def test_unknown_pooler_method_or_value(
    override: str,
    needles: list[str],
    tmp_path: Path,
    tiny_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    corpus = make_corpus(tmp_path / "c.txt")
    recipe = write_recipe(tmp_path, tiny_model_dir, corpus)
    args = ["train", str(recipe), "--output", str(tmp_path / "out"), "--set", override]
    code, err = run_main(monkeypatch, capsys, *args)
    assert_one_line_error(code, err, *needles)
    assert not (tmp_path / "out").exists()


def test_missing_model_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = make_corpus(tmp_path / "c.txt")
    recipe = write_recipe(tmp_path, tmp_path / "no-model", corpus)
    code, err = run_main(monkeypatch, capsys, "train", str(recipe), "--output", str(tmp_path / "out"))
    assert_one_line_error(code, err, str(tmp_path / "no-model"), "does not exist")
    assert not (tmp_path / "out").exists()


def test_output_folder_not_writable(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = make_corpus(tmp_path / "c.txt")
    recipe = write_recipe(tmp_path, tiny_model_dir, corpus)
    blocker = tmp_path / "a-file"
    blocker.write_text("x", encoding="utf-8")  # a folder cannot be made below a file, even by root
    code, err = run_main(monkeypatch, capsys, "train", str(recipe), "--output", str(blocker / "out"))
    assert_one_line_error(code, err, str(blocker / "out"), "not writable")


def test_data_dir_without_sts_files(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "empty-data").mkdir()
    args = ["evaluate", str(tiny_model_dir), "--data-dir", str(tmp_path / "empty-data"), "--output", "r.json"]
    code, err = run_main(monkeypatch, capsys, *args)
    assert_one_line_error(code, err, "STS12")
    assert not Path("r.json").exists()


def test_data_dir_with_one_missing_file(
    tmp_path: Path,
    tiny_model_dir: Path,
    data_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    partial = tmp_path / "data" / "sts" / "STS13"
    shutil.copytree(data_dir / "sts" / "STS13", partial)
    (partial / "STS.gs.headlines.txt").unlink()
    args = ["evaluate", str(tiny_model_dir), "--tasks", "STS13", "--data-dir", str(tmp_path / "data")]
    code, err = run_main(monkeypatch, capsys, *args, "--output", str(tmp_path / "r.json"))
    assert_one_line_error(code, err, "STS.gs.headlines.txt")
    assert not (tmp_path / "r.json").exists()


def test_gold_score_that_is_not_a_number(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    data = make_data_dir(tmp_path / "data", pairs=5)
    dev = data / "sts" / "STSBenchmark" / "sts-dev.csv"
    lines = dev.read_text(encoding="utf-8").splitlines()
    fields = lines[3].split("\t")
    fields[4] = "four"
    lines[3] = "\t".join(fields)
    dev.write_text("\n".join(lines) + "\n", encoding="utf-8")
    args = ["evaluate", str(tiny_model_dir), "--tasks", "stsb-dev", "--data-dir", str(data)]
    code, err = run_main(monkeypatch, capsys, *args)
    assert_one_line_error(code, err, f"{dev}:4", "'four'")

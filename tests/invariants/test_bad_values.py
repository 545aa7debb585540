"""Bad values through the CLI: each gives one line naming the key, option or file, exit status 2, no output.

Recipe keys, part options and command-line options out of range or of the wrong type; damaged model
folders; empty input files. (tests/test_bad_input.py covers bad corpora, typos and missing files.)
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_one_line_error, make_corpus, make_data_dir, run_main, write_recipe
from safetensors.torch import load_file, save_file

from csekit.encoding.encoder import SentenceEncoder

RECIPE_VALUES = {
    "max_grad_norm zero": ("train.max_grad_norm=0", "train.max_grad_norm"),
    "max_grad_norm negative": ("train.max_grad_norm=-1.0", "train.max_grad_norm"),
    "eval_batch_size zero": ("run.eval_batch_size=0", "run.eval_batch_size"),
    "no objectives": ("objectives=[]", "objectives"),
    "negative weight decay": ("train.weight_decay=-0.01", "train.weight_decay"),
    "negative seed": ("train.seed=-1", "train.seed"),
    "seed beyond numpy's range": ("train.seed=4294967296", "train.seed"),
    "infinite lr": ("train.lr=.inf", "train.lr"),
    "dropout of 1": ("model.dropout=1.0", "model.dropout"),
    "negative dropout": ("model.dropout=-0.1", "model.dropout"),
    "negative workers": ("run.num_workers=-1", "run.num_workers"),
    "max_chars of a document, not a sentence": ("data.max_chars=300000000", "data.max_chars"),
    "packed neither auto, true nor false": ("run.packed=always", "run.packed"),
    "objective weight text": ("objectives=[{name: infonce, weight: heavy}]", "objectives[0].weight"),
    "negative objective weight": ("objectives=[{name: infonce, weight: -1}]", "objectives[0].weight"),
}


@pytest.mark.parametrize("case", RECIPE_VALUES)
def test_recipe_value_out_of_range(
    case: str, tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    override, key = RECIPE_VALUES[case]
    recipe = write_recipe(tmp_path, tiny_model_dir, make_corpus(tmp_path / "c.txt", lines=32))
    args = ["train", str(recipe), "--output", str(tmp_path / "out"), "--set", override, "--no-progress"]
    code, err = run_main(monkeypatch, capsys, *args)
    assert_one_line_error(code, err, f"recipe key {key} ")
    assert not (tmp_path / "out").exists()


def test_recipe_value_error_names_the_file_line(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe = write_recipe(tmp_path, tiny_model_dir, make_corpus(tmp_path / "c.txt"), "  max_grad_norm: 0\n")
    code, err = run_main(monkeypatch, capsys, "train", str(recipe), "--output", str(tmp_path / "out"))
    assert_one_line_error(code, err, f"{recipe}:8", "train.max_grad_norm", "null for no clipping")


PART_OPTIONS = {
    "text for a number": ("[{name: infonce, temperature: cold}]", "objectives[0].temperature", "a finite number"),
    "bool for a number": ("[{name: infonce, temperature: true}]", "objectives[0].temperature", "a finite number"),
    "NaN temperature": ("[{name: infonce, temperature: .nan}]", "objectives[0].temperature", "a finite number"),
    "float for a view index": ("[{name: infonce, anchor_view: 0.5}]", "objectives[0].anchor_view", "an integer"),
    "text for a list": (
        "[{name: multi_positive, positive_views: one}]",
        "objectives[0].positive_views",
        "a list of integers or null",
    ),
}


@pytest.mark.parametrize("case", PART_OPTIONS)
def test_part_option_of_the_wrong_type(
    case: str, tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    objectives, key, expected = PART_OPTIONS[case]
    recipe = write_recipe(tmp_path, tiny_model_dir, make_corpus(tmp_path / "c.txt", lines=32))
    args = ["train", str(recipe), "--output", str(tmp_path / "out"), "--set", f"objectives={objectives}"]
    code, err = run_main(monkeypatch, capsys, *args, "--no-progress")
    assert_one_line_error(code, err, f"recipe key {key}: expected {expected}")
    assert not (tmp_path / "out").exists()


def test_part_options_of_the_right_type_still_build() -> None:
    from csekit.parts.objectives import OBJECTIVES
    from csekit.training.part_building import build_part

    part = build_part(OBJECTIVES, {"name": "multi_positive", "temperature": 1, "positive_views": [1, 2]}, "o")
    assert part.temperature == 1 and part.positive_views == [1, 2]  # an int is a float; a list of ints fits


def test_max_length_beyond_the_backbone_positions(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe = write_recipe(tmp_path, tiny_model_dir, make_corpus(tmp_path / "c.txt", lines=32))
    args = ["train", str(recipe), "--output", str(tmp_path / "out"), "--set", "model.max_length=100"]
    code, err = run_main(monkeypatch, capsys, *args, "--no-progress")
    assert_one_line_error(code, err, "recipe key model.max_length: 100", "(64)")  # the tiny model has 64 positions
    assert not (tmp_path / "out").exists()


def cli_option_cases(tmp_path: Path, model: Path) -> dict[str, tuple[list[str], str, Path]]:
    """(arguments, the option the message must name, the output that must not appear) per case."""
    corpus, data, out = tmp_path / "c.txt", str(tmp_path / "data"), tmp_path / "out"
    evaluate = ["evaluate", str(model), "--data-dir", data, "--tasks", "stsb-dev", "--output", str(out)]
    augment = ["augment", "--corpus", str(corpus), "--output", str(out.with_suffix(".jsonl")), "--engine", "none"]
    return {
        "encode --batch-size -5": (
            ["encode", str(model), "-i", str(corpus), "-o", str(out), "--batch-size", "-5"],
            "--batch-size must be at least 1, got -5",
            out,
        ),
        "encode --batch-size 0": (
            ["encode", str(model), "-i", str(corpus), "-o", str(out), "--batch-size", "0"],
            "--batch-size",
            out,
        ),
        "evaluate --batch-size 0": ([*evaluate, "--batch-size", "0"], "--batch-size", out),
        "evaluate --n-jobs 0": ([*evaluate, "--n-jobs", "0"], "--n-jobs", out),
        "evaluate --n-jobs -3": ([*evaluate, "--n-jobs", "-3"], "--n-jobs", out),
        "evaluate --tasks ,": ([*evaluate, "--tasks", ","], "--tasks", out),
        "probe --batch-size 0": (
            ["probe", str(model), "--data-dir", data, "--output", str(out), "--batch-size", "0"],
            "--batch-size",
            out,
        ),
        "augment --limit 0": ([*augment, "--limit", "0"], "--limit", out.with_suffix(".jsonl")),
        "augment --chunk-size 0": ([*augment, "--chunk-size", "0"], "--chunk-size", out.with_suffix(".jsonl")),
        "augment --paraphrases without --engine file": (
            [*augment, "--paraphrases", str(corpus)],
            "--paraphrases",
            out.with_suffix(".jsonl"),
        ),
        "augment --pivots ,": (
            [*augment[:-2], "--engine", "marian", "--pivots", ","],
            "--pivots",
            out.with_suffix(".jsonl"),
        ),
        "freq --chunk-lines 0": (
            ["freq", "--corpus", str(corpus), "--tokenizer", str(model), "-o", str(out), "--chunk-lines", "0"],
            "--chunk-lines",
            out,
        ),
    }


CLI_CASES = list(cli_option_cases(Path("/unused"), Path("/unused")))


@pytest.mark.parametrize("case", CLI_CASES)
def test_cli_option_out_of_range(
    case: str, tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    make_corpus(tmp_path / "c.txt", lines=8)
    make_data_dir(tmp_path / "data", pairs=8)
    args, needle, output = cli_option_cases(tmp_path, tiny_model_dir)[case]
    code, err = run_main(monkeypatch, capsys, *args)
    assert_one_line_error(code, err, needle)
    assert not output.exists()


def test_empty_stsb_dev_file(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    data = make_data_dir(tmp_path / "data", pairs=5)
    dev = data / "sts" / "STSBenchmark" / "sts-dev.csv"
    dev.write_bytes(b"")
    args = ["evaluate", str(tiny_model_dir), "--tasks", "stsb-dev", "--data-dir", str(data)]
    code, err = run_main(monkeypatch, capsys, *args, "--output", str(tmp_path / "r.json"))
    assert_one_line_error(code, err, str(dev), "no scored sentence pairs")
    assert not (tmp_path / "r.json").exists()


def test_dev_file_with_one_gold_score(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Spearman is NaN when every gold score is equal: an error, not a NaN score with exit status 0."""
    data = make_data_dir(tmp_path / "data", pairs=3)
    dev = data / "sts" / "STSBenchmark" / "sts-dev.csv"
    rows = [line.split("\t") for line in dev.read_text(encoding="utf-8").splitlines()]
    dev.write_text("".join("\t".join([*r[:4], "2.5", *r[5:]]) + "\n" for r in rows), encoding="utf-8")
    args = ["evaluate", str(tiny_model_dir), "--tasks", "stsb-dev", "--data-dir", str(data)]
    code, err = run_main(monkeypatch, capsys, *args)
    assert_one_line_error(code, err, str(dev), "at least two different gold scores")


# --- model folders ----------------------------------------------------------------------------------------


def damaged_copy(tiny_model_dir: Path, tmp_path: Path, damage: str) -> Path:
    import shutil

    folder = tmp_path / f"model-{damage}"
    shutil.copytree(tiny_model_dir, folder)
    weights = folder / "model.safetensors"
    if damage == "truncated weights":
        data = weights.read_bytes()
        weights.write_bytes(data[: len(data) // 2])
    elif damage == "half the weights":
        tensors = load_file(weights)
        save_file({k: v for k, v in tensors.items() if ".layer.1." not in k}, weights)
    elif damage == "no weights":
        weights.unlink()
    elif damage == "truncated tokenizer":
        tokenizer = folder / "tokenizer.json"
        tokenizer.write_bytes(tokenizer.read_bytes()[:100])
    elif damage == "modules.json not a list":  # read as a sentence-transformers folder (no csekit.json)
        (folder / "csekit.json").unlink()
        (folder / "modules.json").write_text('{"0": "Transformer"}', encoding="utf-8")
    return folder


MODEL_DAMAGE = {
    "truncated weights": "damaged",
    "half the weights": "weights missing (e.g. encoder.layer.1.",
    "no weights": "model.safetensors",
    "truncated tokenizer": "damaged",
    "modules.json not a list": "modules.json",
}


@pytest.mark.parametrize("damage", MODEL_DAMAGE)
def test_damaged_model_folder(
    damage: str,
    tmp_path: Path,
    tiny_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    folder = damaged_copy(tiny_model_dir, tmp_path, damage)
    (tmp_path / "in.txt").write_text("a man plays\n", encoding="utf-8")
    out = tmp_path / "out.npy"
    code, err = run_main(monkeypatch, capsys, "encode", str(folder), "-i", str(tmp_path / "in.txt"), "-o", str(out))
    assert_one_line_error(code, err, str(folder), MODEL_DAMAGE[damage])
    assert not out.exists()


def test_missing_weights_never_load_as_a_random_model(tmp_path: Path, tiny_model_dir: Path) -> None:
    from csekit.core.errors import CsekitError

    folder = damaged_copy(tiny_model_dir, tmp_path, "half the weights")
    with pytest.raises(CsekitError, match="refusing to fill them in at random"):
        SentenceEncoder.load(folder)


def test_a_checkpoint_without_the_unread_pooler_layer_loads_unchanged(tmp_path: Path, tiny_model_dir: Path) -> None:
    """RoBERTa's checkpoints have no pooler (NSP) layer; no csekit pooler reads it, so it may be missing."""
    import shutil

    folder = tmp_path / "no-pooler"
    shutil.copytree(tiny_model_dir, folder)
    tensors = load_file(folder / "model.safetensors")
    assert any(key.startswith("pooler.") for key in tensors)
    save_file({k: v for k, v in tensors.items() if not k.startswith("pooler.")}, folder / "model.safetensors")
    sentences = ["a man plays the guitar", "the dog runs"]
    expected = SentenceEncoder.load(tiny_model_dir).encode(sentences)
    np.testing.assert_array_equal(SentenceEncoder.load(folder).encode(sentences), expected)


def test_damaged_kept_head(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from conftest import make_tiny_encoder

    from csekit.parts.heads.mlp import MLPHead

    encoder = make_tiny_encoder(tmp_path / "tok")
    encoder.head = MLPHead(encoder.dim)
    encoder.save(tmp_path / "with-head")
    meta = json.loads((tmp_path / "with-head" / "csekit.json").read_text(encoding="utf-8"))
    head_file = tmp_path / "with-head" / meta["representation"]["head"]["path"] / "model.safetensors"
    head_file.write_bytes(head_file.read_bytes()[:20])
    (tmp_path / "in.txt").write_text("a man plays\n", encoding="utf-8")
    args = ["encode", str(tmp_path / "with-head"), "-i", str(tmp_path / "in.txt"), "-o", str(tmp_path / "o.npy")]
    code, err = run_main(monkeypatch, capsys, *args)
    assert_one_line_error(code, err, str(head_file), "cannot load the kept head")


# --- empty inputs -------------------------------------------------------------------------------------------


def test_encode_of_an_empty_file_writes_an_empty_matrix(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "in.txt").write_bytes(b"")
    out = tmp_path / "out.npy"
    code, _ = run_main(
        monkeypatch, capsys, "encode", str(tiny_model_dir), "-i", str(tmp_path / "in.txt"), "-o", str(out)
    )
    assert code == 0
    assert np.load(out).shape == (0, 32)


def test_freq_of_an_empty_corpus(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = tmp_path / "c.txt"
    corpus.write_bytes(b"\n  \n")
    out = tmp_path / "counts.json"
    args = ["freq", "--corpus", str(corpus), "--tokenizer", str(tiny_model_dir), "-o", str(out), "--no-progress"]
    code, err = run_main(monkeypatch, capsys, *args)
    assert_one_line_error(code, err, str(corpus), "no tokens")
    assert not out.exists()


def test_augment_of_an_empty_corpus_creates_nothing(tmp_path: Path) -> None:
    from csekit.core.errors import CsekitError
    from csekit.prep.augment import augment_corpus

    corpus = tmp_path / "c.txt"
    corpus.write_bytes(b"\n \n")
    with pytest.raises(CsekitError, match=f"corpus {corpus} has no sentences"):
        augment_corpus(corpus, tmp_path / "out.jsonl", None, nlp=None)
    assert not (tmp_path / "out.jsonl").exists()


# --- values checked at load, before anything is created (issue #49, defect 11) -----------------------------------

LATE_VALUES = {
    "a positive view the views do not make": ("objectives=[{name: infonce, positive_view: 5}]", "positive_view"),
    "nt_xent views beyond two": ("objectives=[{name: nt_xent, views: [0, 5]}]", "objectives[0].views"),
    "a momentum queue's view": ("negatives=[{name: momentum_queue, view: 4}]", "negatives[0].view"),
    "mixcse's anchor view": ("negatives=[{name: mixcse, anchor_view: 2}]", "negatives[0].anchor_view"),
    "a negative view": ("objectives=[{name: infonce, anchor_view: -1}]", "objectives[0].anchor_view"),
    "a margin's paraphrases from a text corpus": ("objectives=[{name: margin}]", '"paraphrase"'),
    "bml's negations from a text corpus": ("objectives=[{name: bml}]", '"negation"'),
}


@pytest.mark.parametrize("case", LATE_VALUES)
def test_a_value_a_training_step_would_refuse_is_refused_before_the_run_folder_exists(
    case: str, tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A view index the step does not make, a corpus field a text file cannot have: found at the first step (an
    IndexError traceback, or one line with the run folder left behind); now one line before anything exists."""
    override, needle = LATE_VALUES[case]
    recipe = write_recipe(tmp_path, tiny_model_dir, make_corpus(tmp_path / "c.txt", lines=32), "  max_steps: 1\n")
    args = ["train", str(recipe), "--output", str(tmp_path / "out"), "--set", override, "--no-progress"]
    code, err = run_main(monkeypatch, capsys, *args)
    assert_one_line_error(code, err, needle)
    assert not (tmp_path / "out").exists()


def test_view_indices_are_checked_against_the_views_a_recipe_makes() -> None:
    """The count comes from the views part (dropout's num_views, ConSERT's augmentations) and, for the training
    representations, from a head that makes its own (WhitenedCSE's num_positives); a momentum queue's `view` reads
    the inputs (its input_view_options)."""
    from csekit.core.errors import CsekitError
    from csekit.training.recipe import load_recipe

    whitening = "model.head={name: whitening, num_positives: 4}"
    good = [
        ["data.views={name: dropout, num_views: 3}", "objectives=[{name: infonce, positive_view: 2}]"],
        ["data.views={name: consert, augmentations: [none, shuffle, token_cutoff]}", "objectives.0.positive_view=2"],
        [whitening, "objectives=[{name: multi_positive, positive_views: [1, 2, 3]}]"],
        [whitening, "objectives=[{name: nt_xent, views: [0, 3]}]"],  # the head's views: nt_xent reads those
    ]
    for overrides in good:
        load_recipe(None, overrides)
    bad = [
        (["data.views={name: dropout, num_views: 3}", "objectives.0.positive_view=3"], "dropout) makes 3 views"),
        (["data.views={name: consert, augmentations: [none, shuffle]}", "objectives.0.positive_view=2"], "consert"),
        ([whitening, "objectives=[{name: multi_positive, positive_views: [4]}]"], "whitening) makes 4 views"),
        ([whitening, "negatives=[{name: momentum_queue, view: 2, queue_head: none}]"], "dropout) makes 2 views"),
    ]
    for overrides, needle in bad:
        with pytest.raises(CsekitError, match=needle.replace("(", r"\(").replace(")", r"\)")):
            load_recipe(None, overrides)


def test_a_jsonl_corpus_must_hold_the_fields_the_recipe_reads(tmp_path: Path) -> None:
    """Every row's field is a string or null (FILE:LINE otherwise), some row has it, and a batch whose first row
    lacks it still gives the field to the part (the collator read the first row's keys only: the margin objective
    stopped the run at such a batch)."""
    from csekit.core.errors import CsekitError
    from csekit.data.corpus import Corpus, TrainCollator

    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"text": "a"}\n{"text": "b", "paraphrase": 5}\n', encoding="utf-8")
    with pytest.raises(CsekitError, match=f'{corpus}:2: field "paraphrase" is an integer, not a string or null'):
        Corpus(corpus, fields=["paraphrase"])
    corpus.write_text('{"text": "a"}\n{"text": "b", "negation": "not b"}\n', encoding="utf-8")
    with pytest.raises(CsekitError, match='no row has the field "paraphrase"'):
        Corpus(corpus, fields=["paraphrase", "negation"])
    rows = Corpus(corpus, fields=["negation"])
    batch = TrainCollator(lambda sentences: {}, "text")([rows[0], rows[1]])
    assert batch["fields"] == {"negation": [None, "not b"]}


def test_bml_with_a_head_that_makes_views_is_refused_before_the_run_folder_exists(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """bml encodes the negations through the step's head, which WhitenedCSE's cannot do one vector at a time: that
    was found at the first step, after the run folder existed; now when the part is built."""
    corpus = tmp_path / "c.jsonl"
    lines = make_corpus(tmp_path / "c.txt", lines=32).read_text(encoding="utf-8").splitlines()
    corpus.write_text("".join(json.dumps({"text": t, "negation": f"not {t}"}) + "\n" for t in lines), "utf-8")
    recipe = write_recipe(tmp_path, tiny_model_dir, corpus, "  max_steps: 1\n")
    overrides = ["--set", "model.head={name: whitening, num_groups: 8}", "--set", "objectives=[{name: bml}]"]
    code, err = run_main(monkeypatch, capsys, "train", str(recipe), "--output", str(tmp_path / "out"), *overrides)
    assert_one_line_error(code, err, "objectives[0]", "use head mlp or none")
    assert not (tmp_path / "out").exists()

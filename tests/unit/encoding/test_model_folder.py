"""Mechanism 5 of issue #39: a model folder is checked before use (`encoding/model_folder.py`), as a backbone,
DCLR's complementary model, RankCSE's teacher, `csekit freq`'s tokenizer or an fsmt engine. Each case here was
a traceback, a hang or a silent wrong model (exit status 0) before the check.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import TinyTrainer, assert_one_line_error, make_corpus, make_tiny_encoder, run_main
from test_osscse import moses  # noqa: F401  (a fixture: the FSMT tokenizer's Moses steps)

from csekit.core.errors import CsekitError

CaptureErr = pytest.CaptureFixture[str]


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("model")
    make_tiny_encoder(root / "tokenizer").save(root / "tiny-model")
    return root / "tiny-model"


def _edit_config(folder: Path, **values: Any) -> None:
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    (folder / "config.json").write_text(json.dumps({**config, **values}), encoding="utf-8")


def _vocab_txt_instead_of_tokenizer_json(folder: Path, drop: str | None = None) -> None:
    """The same WordPiece vocabulary as a vocab.txt (what BERT checkpoints ship), without `drop`."""
    model = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))["model"]
    tokens = sorted(model["vocab"], key=model["vocab"].get)
    (folder / "tokenizer.json").unlink()
    (folder / "vocab.txt").write_text("".join(f"{t}\n" for t in tokens if t != drop), encoding="utf-8")


DAMAGED_FOLDERS: dict[str, tuple[Callable[[Path], Any], str, str]] = {
    # case: (damage, the file named, what the line says)
    "no-vocabulary": (lambda m: (m / "tokenizer.json").unlink(), "", "no vocabulary"),
    "vocab_size-not-the-weights'": (
        lambda m: _edit_config(m, vocab_size=200),
        "config.json",
        '"vocab_size" is 200 but',
    ),
    "positions-not-the-weights'": (
        lambda m: _edit_config(m, max_position_embeddings=128),
        "config.json",
        '"max_position_embeddings" is 128 but',
    ),
    "a-million-layers": (lambda m: _edit_config(m, num_hidden_layers=1_000_000), "config.json", "num_hidden_layers"),
    "hidden-size-1e9": (lambda m: _edit_config(m, hidden_size=1e9), "config.json", '"hidden_size" is 1000000000.0'),
    "vocab.txt-without-[UNK]": (
        lambda m: _vocab_txt_instead_of_tokenizer_json(m, drop="[UNK]"),
        "",
        "has no [UNK]",
    ),
    "vocabulary-a-device": (
        lambda m: ((m / "tokenizer.json").unlink(), (m / "vocab.txt").symlink_to("/dev/zero")),
        "vocab.txt",
        "not a regular file",
    ),
}


@pytest.mark.parametrize("case", DAMAGED_FOLDERS)
def test_a_damaged_model_folder_is_one_line_naming_the_file_in_encode(
    case: str, saved_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr
) -> None:
    damage, file, needle = DAMAGED_FOLDERS[case]
    model = Path(shutil.copytree(saved_model, tmp_path / "model"))
    damage(model)
    sentences = tmp_path / "in.txt"
    sentences.write_text("the dog runs\nzqxv \u2603\n", encoding="utf-8")
    output = tmp_path / "out.npy"
    code, err = run_main(monkeypatch, capsys, "encode", str(model), "-i", str(sentences), "-o", str(output))
    assert_one_line_error(code, err, str(model / file), needle)
    assert not output.exists()


def test_a_vocab_txt_with_its_special_tokens_still_loads(saved_model: Path, tmp_path: Path) -> None:
    """Guard: the BERT checkpoints' layout (vocab.txt, no tokenizer.json) is a usable vocabulary."""
    from csekit.encoding.encoder import SentenceEncoder

    model = Path(shutil.copytree(saved_model, tmp_path / "model"))
    _vocab_txt_instead_of_tokenizer_json(model)
    reference = SentenceEncoder.load(saved_model).encode(["the dog runs"])
    assert (SentenceEncoder.load(model).encode(["the dog runs"]) == reference).all()


@pytest.fixture
def no_vocabulary(saved_model: Path, tmp_path: Path) -> Path:
    model = Path(shutil.copytree(saved_model, tmp_path / "no-vocabulary"))
    (model / "tokenizer.json").unlink()
    return model


def test_train_refuses_a_backbone_without_a_vocabulary_before_creating_the_run(
    no_vocabulary: Path, tmp_path: Path, train_tiny: TinyTrainer
) -> None:
    """It trained to exit status 0 with a 5-token tokenizer: every word was [UNK]."""
    with pytest.raises(CsekitError, match="no vocabulary"):
        train_tiny(steps=1, lines=32, model=no_vocabulary)
    assert not (tmp_path / "run").exists()


def test_a_rankcse_teacher_or_a_dclr_complementary_model_without_a_vocabulary_is_refused(
    no_vocabulary: Path,
) -> None:
    from csekit.parts.objectives.ranking import RankingDistillation
    from csekit.parts.weighting.complementary import ComplementaryWeighting

    with pytest.raises(CsekitError, match=r"teachers\[0\]: .*no vocabulary"):
        RankingDistillation([str(no_vocabulary)], ["mean"], [1.0])
    with pytest.raises(CsekitError, match=r"weighting.model: .*no vocabulary"):
        ComplementaryWeighting(model=str(no_vocabulary))


def test_freq_refuses_a_tokenizer_without_a_vocabulary(
    no_vocabulary: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr
) -> None:
    corpus, output = make_corpus(tmp_path / "corpus.txt", lines=8), tmp_path / "counts.json"
    args = ("freq", "--corpus", str(corpus), "--tokenizer", str(no_vocabulary), "--output", str(output))
    code, err = run_main(monkeypatch, capsys, *args)
    assert_one_line_error(code, err, str(no_vocabulary), "no vocabulary")
    assert not output.exists()


def _fsmt_with(damage: Callable[[Path], Any], root: Path) -> str:
    from test_osscse import save_tiny_fsmt

    for source, target in [("en", "ru"), ("ru", "en")]:
        save_tiny_fsmt(root / f"wmt19-{source}-{target}", source, target)
    damage(root / "wmt19-en-ru")
    return str(root / "wmt19-{source}-{target}")


def _vocabulary_to_dev_zero(folder: Path) -> None:
    for name in ("vocab-src.json", "src_vocab.json"):
        if (folder / name).exists():
            (folder / name).unlink()
            (folder / name).symlink_to("/dev/zero")


FSMT_DAMAGE = {
    "vocabulary-a-device": (_vocabulary_to_dev_zero, "not a regular file"),
    "d_model-1e9": (lambda m: _edit_config(m, d_model=1e9), '"d_model" is 1000000000.0'),
}


@pytest.mark.usefixtures("moses")
@pytest.mark.parametrize("case", FSMT_DAMAGE)
def test_a_damaged_fsmt_model_folder_is_one_line_and_leaves_no_output(case: str, tmp_path: Path) -> None:
    """Both were tracebacks (a read of /dev/zero, a 1e9-wide model), and augment left an empty output file."""
    from test_input_lines import NoParse

    from csekit.prep.augment import augment_corpus
    from csekit.prep.paraphrase import FsmtEngine

    damage, needle = FSMT_DAMAGE[case]
    engine = FsmtEngine(pivots=["ru"], models=_fsmt_with(damage, tmp_path), device="cpu")
    output = tmp_path / "augmented" / "out.jsonl"
    with pytest.raises(CsekitError, match=needle) as error:
        augment_corpus(make_corpus(tmp_path / "corpus.txt", lines=4), output, engine, NoParse())
    assert "wmt19-en-ru" in str(error.value) and "\n" not in str(error.value)
    assert not output.exists() and not output.parent.exists()


@pytest.mark.usefixtures("moses")
def test_an_intact_fsmt_model_folder_still_translates(tmp_path: Path) -> None:
    """Guard: the check passes a tiny FSMT folder as transformers saves it."""
    from csekit.prep.paraphrase import FsmtEngine

    engine = FsmtEngine(pivots=["ru"], models=_fsmt_with(lambda m: None, tmp_path), device="cpu")
    assert len(engine(["the man plays"])) == 1


# --- model.templates against the model (issue #39) ---------------------------------------------------------


def test_a_template_with_its_mask_before_the_sentence_is_refused_at_the_recipe_line(tmp_path: Path) -> None:
    """It failed at step 1 (a traceback) and left the run folder behind, so the same command was then refused."""
    from csekit.training.recipe import load_recipe

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("model:\n  pooler: mask\n  templates: ['[MASK] means [X] .']\n", encoding="utf-8")
    with pytest.raises(CsekitError, match=r"recipe.yaml:3: recipe key model.templates: .*\[MASK\] after the sentence"):
        load_recipe(recipe)


def test_a_template_longer_than_the_model_positions_is_refused_before_the_run_folder(
    saved_model: Path, tmp_path: Path, train_tiny: TinyTrainer
) -> None:
    template = "[X] " + "the " * 70 + "means [MASK] ."  # the tiny model has 64 positions
    with pytest.raises(CsekitError, match=r"recipe key model.templates: .* takes 7\d tokens .* accepts 64"):
        train_tiny("model.pooler=mask", f"model.templates=['{template}']", lines=32, model=saved_model)
    assert not (tmp_path / "run").exists()

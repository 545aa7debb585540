"""Issue #64 ("Hostile files IV"), model folders: a peft adapter transformers applied by itself (defect 1),
config values transformers' own validators refuse (4) and a zero rope theta or factor (6). Each test failed before
its fix (a silently different model, a traceback, or a wrong reason)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from conftest import assert_one_line_error, make_corpus, make_tiny_encoder, make_tiny_mlm, run_main, write_recipe
from hypothesis import given, settings
from hypothesis import strategies as st

from csekit.core.errors import CsekitError
from csekit.encoding.encoder import SentenceEncoder

CaptureErr = pytest.CaptureFixture[str]

# --- 1: a model folder holding a peft adapter is refused by every load ------------------------------------------


def _add_adapter(folder: Path, targets: list[str]) -> Path:
    """Save a LoRA adapter of the model in `folder` into it, with non-zero B so that it changes every embedding."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModel

    model = get_peft_model(AutoModel.from_pretrained(folder), LoraConfig(r=2, target_modules=targets))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.fill_(0.5)
    model.save_pretrained(folder)
    assert (folder / "adapter_config.json").is_file() and (folder / "adapter_model.safetensors").is_file()
    return folder


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny encoder and a tiny masked LM (a DiffCSE generator), each with an adapter, and a corpus."""
    root = tmp_path_factory.mktemp("adapter")
    make_tiny_encoder(root / "tokenizer").save(root / "encoder")
    make_tiny_mlm(root / "generator")
    return {
        "encoder": _add_adapter(root / "encoder", ["query", "value"]),
        "generator": _add_adapter(root / "generator", ["query", "value"]),
        "corpus": make_corpus(root / "corpus.txt", lines=64),
    }


def test_the_library_applies_an_adapter_by_itself(models: dict[str, Path]) -> None:
    """Why the check exists: transformers' AutoModel applies the folder's adapter without being asked."""
    from transformers import AutoModel

    names = [name for name, _ in AutoModel.from_pretrained(models["encoder"]).named_parameters()]
    assert any("lora_" in name for name in names)


def test_an_adapter_in_a_model_folder_is_one_line_in_encode(
    models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr
) -> None:
    """encode (and evaluate, probe, diagnose, bench: SentenceEncoder.load) encoded with the adapter applied."""
    sentences = tmp_path / "in.txt"
    sentences.write_text("the dog runs\n", encoding="utf-8")
    output = tmp_path / "out.npy"
    code, err = run_main(monkeypatch, capsys, "encode", str(models["encoder"]), "-i", str(sentences), "-o", str(output))
    assert_one_line_error(code, err, str(models["encoder"] / "adapter_config.json"), "peft adapter")
    assert not output.exists()


@pytest.mark.parametrize("path", ["backbone", "dclr-model", "rankcse-teacher", "diffcse-generator"])
def test_an_adapter_is_one_line_in_every_model_a_recipe_loads(
    path: str, models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr
) -> None:
    """Each model a run loads (the backbone, so also MNTP's head from it; DCLR's complementary model, RankCSE's
    teacher, DiffCSE's generator): one line naming the adapter's file, and no run folder."""
    clean = tmp_path / "clean"
    make_tiny_encoder(tmp_path / "tokenizer").save(clean)
    backbone = models["encoder"] if path == "backbone" else clean
    hostile = models["generator" if path == "diffcse-generator" else "encoder"]
    recipe = write_recipe(tmp_path, backbone, models["corpus"])
    settings_for = {
        "backbone": [],
        "dclr-model": [f"weighting={{name: dclr, model: '{hostile}', phi: 0.9}}"],
        "rankcse-teacher": [
            f"objectives=[{{name: infonce}}, {{name: rank_distill, teachers: ['{hostile}'], teacher_poolers: [cls]}}]"
        ],
        "diffcse-generator": [f"objectives=[{{name: infonce}}, {{name: diffcse, generator: '{hostile}'}}]"],
    }
    extra = [argument for value in settings_for[path] for argument in ("--set", value)]
    output = tmp_path / "run"
    code, err = run_main(monkeypatch, capsys, "train", str(recipe), "--output", str(output), *extra)
    assert_one_line_error(code, err, str(hostile / "adapter_config.json"), "peft adapter")
    assert not output.exists()


ADAPTER_NAMES = ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin")


def test_the_adapter_file_names_are_the_libraries_own() -> None:
    from transformers.utils import ADAPTER_CONFIG_NAME, ADAPTER_SAFE_WEIGHTS_NAME, ADAPTER_WEIGHTS_NAME

    from csekit.encoding.model_files import ADAPTER_FILES

    assert ADAPTER_FILES == (ADAPTER_CONFIG_NAME, ADAPTER_SAFE_WEIGHTS_NAME, ADAPTER_WEIGHTS_NAME) == ADAPTER_NAMES


@pytest.fixture(scope="module")
def plain_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("plain")
    make_tiny_encoder(root / "tokenizer").save(root / "model")
    return root / "model"


@settings(max_examples=20, deadline=None, derandomize=True)
@given(st.sets(st.sampled_from(ADAPTER_NAMES), min_size=1), st.sampled_from(["file", "link", "folder"]))
def test_any_adapter_file_in_a_model_folder_refuses_the_load(plain_model: Path, names: set[str], kind: str) -> None:
    """Whatever adapter files a folder holds, as files, links or folders, every load refuses it before transformers
    reads anything (the tokenizer-only load of `csekit freq` included)."""
    from csekit.encoding.model_folder import load_model

    with tempfile.TemporaryDirectory() as root:
        folder = Path(shutil.copytree(plain_model, Path(root) / "model"))
        for name in names:
            if kind == "file":
                (folder / name).write_text("{}", encoding="utf-8")
            elif kind == "link":
                (folder / name).symlink_to(folder / "config.json")
            else:
                (folder / name).mkdir()
        for load in (lambda: SentenceEncoder.load(folder), lambda: load_model(folder, None)):
            with pytest.raises(CsekitError, match="peft adapter") as error:
                load()
            assert "\n" not in str(error.value) and min(names) in str(error.value)


def test_an_adapter_in_a_hub_repository_is_refused_too(models: dict[str, Path], tmp_path: Path) -> None:
    """A hub name (here from the cache, offline): transformers looks for adapter_config.json in the repository."""
    from transformers import AutoModel

    from csekit.encoding.model_folder import from_pretrained

    snapshot = tmp_path / "hub" / "models--org--tiny" / "snapshots" / "abc123"
    shutil.copytree(models["encoder"], snapshot)
    (tmp_path / "hub" / "models--org--tiny" / "refs").mkdir()
    (tmp_path / "hub" / "models--org--tiny" / "refs" / "main").write_text("abc123", encoding="utf-8")
    options = {"cache_dir": str(tmp_path / "hub"), "local_files_only": True}
    with pytest.raises(CsekitError, match=r'model "org/tiny" \(adapter_config\.json\).*peft adapter'):
        from_pretrained(AutoModel, "org/tiny", **options)

"""Issue #64 ("Hostile files IV"), model folders: a peft adapter transformers applied by itself (defect 1),
config values transformers' own validators refuse (4) and a zero rope theta or factor (6). Each test failed before
its fix (a silently different model, a traceback, or a wrong reason)."""

from __future__ import annotations

import json
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


def test_an_adapter_the_library_applied_anyway_is_refused_after_the_load(
    models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second line of defence: the files' check switched off (as if the adapter appeared after it), the model
    transformers built with an adapter is refused, never returned."""
    from csekit.encoding import model_files

    monkeypatch.setattr(model_files, "ADAPTER_FILES", ())
    with pytest.raises(CsekitError, match="peft adapter"):
        SentenceEncoder.load(models["encoder"])


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


# --- 4, 6: config.json values transformers' validators refuse, the keys csekit reads, a rotary theta or factor ----


@pytest.fixture(scope="module")
def decoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tiny_decoders import tiny_decoder_dir

    return tiny_decoder_dir(tmp_path_factory.mktemp("decoder") / "model")


def _with_config(model: Path, folder: Path, **values: object) -> Path:
    shutil.copytree(model, folder)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    (folder / "config.json").write_text(json.dumps({**config, **values}), encoding="utf-8")
    return folder


CONFIG_CASES: dict[str, tuple[dict[str, object], str]] = {
    "head_dim-odd": ({"head_dim": 7}, "even rotary dimension"),
    "initializer_range-1e308": ({"initializer_range": 1e308}, "initializer_range"),
    "layer_types-unknown": ({"layer_types": ["x", "y"]}, "layer_types"),
    "rope_parameters-text": ({"rope_parameters": "x"}, "rope_parameters"),
    "dtype-bogus": ({"dtype": "bogus"}, "bogus"),
    "is_causal-text": ({"is_causal": "no"}, '"is_causal" is "no"'),
    "tie_word_embeddings-number": ({"tie_word_embeddings": 1}, '"tie_word_embeddings" is 1'),
    "rope_theta-zero": ({"rope_parameters": {"rope_type": "default", "rope_theta": 0.0}}, '"rope_theta" is 0.0'),
    "rope_theta-negative": ({"rope_parameters": {"rope_type": "default", "rope_theta": -1.0}}, '"rope_theta" is -1.0'),
    "rope-factor-zero": (
        {"rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 0.0}},
        '"factor" is 0.0',
    ),
    "rope_theta-tiny": (
        {"rope_parameters": {"rope_type": "default", "rope_theta": 1e-308}},
        "computed from its config.json hold NaN or infinity",
    ),
}


@pytest.mark.parametrize("case", CONFIG_CASES)
def test_a_config_value_transformers_refuses_or_csekit_cannot_read_is_one_line(
    case: str, decoder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr
) -> None:
    """Tracebacks from transformers' config validators (StrictDataclass...Error, AttributeError for the dtype);
    `is_causal: "no"` loaded as causal; a zero rope theta or factor was refused as "the run that wrote it
    diverged"."""
    values, needle = CONFIG_CASES[case]
    model = _with_config(decoder, tmp_path / "model", **values)
    sentences = tmp_path / "in.txt"
    sentences.write_text("the dog runs\n", encoding="utf-8")
    output = tmp_path / "out.npy"
    code, err = run_main(monkeypatch, capsys, "encode", str(model), "-i", str(sentences), "-o", str(output))
    assert_one_line_error(code, err, needle)
    assert "diverged" not in err and not output.exists()
    assert str(model) in err


CONFIG_VALUES = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-3, max_value=64),
        st.sampled_from([0.0, -1.0, 1e-308, 1e308, 0.5, 2.0, 10000.0]),
        st.sampled_from(["", "x", "bogus", "default", "linear", "full_attention", "float16", "eager", "silu"]),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.sampled_from(["rope_type", "rope_theta", "factor", "x"]), inner, max_size=3),
    ),
    max_leaves=6,
)


EDGE_VALUES = st.sampled_from(
    [0, -1, 7, 3.5, 1e308, 1e-308, -0.5, "x", "bogus", None, True, [], {}, ["x"], {"rope_theta": 0.0}, {"x": 1}]
)
"""Values at the edges: zero, negative, odd, huge and tiny, of the wrong type, empty containers."""


@settings(max_examples=120, deadline=None, derandomize=True)
@given(st.data())
def test_any_value_of_a_tiny_models_config_key_loads_or_is_one_line(decoder: Path, data: st.DataObject) -> None:
    """Generated config.json values for the tiny decoder's own keys: the model loads, or one line names the file;
    never another exception."""
    config = json.loads((decoder / "config.json").read_text(encoding="utf-8"))
    key = data.draw(st.sampled_from(sorted(k for k in config if k != "model_type")), label="key")
    value = data.draw(st.one_of(EDGE_VALUES, CONFIG_VALUES), label="value")
    with tempfile.TemporaryDirectory() as root:
        model = _with_config(decoder, Path(root) / "model", **{key: value})
        try:
            SentenceEncoder.load(model)
        except CsekitError as error:
            assert "\n" not in str(error) and str(model) in str(error)

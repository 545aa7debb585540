"""bf16 weights (`model.weights_dtype`, issue 54 item 1): a LoRA run's frozen base in bf16, adapters and heads fp32.

A step changes the fp32 adapters and head only; the bf16 base stays bit for bit; full fine-tuning of bf16 weights
(whose small AdamW updates round away) is refused at recipe load; the saved model is the merged model in fp32, which
sentence-transformers loads as csekit does.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import make_corpus
from safetensors.torch import load_file
from tiny_decoders import tiny_decoder_dir

from csekit.core.errors import CsekitError
from csekit.encoding.encoder import SentenceEncoder
from csekit.training.backbone_options import backbone_weights_dtype
from csekit.training.execution import build_run_model, decide_execution
from csekit.training.model import load_encoder
from csekit.training.recipe import load_recipe
from csekit.training.trainer import train

pytest.importorskip("peft")

SENTENCES = ["a man plays the guitar slowly", "the dog", "she eats food quickly ."]
LORA = "model.lora={r: 4, alpha: 8, dropout: 0.0}"


def bf16_recipe(model: Path, corpus: Path, *extra: str):  # type: ignore[no-untyped-def]
    return load_recipe(
        None,
        [
            f"model.backbone={model}",
            "model.pooler=mean",
            "model.attention=bidirectional",
            "model.max_length=16",
            "model.head={name: mlp}",
            LORA,
            "model.weights_dtype=bf16",
            f"data.corpus={corpus}",
            "train.batch_size=8",
            "train.lr=1e-3",
            "train.max_steps=1",
            "train.eval_every=0",
            "train.log_every=1",
            "train.dev_task=none",
            "train.precision=bf16",  # emulated on a CPU without native bf16: slow, but the tiny model is tiny
            *extra,
        ],
    )


@pytest.fixture
def made(tmp_path: Path) -> tuple[Path, Path]:
    return tiny_decoder_dir(tmp_path / "model", "llama"), make_corpus(tmp_path / "corpus.txt", lines=32)


def test_the_base_is_bf16_and_the_adapters_and_head_fp32(made: tuple[Path, Path]) -> None:
    recipe = bf16_recipe(*made)
    execution = decide_execution(recipe, device_type="cpu")
    assert execution.weights_dtype == torch.bfloat16
    model, _ = build_run_model(recipe, load_encoder(recipe, execution.weights_dtype), execution)
    dtypes = {name: parameter.dtype for name, parameter in model.named_parameters()}
    adapters = {name for name in dtypes if "lora_" in name}
    head = {name for name in dtypes if name.startswith("head.")}
    assert adapters and head
    for name, dtype in dtypes.items():
        assert dtype == (torch.float32 if name in adapters | head else torch.bfloat16), name
    trainable = {name for name, parameter in model.named_parameters() if parameter.requires_grad}
    assert trainable == adapters | head


def test_a_step_changes_only_the_fp32_adapters_and_head(made: tuple[Path, Path], tmp_path: Path) -> None:
    model, corpus = made
    train(bf16_recipe(model, corpus), tmp_path / "run", show_progress=False)
    before = {name: value.to(torch.bfloat16) for name, value in load_file(model / "model.safetensors").items()}
    after = load_file(tmp_path / "run" / "checkpoint" / "model.safetensors")
    prefix, frozen = "encoder.backbone.base_model.model.", 0
    for key, value in after.items():
        if "lora_" in key or key.startswith("head."):
            assert value.dtype == torch.float32, key
            if "lora_B" in key:  # starts at zero: a step must move it
                assert value.abs().max() > 0, key
            continue
        name = key.removeprefix(prefix).replace(".base_layer.", ".")
        assert value.dtype == torch.bfloat16 and torch.equal(value, before[name]), key  # frozen: bit for bit
        frozen += 1
    assert frozen == len(before)
    # The saved model: the merged weights in fp32, and config.json says so (loaders follow it).
    saved = load_file(tmp_path / "run" / "last" / "model.safetensors")
    assert saved.keys() == before.keys() and {value.dtype for value in saved.values()} == {torch.float32}
    assert json.loads((tmp_path / "run" / "last" / "config.json").read_text())["dtype"] == "float32"
    moved = {key for key in saved if not torch.equal(saved[key], before[key].float())}
    assert moved and all(key.endswith("proj.weight") for key in moved)


def test_the_merged_bf16_run_loads_in_sentence_transformers(made: tuple[Path, Path], tmp_path: Path) -> None:
    st = pytest.importorskip("sentence_transformers")
    model, corpus = made
    recipe = bf16_recipe(model, corpus, "model.head={name: none}", "train.lr=5e-2", "train.max_steps=2")
    train(recipe, tmp_path / "run", show_progress=False)
    reloaded = SentenceEncoder.load(tmp_path / "run" / "last")
    assert next(reloaded.backbone.parameters()).dtype == torch.float32
    loaded = st.SentenceTransformer(str(tmp_path / "run" / "last"), device="cpu")
    assert next(loaded.parameters()).dtype == torch.float32
    expected = torch.from_numpy(reloaded.encode(SENTENCES))
    torch.testing.assert_close(torch.from_numpy(loaded.encode(SENTENCES)), expected, rtol=0, atol=1e-5)
    base = SentenceEncoder.load(model, "mean", attention="bidirectional")
    assert not torch.allclose(torch.from_numpy(base.encode(SENTENCES)), expected, atol=1e-3)  # the adapters count


def test_full_fine_tuning_of_bf16_weights_is_refused_at_load() -> None:
    with pytest.raises(CsekitError, match=r"model\.weights_dtype: bf16 weights train only as LoRA's frozen base"):
        load_recipe(None, ["model.weights_dtype=bf16"])
    with pytest.raises(CsekitError, match=r"model\.weights_dtype must be fp32, bf16, auto"):
        load_recipe(None, ["model.weights_dtype=fp16"])


@pytest.mark.parametrize(
    ("setting", "precision", "lora", "dtype"),
    [
        ("auto", "bf16", {"r": 4}, torch.bfloat16),
        ("auto", "fp32", {"r": 4}, torch.float32),  # a device without native bf16 (auto precision: fp32)
        ("auto", "bf16", None, torch.float32),  # full fine-tuning keeps fp32 weights
        ("fp32", "bf16", {"r": 4}, torch.float32),
        ("bf16", "bf16", {"r": 4}, torch.bfloat16),
    ],
)
def test_auto_is_bf16_only_for_a_lora_base_at_bf16_precision(
    setting: str, precision: str, lora: dict | None, dtype: torch.dtype
) -> None:
    assert backbone_weights_dtype(setting, precision, lora) == dtype


def test_bf16_weights_at_fp32_precision_are_one_line(made: tuple[Path, Path], tmp_path: Path) -> None:
    with pytest.raises(CsekitError, match=r"bf16 weights compute in bf16, and this run's precision is fp32") as error:
        train(bf16_recipe(*made, "train.precision=fp32"), tmp_path / "run", show_progress=False)
    assert "\n" not in str(error.value) and not (tmp_path / "run" / "metrics.jsonl").exists()


def test_bf16_weights_are_refused_under_fsdp(made: tuple[Path, Path]) -> None:
    with pytest.raises(CsekitError, match=r"model\.weights_dtype: bf16 weights .* not supported under FSDP"):
        decide_execution(bf16_recipe(*made), device_type="cpu", sharding="fsdp")
    decide_execution(bf16_recipe(*made, "model.weights_dtype=fp32"), device_type="cpu", sharding="fsdp")

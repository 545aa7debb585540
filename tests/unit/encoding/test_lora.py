"""LoRA through peft (issue 54, items 2 and 6): only the adapters and the method's head train, a killed run resumes
bit for bit, and the saved model (adapters merged into the weights) loads unchanged in sentence-transformers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import assert_same_checkpoint_weights, make_corpus, run_cli_with_test_parts
from safetensors.torch import load_file
from tiny_decoders import make_tiny_decoder, tiny_decoder_dir

from csekit.core.errors import CsekitError
from csekit.encoding.encoder import SentenceEncoder
from csekit.encoding.lora import add_lora, is_lora
from csekit.training.recipe import load_recipe
from csekit.training.trainer import train

pytest.importorskip("peft")

SENTENCES = ["a man plays the guitar slowly", "the dog", "she eats food quickly ."]


def lora_recipe(path: Path, model: Path, corpus: Path, extra: str = "") -> Path:
    path.write_text(
        f"""
model: {{backbone: "{model}", pooler: mean, attention: bidirectional, max_length: 16, dropout: 0.1,
        lora: {{r: 4, alpha: 8, dropout: 0.1}}, head: {{name: mlp}}}}
data: {{corpus: "{corpus}"}}
train: {{batch_size: 8, lr: 1.0e-3, max_steps: 4, eval_every: 2, log_every: 1, dev_task: none, precision: fp32,
        seed: 3}}
objectives:
  - {{name: infonce, temperature: 0.05}}
{extra}""",
        encoding="utf-8",
    )
    return path


def test_only_the_adapters_and_the_head_change_in_a_step(tmp_path: Path) -> None:
    model = tiny_decoder_dir(tmp_path / "model", "llama")
    recipe = lora_recipe(tmp_path / "r.yaml", model, make_corpus(tmp_path / "corpus.txt", lines=32))
    train(load_recipe(recipe, ["train.max_steps=1"]), tmp_path / "run", show_progress=False)
    before = load_file(model / "model.safetensors")
    after = load_file(tmp_path / "run" / "checkpoint" / "model.safetensors")
    prefix = "encoder.backbone.base_model.model."
    changed, frozen = set(), 0
    for key, value in after.items():
        if "lora_" in key or key.startswith("head."):
            if "lora_B" in key:  # lora_B starts at zero, so a step must move it
                assert value.abs().max() > 0, key
            changed.add(key)
            continue
        assert key.startswith(prefix), key
        name = key.removeprefix(prefix).replace(".base_layer.", ".")
        torch.testing.assert_close(value, before[name], rtol=0, atol=0, msg=key)  # frozen: bit for bit
        frozen += 1
    assert frozen == len(before) and any("lora_A" in key for key in changed) and any("head." in k for k in changed)
    # The saved model is the plain model with the adapters merged: its projections moved, nothing else did.
    saved = load_file(tmp_path / "run" / "last" / "model.safetensors")
    assert saved.keys() == before.keys()
    moved = {key for key in saved if not torch.equal(saved[key], before[key])}
    assert moved and all(key.endswith("proj.weight") for key in moved)


def test_a_killed_lora_run_resumes_bit_exactly(tmp_path: Path) -> None:
    model = tiny_decoder_dir(tmp_path / "model", "qwen2")
    corpus = make_corpus(tmp_path / "corpus.txt", lines=64)
    marker = tmp_path / "killed"
    kill = f'  - {{name: kill_once, weight: 0.0, at_call: 4, marker: "{marker}"}}\n'

    def run(name: str, *extra: str):  # type: ignore[no-untyped-def]
        recipe = lora_recipe(tmp_path / f"{name}.yaml", model, corpus, kill)
        args = ("train", str(recipe), "--output", str(tmp_path / name), "--no-progress", *extra)
        return run_cli_with_test_parts(*args, plugin_dir=tmp_path / "plugin")

    marker.write_text("not this run", encoding="utf-8")
    straight = run("straight")
    assert straight.returncode == 0, straight.stderr[-2000:]
    marker.unlink()
    killed = run("resumed")
    assert killed.returncode == -9 and marker.exists()  # SIGKILL in step 4; the checkpoint is from step 2
    resumed = run("resumed", "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert_same_checkpoint_weights(tmp_path / "straight", tmp_path / "resumed")  # adapters, head, frozen weights
    for run_name in ("straight", "resumed"):
        assert (tmp_path / run_name / "checkpoint" / "optimizer.pt").is_file()


def test_a_lora_model_saves_as_a_plain_sentence_transformers_folder(tmp_path: Path) -> None:
    st = pytest.importorskip("sentence_transformers")
    encoder = make_tiny_decoder("mistral", attention="bidirectional")
    lora = SentenceEncoder(add_lora(encoder.backbone, {"r": 4, "dropout": 0.0}), encoder.tokenizer, encoder.pooler)
    with torch.no_grad():  # adapters as if trained (lora_B starts at zero, where merging would change nothing)
        for name, parameter in lora.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.5)
    expected = lora.encode(SENTENCES)
    weights = {name: parameter.clone() for name, parameter in lora.named_parameters()}
    lora.save(tmp_path / "model")
    for name, parameter in lora.named_parameters():  # saving merged nothing into the training model
        assert torch.equal(parameter, weights[name]), name
    reloaded = SentenceEncoder.load(tmp_path / "model")
    assert not is_lora(reloaded.backbone)
    loaded = st.SentenceTransformer(str(tmp_path / "model"), device="cpu")
    for vectors in (reloaded.encode(SENTENCES), loaded.encode(SENTENCES)):
        torch.testing.assert_close(torch.from_numpy(vectors), torch.from_numpy(expected), rtol=0, atol=1e-5)
    assert not torch.allclose(
        torch.from_numpy(make_tiny_decoder("mistral", attention="bidirectional").encode(SENTENCES)),
        torch.from_numpy(expected),
    )


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("{r: 0}", "model.lora.r must be a whole number"),
        ("{rank: 8}", "model.lora has no key 'rank'"),
        ("{dropout: 1.5}", "model.lora.dropout must be in"),
        ("{target_modules: []}", "model.lora.target_modules must be"),
    ],
)
def test_bad_lora_options_are_one_line_at_load(value: str, message: str) -> None:
    with pytest.raises(CsekitError, match=message):
        load_recipe(None, [f"model.lora={value}"])


def test_a_target_module_the_model_lacks_is_one_line(tmp_path: Path) -> None:
    model = tiny_decoder_dir(tmp_path / "model", "llama")
    with pytest.raises(CsekitError, match=r"model\.lora\.target_modules"):
        SentenceEncoder.load(model, lora={"target_modules": ["no_such_proj"]})

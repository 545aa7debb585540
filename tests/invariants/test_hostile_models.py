"""Issue #49 ("Hostile files III"): YAML that skipped the bounded parser (defect 3), model-folder config values
outside the checked list (5), half-precision checkpoints (6, = #47 item 3) and the files transformers reads in a
model folder by itself (7). Each test here failed (a hang, a traceback or a silent wrong model) before the fix.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from conftest import (
    TinyTrainer,
    assert_one_line_error,
    make_tiny_encoder,
    run_main,
    write_recipe,
)
from safetensors.torch import load_file, save_file

from csekit.core.errors import CsekitError
from csekit.encoding.encoder import SentenceEncoder
from csekit.training.recipe import load_recipe

CaptureErr = pytest.CaptureFixture[str]

# --- 3: every YAML value goes through the bounded parser ------------------------------------------------------

FLOW_ALIAS_BOMB = (
    "[&a [x, x, x, x, x, x, x, x, x, x], "
    + ", ".join(
        f"&{name} [{', '.join([f'*{previous}'] * 10)}]" for previous, name in zip("abcdefgh", "bcdefghi", strict=True)
    )
    + "]"
)
"""One line of nine levels of ten aliases (about 400 bytes, 10^9 values): OmegaConf expanded it (a hang)."""


def test_an_alias_bomb_in_a_set_value_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr
) -> None:
    recipe = write_recipe(tmp_path, tmp_path / "model", tmp_path / "corpus.txt")
    args = ("train", str(recipe), "--output", str(tmp_path / "run"), "--set", f"model.templates={FLOW_ALIAS_BOMB}")
    code, err = run_main(monkeypatch, capsys, *args)
    assert_one_line_error(code, err, "--set model.templates", "expands to more than")
    assert not (tmp_path / "run").exists()


def test_a_large_value_within_the_bounds_is_a_short_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr
) -> None:
    """Four levels of nine aliases (6,561 values) pass the bounds, and OmegaConf's refusal quoted the whole
    expanded value: a line of 200,000 characters. The CLI prints at most MESSAGE_LIMIT characters of a message."""
    from csekit.core.errors import MESSAGE_LIMIT

    levels = ["&a [1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    levels += [f"&{name} [{', '.join([f'*{previous}'] * 9)}]" for previous, name in zip("ab", "bc", strict=True)]
    value = f"[{', '.join(levels)}, [{', '.join(['*c'] * 9)}]]"
    recipe = write_recipe(tmp_path, tmp_path / "model", tmp_path / "corpus.txt")
    args = ("train", str(recipe), "--output", str(tmp_path / "run"), "--set", f"train.lr={value}")
    code, err = run_main(monkeypatch, capsys, *args)
    assert_one_line_error(code, err, "--set train.lr", "characters not shown")
    assert len(err) < MESSAGE_LIMIT + 200
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("depth", [40, 5000])
def test_a_deeply_nested_set_value_is_one_line(depth: int) -> None:
    """5,000 levels was a RecursionError traceback; 40 passed PyYAML and reached recursive code further on."""
    with pytest.raises(CsekitError, match=r"--set model\.templates.*(nests more than 32 levels|nests too deeply)"):
        load_recipe(None, [f"model.templates={'[' * depth}x{']' * depth}"])


def test_a_set_value_that_is_not_yaml_is_still_its_text() -> None:
    """Guard: a value PyYAML cannot parse is the text itself, as before (`a: b` is a mapping, `a: b: c` not)."""
    assert load_recipe(None, ["model.backbone=a: b: c"]).model.backbone == "a: b: c"


def test_an_alias_bomb_in_a_suite_set_string_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr
) -> None:
    """The suite file itself is small and passes the bounds; its `set:` string was parsed by yaml.safe_load."""
    recipe = write_recipe(tmp_path, tmp_path / "model", tmp_path / "corpus.txt")
    suite = tmp_path / "suite.yaml"
    entry = {"recipe": str(recipe), "name": "bomb", "set": [f"model.templates={FLOW_ALIAS_BOMB}"]}
    suite.write_text(yaml.safe_dump({"recipes": [entry], "seeds": [0], "tasks": ["STSBenchmark"]}), encoding="utf-8")
    assert suite.stat().st_size < 600
    code, err = run_main(monkeypatch, capsys, "bench", str(suite), "--output", str(tmp_path / "out"))
    assert_one_line_error(code, err, "--set model.templates", "expands to more than")


# --- 6 (= #47 item 3): a half-precision checkpoint loads with fp32 master weights --------------------------


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("model")
    make_tiny_encoder(root / "tokenizer").save(root / "tiny-model")
    return root / "tiny-model"


def _stored_in(saved_model: Path, folder: Path, dtype: torch.dtype) -> Path:
    """A copy of the tiny model whose weights file and config.json say `dtype` (as hub half-precision copies do)."""
    shutil.copytree(saved_model, folder)
    weights = {name: tensor.to(dtype) for name, tensor in load_file(folder / "model.safetensors").items()}
    save_file(weights, folder / "model.safetensors")
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    config["dtype"] = str(dtype).removeprefix("torch.")
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_half_precision_checkpoint_trains_and_encodes_in_fp32(
    dtype: torch.dtype, saved_model: Path, tmp_path: Path, train_tiny: TinyTrainer
) -> None:
    """transformers 5 followed the file's dtype: fp16/bf16 parameters, and a step with the (fp32) MLP head failed
    with "mat1 and mat2 must have the same dtype"; `encode` said fp32 over a half-precision model."""
    model = _stored_in(saved_model, tmp_path / "half", dtype)
    encoder = SentenceEncoder.load(model)
    assert {parameter.dtype for parameter in encoder.backbone.parameters()} == {torch.float32}
    assert encoder.encode(["the dog runs"]).dtype == np.float32
    run = train_tiny(steps=1, lines=32, model=model)
    assert run.recipe.model.head["name"] == "mlp"  # the default head: an fp32 Linear after the backbone
    saved = load_file(run.folder / "last" / "model.safetensors")
    assert {tensor.dtype for tensor in saved.values()} == {torch.float32}  # the saved model keeps fp32


# --- 7: every file transformers reads in a model folder is listed and bounded first ---------------------------


def _copy(saved_model: Path, folder: Path) -> Path:
    return Path(shutil.copytree(saved_model, folder))


def _edit_json(path: Path, **values: object) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text(encoding="utf-8")), **values}), encoding="utf-8")


def test_an_oversized_chat_template_is_refused_before_transformers_reads_it(saved_model: Path, tmp_path: Path) -> None:
    """transformers read every chat template whole with the tokenizer (a 1 GiB one took a GiB); it loaded."""
    model = _copy(saved_model, tmp_path / "model")
    (model / "chat_template.jinja").write_text("{{ 'x' }}" * 2**18, encoding="utf-8")  # 2.25 MiB of template
    with pytest.raises(CsekitError, match=r"chat_template\.jinja is \d+ bytes, more than the 1048576"):
        SentenceEncoder.load(model)


def test_an_oversized_template_in_the_templates_folder_is_refused(saved_model: Path, tmp_path: Path) -> None:
    model = _copy(saved_model, tmp_path / "model")
    (model / "additional_chat_templates").mkdir()
    with open(model / "additional_chat_templates" / "tool.jinja", "wb") as handle:
        handle.truncate(2**30)  # a sparse GiB
    with pytest.raises(CsekitError, match=r"tool\.jinja is 1073741824 bytes, more than"):
        SentenceEncoder.load(model)


@pytest.mark.parametrize("name", ["../outside/tokenizer.4.0.0.json", "OUTSIDE"])
def test_fast_tokenizer_files_outside_the_folder_are_refused(name: str, saved_model: Path, tmp_path: Path) -> None:
    """transformers joined the name to the folder and read that file as the tokenizer (it loaded, exit status 0)."""
    model = _copy(saved_model, tmp_path / "model")
    (tmp_path / "outside").mkdir()
    shutil.copy(model / "tokenizer.json", tmp_path / "outside" / "tokenizer.4.0.0.json")
    name = name.replace("OUTSIDE", str(tmp_path / "outside" / "tokenizer.4.0.0.json"))
    _edit_json(model / "tokenizer_config.json", fast_tokenizer_files=[name])
    with pytest.raises(CsekitError, match=r'tokenizer_config\.json: "fast_tokenizer_files": .* leads outside'):
        SentenceEncoder.load(model)


def test_a_fast_tokenizer_file_past_the_tokenizer_limit_is_refused(saved_model: Path, tmp_path: Path) -> None:
    """The versioned name escaped the tokenizer.json limit: 65 MiB were read and parsed (a traceback)."""
    model = _copy(saved_model, tmp_path / "model")
    with open(model / "tokenizer.4.0.0.json", "wb") as handle:
        handle.truncate(65 * 2**20)
    _edit_json(model / "tokenizer_config.json", fast_tokenizer_files=["tokenizer.4.0.0.json"])
    with pytest.raises(CsekitError, match=r"tokenizer\.4\.0\.0\.json is 68157440 bytes, more than"):
        SentenceEncoder.load(model)


@pytest.mark.parametrize("shard", ["../elsewhere/weights.safetensors", "ABSOLUTE"])
def test_weight_shards_outside_the_folder_are_refused(shard: str, saved_model: Path, tmp_path: Path) -> None:
    """The index's shard names were joined to the folder: weights loaded from anywhere (exit status 0)."""
    model = _copy(saved_model, tmp_path / "model")
    (tmp_path / "elsewhere").mkdir()
    weights = (model / "model.safetensors").rename(tmp_path / "elsewhere" / "weights.safetensors")
    shard = shard.replace("ABSOLUTE", str(weights))
    index = {"metadata": {}, "weight_map": {name: shard for name in load_file(weights)}}
    (model / "model.safetensors.index.json").write_text(json.dumps(index), encoding="utf-8")
    with pytest.raises(CsekitError, match=r'model\.safetensors\.index\.json: "weight_map": .* leads outside'):
        SentenceEncoder.load(model)


def test_a_link_out_of_the_folder_is_refused(saved_model: Path, tmp_path: Path) -> None:
    """A link to a regular file elsewhere (here someone else's tokenizer) was followed."""
    model = _copy(saved_model, tmp_path / "model")
    (model / "tokenizer.json").rename(tmp_path / "tokenizer.json")
    (model / "tokenizer.json").symlink_to(tmp_path / "tokenizer.json")
    with pytest.raises(CsekitError, match=r"tokenizer\.json is a link leading outside the model folder"):
        SentenceEncoder.load(model)


def test_sharded_weights_and_a_hub_cache_snapshot_still_load(saved_model: Path, tmp_path: Path) -> None:
    """Guard: an index naming shards inside the folder, and a cache snapshot whose files are links to ../../blobs."""
    reference = SentenceEncoder.load(saved_model).encode(["the dog runs"])
    model = _copy(saved_model, tmp_path / "sharded")
    weights = load_file(model / "model.safetensors")
    (model / "model.safetensors").unlink()
    names = sorted(weights)
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for shard, keys in halves.items():
        save_file({key: weights[key] for key in keys}, model / shard)
    index = {"metadata": {}, "weight_map": {key: shard for shard, keys in halves.items() for key in keys}}
    (model / "model.safetensors.index.json").write_text(json.dumps(index), encoding="utf-8")
    assert (SentenceEncoder.load(model).encode(["the dog runs"]) == reference).all()

    repo = tmp_path / "hub" / "models--org--tiny"
    snapshot, blobs = repo / "snapshots" / "abc123", repo / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    for file in saved_model.rglob("*"):
        if file.is_file():
            blob = blobs / f"{abs(hash(str(file))):x}"
            shutil.copy(file, blob)
            link = snapshot / file.relative_to(saved_model)
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(os.path.relpath(blob, link.parent))  # as huggingface_hub links them
    assert (SentenceEncoder.load(snapshot).encode(["the dog runs"]) == reference).all()


# --- 5: config values by type and range, and the model's size as a whole, before it is built -----------------

BAD_CONFIG_VALUES: dict[str, tuple[str, dict[str, object], str]] = {
    # case: (file, values written into it, what the line says)
    "hidden_act-nope": ("config.json", {"hidden_act": "nope"}, '"hidden_act" is "nope"; csekit loads models with an'),
    "pad_token_id-beyond-the-vocabulary": ("config.json", {"pad_token_id": 5000}, '"pad_token_id" is 5000'),
    "layer_norm_eps-text": ("config.json", {"layer_norm_eps": "tiny"}, '"layer_norm_eps" is "tiny"'),
    "layer_norm_eps-negative": ("config.json", {"layer_norm_eps": -1.0}, "between 0 and 1"),
    "dropout-2": ("config.json", {"hidden_dropout_prob": 2.0}, "a probability in [0, 1)"),
    "quantization_config": ("config.json", {"quantization_config": {"quant_method": "bitsandbytes"}}, "quantized"),
    "flash_attention_2": ("config.json", {"attn_implementation": "flash_attention_2"}, '"flash_attention_2"'),
    "chunk_size_feed_forward": ("config.json", {"chunk_size_feed_forward": 5}, '"chunk_size_feed_forward" is 5'),
    "use_cache-text": ("config.json", {"use_cache": "yes"}, "a value of type bool"),
    "negative-model_max_length": ("tokenizer_config.json", {"model_max_length": -5}, '"model_max_length" is -5'),
    "num_labels-30000000": ("config.json", {"num_labels": 30_000_000}, '"num_labels" is 30000000'),
    "layers-times-width": (
        "config.json",
        {"num_hidden_layers": 48, "hidden_size": 8192, "intermediate_size": 32768, "num_attention_heads": 64},
        "would have 38,",
    ),
}


@pytest.mark.parametrize("case", BAD_CONFIG_VALUES)
def test_a_config_value_outside_its_type_or_range_is_one_line_before_the_model_is_built(
    case: str, saved_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr
) -> None:
    """Each was a traceback (KeyError, AssertionError, ImportError, OverflowError in Rust...), a step that failed
    later, or gigabytes allocated (30 million labels, 38 billion parameters) before anything refused them."""
    file, values, needle = BAD_CONFIG_VALUES[case]
    model = _copy(saved_model, tmp_path / "model")
    _edit_json(model / file, **values)
    sentences = tmp_path / "in.txt"
    sentences.write_text("the dog runs\n", encoding="utf-8")
    output = tmp_path / "out.npy"
    code, err = run_main(monkeypatch, capsys, "encode", str(model), "-i", str(sentences), "-o", str(output))
    assert_one_line_error(code, err, str(model / file), needle)
    assert not output.exists()


def test_a_model_type_with_other_defaults_and_token_ids_still_loads(tmp_path: Path) -> None:
    """Guard: a RoBERTa-style config (pad 1, bos 0, eos 2, eager attention, no chunking) passes every check."""
    make_tiny_encoder(tmp_path / "tokenizer", model_type="roberta").save(tmp_path / "model")
    _edit_json(tmp_path / "model" / "config.json", attn_implementation="eager", chunk_size_feed_forward=0)
    assert SentenceEncoder.load(tmp_path / "model").encode(["the dog runs"]).shape == (1, 32)


def test_every_file_transformers_opens_in_a_model_folder_is_one_the_listing_check_bounds(
    saved_model: Path, tmp_path: Path
) -> None:
    """The rule as a mechanism: what the libraries open (Python's `open` audit events, during a whole load) is
    matched by `LIBRARY_READS`, so a new file transformers starts reading fails here until the check knows it."""
    import sys

    from csekit.encoding.model_files import library_pattern

    model = _copy(saved_model, tmp_path / "model")
    (model / "chat_template.jinja").write_text("{{ messages }}", encoding="utf-8")
    (model / "generation_config.json").write_text("{}", encoding="utf-8")
    opened: list[str] = []
    recording = [True]

    def record(event: str, args: tuple[object, ...]) -> None:
        if recording[0] and event == "open" and isinstance(args[0], str | bytes | os.PathLike):
            opened.append(os.fsdecode(args[0]))

    sys.addaudithook(record)  # an audit hook stays for the process: `recording` turns it off
    try:
        SentenceEncoder.load(model)
    finally:
        recording[0] = False
    inside = [Path(path) for path in opened if Path(path).is_relative_to(model) and not Path(path).is_dir()]
    assert any(path.name == "chat_template.jinja" for path in inside)  # the hook sees transformers' reads
    read_by_csekit = {"csekit.json", "modules.json"}
    unchecked = [str(p) for p in inside if library_pattern(p.name) is None and p.name not in read_by_csekit]
    assert not unchecked, unchecked

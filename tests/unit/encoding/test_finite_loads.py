"""Every loaded tensor is finite (issue "Hostile files IV"): one load point, `model_folder.load_model`, checks every
model csekit loads (a backbone, DCLR's and RankCSE's teachers, DiffCSE's generator, an MLM or TSDAE decoder,
MNTP's LM head, a kept head) with `refuse_non_finite`; a NaN or infinite weight in any of them is one line.
Before, only the sentence encoder checked its weights: a generator, a decoder or a head with a NaN weight loaded."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import torch
from conftest import make_tiny_encoder, make_tiny_mlm
from safetensors.torch import load_file, save_file
from test_architecture import SRC, module_name
from tiny_decoders import decoder_config, make_decoder_tokenizer
from transformers import AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM

from csekit.core.errors import CsekitError
from csekit.encoding.model_folder import load_model


def _poison(weights: Path, value: float) -> None:
    """Put `value` (NaN, inf) into one element of the first floating-point tensor of a safetensors file."""
    tensors = load_file(weights)
    name = next(key for key, tensor in sorted(tensors.items()) if tensor.is_floating_point())
    tensors[name] = tensors[name].clone()
    tensors[name].view(-1)[0] = value
    save_file(tensors, weights, metadata={"format": "pt"})


def _causal_lm(folder: Path) -> Path:
    tokenizer = make_decoder_tokenizer()
    AutoModelForCausalLM.from_config(decoder_config("llama", len(tokenizer))).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _kept_head(folder: Path) -> Path:
    """A csekit model folder with a kept head (a DenseTanh, as `head_at_test: true` saves it)."""
    make_tiny_encoder(folder).save(folder)
    (folder / "head").mkdir()
    save_file({"linear.weight": torch.eye(32), "linear.bias": torch.zeros(32)}, folder / "head" / "model.safetensors")
    meta = json.loads((folder / "csekit.json").read_text(encoding="utf-8"))
    meta["representation"]["head"] = {"dim": 32, "path": "head"}
    (folder / "csekit.json").write_text(json.dumps(meta), encoding="utf-8")
    return folder


MODELS = {
    "backbone or teacher (AutoModel)": (lambda folder: make_tiny_encoder(folder).save(folder), AutoModel, "model"),
    "DiffCSE generator, MLM decoder (AutoModelForMaskedLM)": (make_tiny_mlm, AutoModelForMaskedLM, "model"),
    "TSDAE decoder, MNTP LM head (AutoModelForCausalLM)": (_causal_lm, AutoModelForCausalLM, "model"),
    "kept head": (_kept_head, AutoModel, "head"),
}


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
@pytest.mark.parametrize("kind", sorted(MODELS))
def test_a_non_finite_weight_in_any_loaded_model_is_one_line(kind: str, value: float, tmp_path: Path) -> None:
    make, model_class, poisoned = MODELS[kind]
    folder = tmp_path / "model"
    folder.mkdir()
    make(folder)
    assert load_model(str(folder), model_class).model is not None  # loads while every weight is finite
    _poison(folder / ("head" if poisoned == "head" else "") / "model.safetensors", value)
    with pytest.raises(CsekitError, match=r"weight tensors hold NaN or infinity") as error:
        load_model(str(folder), model_class)
    assert "\n" not in str(error.value) and str(folder) in str(error.value)


# --- the one load point --------------------------------------------------------------------------------------

WEIGHT_LOADS = {"load_state_dict", "load_model", "load_safetensors", "from_pretrained", "load"}
FINITE_CHECKED = {
    ("csekit.encoding.model_folder", "load_model"): "refuse_non_finite on the model and the kept head it loaded",
    ("csekit.encoding.model_folder", "_load_weights"): "called by load_model only (refuse_non_finite after)",
    ("csekit.encoding.model_folder", "load_kept_head"): "called by load_model only (refuse_non_finite after)",
    ("csekit.encoding.model_folder", "from_pretrained"): "the one transformers call; models come from _load_weights",
    ("csekit.training.checkpoint", "_load_model_and_optimizer"): "non_finite_parameters after the load (resume)",
    ("csekit.training.checkpoint", "_load_state_dict"): "optimizer and scheduler state, checked by state_checks",
    ("csekit.training.zero_state", "_send"): "the run's own weights, broadcast from the main process",
    ("csekit.training.sharding", "at_step"): "a copy of the run's own live weights",
}
"""(module, function) -> why the tensors it loads are finite."""
THROUGH_LOAD_MODEL = {
    ("csekit.encoding.encoder", "load"): "the sentence encoder's backbone (and DCLR's and RankCSE's teachers)",
    ("csekit.parts.objectives.diffcse", "load_generator"): "DiffCSE's generator",
    ("csekit.parts.objectives.mlm", "load_lm_head"): "the MLM auxiliary loss's head",
    ("csekit.parts.objectives.mntp", "load_lm_head"): "MNTP's LM head",
    ("csekit.parts.objectives.tsdae", "load_decoder"): "TSDAE's decoder",
    ("csekit.prep.frequency", "load_counting_tokenizer"): "a tokenizer only (no weights)",
    ("csekit.prep.paraphrase", "_load_translation_model"): "augment's translation models",
}
"""(module, function) -> what it loads through model_folder.load_model (which refuses a non-finite tensor)."""


def weight_loads(source: str, module: str) -> list[tuple[str, str]]:
    """(module, innermost function) of each call that puts tensors into a model: `load_state_dict`, safetensors'
    `load_model`/`load`, a `from_pretrained` (csekit's `load_model` of model_folder counts too)."""
    found: list[tuple[str, str]] = []

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else function
            if isinstance(child, ast.Call):
                func = child.func
                name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
                if name in WEIGHT_LOADS and not (name == "load" and not isinstance(func, ast.Name)):
                    found.append((module, function))
            visit(child, inner)

    visit(ast.parse(source), "<module>")
    return found


def test_every_weight_load_is_checked_for_finite_tensors() -> None:
    """A new way of loading weights (a `load_state_dict` in a part, a `from_pretrained` elsewhere) fails here until
    it goes through load_model or says why its tensors are finite."""
    calls = {
        call
        for path in sorted((SRC / "csekit").rglob("*.py"))
        for call in weight_loads(path.read_text(encoding="utf-8"), module_name(path))
    }
    unchecked = calls - set(FINITE_CHECKED) - set(THROUGH_LOAD_MODEL)
    assert not unchecked, f"load these through csekit.encoding.model_folder.load_model: {unchecked}"
    assert all(_imports_load_model(module) for module, _ in THROUGH_LOAD_MODEL)
    assert not (set(FINITE_CHECKED) | set(THROUGH_LOAD_MODEL)) - calls, "an entry is stale"
    tree = ast.parse((SRC / "csekit" / "encoding" / "model_folder.py").read_text(encoding="utf-8"))
    load = next(node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name == "load_model")
    assert "refuse_non_finite" in {ast.unparse(call.func) for call in ast.walk(load) if isinstance(call, ast.Call)}


def _imports_load_model(module: str) -> bool:
    """Whether `module`'s `load_model` is model_folder's (not safetensors' function of the same name)."""
    path = SRC / Path(*module.split(".")).with_suffix(".py")
    imports = (
        node for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))) if isinstance(node, ast.ImportFrom)
    )
    return any(
        node.module == "csekit.encoding.model_folder" and "load_model" in {a.name for a in node.names}
        for node in imports
    )


def test_the_load_check_finds_a_weight_load_elsewhere() -> None:
    source = "def f(m, s):\n    m.load_state_dict(s)\ndef g(p):\n    return AutoModel.from_pretrained(p)\n"
    assert weight_loads(source, "m") == [("m", "f"), ("m", "g")]

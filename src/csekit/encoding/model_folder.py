"""A model folder is checked before use, and every load of one goes through `from_pretrained` here.

A model folder may come from anyone, and transformers trusts it: without tokenizer.json or vocab.txt
it builds a tokenizer of the 5 special tokens and every sentence encodes to [UNK] (exit status 0, wrong
embeddings); `num_hidden_layers: 1000000` builds a million layers; a `vocab_size` or
`max_position_embeddings` that disagrees with the weights, or a vocabulary without its unknown token,
fails deep inside a load or a step. So before transformers sees a local folder (a backbone, DCLR's
complementary model, RankCSE's teacher, `csekit freq`'s tokenizer, an `fsmt` or `marian` engine):

* config.json's values have their declared types and ranges, and the model's size as a whole is bounded before
  it is built (`model_config`: sizes within `CONFIG_LIMITS`, `PARAMETER_LIMIT`);
* every file transformers may read is a bounded regular file inside the folder (`model_files.check_model_files`:
  a link to /dev/zero, a 1 GiB chat template, a shard named `../x` are refused; so is a peft adapter, which
  transformers would apply by itself), and a vocabulary file is there;
* the weight files hold floating-point weights, and their embedding matrices the rows config.json says
  (`weight_files.check_weight_files`, from the safetensors headers);

and after loading, `check_tokenizer` wants the tokenizer's special tokens in its vocabulary and its
vocabulary no larger than the embedding matrix. Each failure is one line naming the file.
`tests/invariants/architecture/test_architecture.py` finds any call of transformers' `from_pretrained` outside this
module.

`load_model` is the one way csekit loads a model by name or folder (the sentence encoder, `csekit freq`'s
tokenizer, the paraphrase engines' translation models): it reads a csekit, sentence-transformers or plain
transformers layout, refuses a model's own code, reads the hub's cache only when the hub is out of reach,
refuses weights filled in at random, and checks the tokenizer against the embedding matrix.
"""

from __future__ import annotations

import contextlib
import itertools
import pickle
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from csekit.core.bounded_read import read_json_file, read_with
from csekit.core.errors import CsekitError
from csekit.core.safe_names import child_path
from csekit.encoding.decoder import DECODER_SPECIAL_TOKENS, is_decoder_only
from csekit.encoding.folder_pooling import read_modules, transformer_folder
from csekit.encoding.hub import hub_options, resolve_model_path, unreachable_hub_message
from csekit.encoding.model_config import check_config_values, check_model_size, check_tokenizer_config
from csekit.encoding.model_files import adapter_message, check_model_files, refuse_hub_adapter
from csekit.encoding.representation import KeptHead, Representation, read_csekit_meta
from csekit.encoding.weight_files import check_weight_files

VOCABULARY_FILES = (
    "tokenizer.json",  # any fast tokenizer
    "vocab.txt",  # WordPiece (BERT)
    "vocab.json",  # byte-level BPE (RoBERTa), with merges.txt
    "merges.txt",
    "spiece.model",  # SentencePiece (ALBERT, T5, XLNet)
    "sentencepiece.bpe.model",  # XLM-R, CamemBERT
    "tokenizer.model",
    "source.spm",  # Marian
    "target.spm",
    "vocab-src.json",  # FSMT
    "vocab-tgt.json",
    "src_vocab.json",
    "tgt_vocab.json",
)
"""Files a tokenizer builds its vocabulary from; a folder needs at least one."""


def check_model_folder(folder: Path) -> dict[str, Any]:
    """Check a local model folder before transformers reads it; its config.json's values."""
    check_model_files(folder)  # every file a library may read: regular, bounded, inside the folder
    config_path = folder / "config.json"
    config = read_json_file(config_path, "model config") if config_path.exists() else {}
    if not isinstance(config, dict):
        raise CsekitError(f"{config_path}: expected a JSON object")
    check_config_values(config, config_path)  # sizes, types, ranges, keys csekit cannot honour
    check_tokenizer_config(folder)
    _check_vocabulary_files(folder)
    check_weight_files(folder, config, config_path)  # dtypes of every weight file, embedding rows
    return config


def _check_vocabulary_files(folder: Path) -> None:
    """At least one vocabulary file (`check_model_files` has checked that each is a bounded regular file)."""
    if not any((folder / name).is_file() for name in VOCABULARY_FILES):
        raise CsekitError(
            f"{folder}: no vocabulary (none of tokenizer.json, vocab.txt, vocab.json, a SentencePiece model); "
            "without one every word would be an unknown token"
        )


def from_pretrained(loader: Any, location: str, **options: Any) -> Any:
    """`loader.from_pretrained(location)` (AutoConfig, AutoModel, AutoTokenizer, FSMT..., Marian...), the one way
    csekit calls it: a local folder is checked first (`check_model_folder`), and never with its own code.

    A model is built with fp32 weights whatever its files' dtype (`dtype`/`torch_dtype` in config.json, fp16 or
    bf16 safetensors): transformers 5 follows the file, and half-precision master weights fail next to csekit's
    fp32 heads ("mat1 and mat2 must have the same dtype") or train silently in half precision on a GPU. Mixed
    precision is autocast's business (`train.precision`), never the stored weights'.
    """
    builds_a_model = _builds_a_model(loader)
    if Path(location).is_dir():
        config = check_model_folder(Path(location))  # adapter files included (`check_model_files`)
        if builds_a_model:
            # before a byte of it is allocated, with the config object the load passes when there is one
            check_model_size(config, Path(location) / "config.json", loader, options.get("config"))
    else:
        refuse_hub_adapter(location, options)  # transformers would apply a hub repository's adapter too
    if builds_a_model:
        import torch

        options.setdefault("dtype", torch.float32)
    return loader.from_pretrained(location, trust_remote_code=False, **options)


def _builds_a_model(loader: Any) -> bool:
    """Whether `loader` builds weights (AutoModel, a PreTrainedModel class), not a config or a tokenizer."""
    from transformers import PreTrainedModel  # here: importing csekit.prep must not import transformers

    try:
        return hasattr(loader, "from_config") or (isinstance(loader, type) and issubclass(loader, PreTrainedModel))
    except ImportError:  # transformers' placeholder for a class whose library is missing
        return False


ENCODER_SPECIAL_TOKENS = ("unk_token", "cls_token", "sep_token")
"""What a sentence encoder's tokenizer must define: its unknown token, and the tokens it wraps a sentence in
([CLS] ... [SEP], <s> ... </s> for RoBERTa: the tokenizer says which)."""
OPTIONAL_SPECIAL_TOKENS = ("pad_token", "mask_token", "bos_token", "eos_token")


def check_tokenizer(location: str, tokenizer: Any, rows: int | None, required: tuple[str, ...]) -> None:
    """The tokenizer's special tokens are in its vocabulary, and its ids fit an embedding matrix of `rows` rows.

    `required` names the special tokens the use needs (`ENCODER_SPECIAL_TOKENS`); the others are checked when
    the tokenizer defines them. A vocabulary without its unknown token fails at the first unknown word.
    """
    size = len(tokenizer)
    if rows is not None and size > rows:
        raise CsekitError(
            f'model "{location}": its tokenizer has {size:,} tokens but the embedding matrix {rows:,} rows; '
            "the tokenizer does not belong to these weights"
        )
    _check_unknown_token_in_model(location, tokenizer)
    unk_id = _token_id(tokenizer, tokenizer.unk_token) if tokenizer.unk_token is not None else None
    for attribute in (*required, *(a for a in OPTIONAL_SPECIAL_TOKENS if a not in required)):
        token = getattr(tokenizer, attribute, None)
        if token is None:
            if attribute in required:
                raise CsekitError(f'model "{location}": its tokenizer defines no {attribute} (a model needs one)')
            continue
        token_id = _token_id(tokenizer, token)
        missing = token_id is None or (attribute != "unk_token" and token_id == unk_id)
        if missing or not 0 <= token_id < (rows or size):  # type: ignore[operator]
            raise CsekitError(
                f'model "{location}": its vocabulary has no {token} ({attribute}), or an id beyond the embedding '
                "matrix; the tokenizer files are damaged or do not belong to this model"
            )


def _check_unknown_token_in_model(location: str, tokenizer: Any) -> None:
    """A fast tokenizer's WordPiece or BPE model needs its unknown token in its own vocabulary: transformers adds a
    missing [UNK] as an extra token, and the model fails at the first word it does not know."""
    model = getattr(getattr(tokenizer, "backend_tokenizer", None), "model", None)
    unknown = getattr(model, "unk_token", None)
    if isinstance(unknown, str) and unknown and model.token_to_id(unknown) is None:  # type: ignore[union-attr]
        raise CsekitError(
            f'model "{location}": its vocabulary has no {unknown} (the unknown token); the first word it does not '
            "know would fail. The tokenizer files are damaged or incomplete"
        )
    try:
        tokenizer("\u2603 xqzv", add_special_tokens=True)  # a character and a word outside most vocabularies
    except Exception as error:  # the tokenizers library raises a bare Exception
        reason = str(error).strip().splitlines()[0][:150] if str(error).strip() else type(error).__name__
        raise CsekitError(f'model "{location}": its tokenizer fails on an unknown word ({reason})') from None


def _token_id(tokenizer: Any, token: Any) -> int | None:
    token_id = tokenizer.convert_tokens_to_ids(str(token))
    return token_id if isinstance(token_id, int) and not isinstance(token_id, bool) else None


# --- what csekit and sentence-transformers saved beside the transformer -------------------------------------

CSEKIT_CONFIG = "csekit.json"
HEAD_FILE_LIMIT = 2**28
"""The largest kept-head safetensors file read (a d x d head: 64 MiB for d = 4096)."""
UNREAD_WEIGHTS_PREFIX = "pooler."
"""The backbone's own pooler layer (NSP head): only the `pooler_output` pooler reads it; RoBERTa checkpoints lack it."""


@dataclass(frozen=True)
class SavedLayout:
    """Where a model keeps its transformer, and what csekit or sentence-transformers saved with it."""

    transformer_dir: str
    #: The test-time representation csekit saved (csekit.json; `csekit.encoding.representation`), else the defaults.
    representation: Representation = field(default_factory=Representation)
    csekit_trained: bool = False  # whether csekit saved it (csekit.json)
    #: A sentence-transformers folder that csekit did not save: its own pooling is in modules.json, read only where a
    #: load reads the folder's own representation (csekit.encoding.folder_pooling).
    sentence_transformers: bool = False


def read_json(path: Path, expected: type = dict) -> Any:
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
        values = read_json(path)
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


def local_model_layout(path: Path, needs_config: bool = True) -> SavedLayout:
    """Where a local model folder keeps its transformer (a csekit, sentence-transformers or plain transformers
    layout) and what csekit saved with it; the folder's files checked first. `needs_config`: a folder without
    config.json is refused (a tokenizer alone is enough for `csekit freq`)."""
    layout = SavedLayout(str(path))
    if (path / CSEKIT_CONFIG).exists():
        layout = _csekit_layout(path, path / CSEKIT_CONFIG)
    elif (path / "modules.json").exists():
        layout = SavedLayout(str(transformer_folder(path, read_modules(path))), sentence_transformers=True)
    if not (Path(layout.transformer_dir) / "config.json").exists():
        if (path / "best").is_dir() or (path / "last").is_dir():
            raise CsekitError(
                f"{path} is a training run's folder, not a model: its best model is {path / 'best'} "
                f"(and the last one {path / 'last'})"
            )
        if needs_config:
            raise CsekitError(f"{path}: not a model directory (no config.json found)")
    check_model_files(Path(layout.transformer_dir))  # what transformers reads itself: bounded, regular, inside
    refuse_own_code(Path(layout.transformer_dir))
    return layout


def _csekit_layout(folder: Path, path: Path) -> SavedLayout:
    """`csekit.json`: the test-time representation csekit saved (`read_csekit_meta`: every value checked, in either
    layout), the kept head's weights checked where they are loaded."""
    return SavedLayout(str(folder), read_csekit_meta(read_json(path), path), csekit_trained=True)


def load_kept_head(folder: Path, kept: KeptHead, dim: int) -> Any:
    """The head csekit.json names: a `dim` x `dim` DenseTanh from safetensors in a folder inside the model."""
    from safetensors import SafetensorError
    from safetensors.torch import load as load_safetensors

    from csekit.encoding.kept_head import DenseTanh

    meta_file = folder / CSEKIT_CONFIG
    if kept.dim != dim:
        raise CsekitError(f"{meta_file}: the head's \"dim\" is {kept.dim!r}, the model's width is {dim}")
    head_file = _inside(folder, kept.path, meta_file) / "model.safetensors"
    try:
        head = DenseTanh(dim)
        weights = read_with(head_file, lambda handle: load_safetensors(handle.read()), "kept head", HEAD_FILE_LIMIT)
        head.linear.load_state_dict({k.removeprefix("linear."): v for k, v in weights.items()})
    except (OSError, TypeError, ValueError, RuntimeError, SafetensorError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise CsekitError(f"{head_file}: cannot load the kept head ({reason})") from None
    return head


# --- loading a model: the one function --------------------------------------------------------------------


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
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


def non_finite_parameters(module: Any) -> list[str]:
    """The names of `module`'s parameters and buffers that hold NaN or infinity (a diverged model)."""
    import torch

    tensors = itertools.chain(module.named_parameters(), module.named_buffers())
    return [name for name, tensor in tensors if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all())]


def refuse_non_finite(location: str, module: Any) -> None:
    """Every tensor of a loaded model finite, checked here for every model csekit loads (`load_model`: a backbone,
    a teacher, a generator, a decoder or LM head, a kept head): a NaN weight would make every embedding, score or
    loss NaN, silently."""
    bad = non_finite_parameters(module)
    if bad and not set(bad) & set(module.state_dict()):  # only buffers built from the config (rotary ones)
        raise CsekitError(
            f'model "{location}": {len(bad)} tensors computed from its config.json hold NaN or infinity (e.g. '
            f"{bad[0]}); a value there is out of range"
        )
    if bad:
        raise CsekitError(
            f'model "{location}": {len(bad)} weight tensors hold NaN or infinity (e.g. {bad[0]}); its embeddings '
            "would be NaN: the run that wrote it diverged"
        )


def freeze_unused_pooler(backbone: Any) -> None:
    """Freeze the backbone's own pooler layer: only the `pooler_output` pooler reads it (and unfreezes it), and
    frozen parameters keep DDP from flagging them as unused."""
    from torch import nn

    pooler = getattr(backbone, "pooler", None)
    if isinstance(pooler, nn.Module):
        pooler.requires_grad_(False)


@dataclass
class LoadedModel:
    """A model as `load_model` found it: its tokenizer, its weights (None when only the tokenizer was asked for),
    what its checkpoint lacked, and what csekit or sentence-transformers saved with it (kept head included)."""

    location: str  # the folder or hub name loaded (an alias resolved)
    local: bool  # a local folder, not a hub name
    tokenizer: Any
    model: Any | None
    missing_weights: frozenset[str]
    layout: SavedLayout
    head: Any | None = None


def load_model(
    name_or_path: str | Path,
    model_class: Any | None,
    *,
    tokenizer_class: Any | None = None,
    special_tokens: tuple[str, ...] | None = None,
    config_overrides: dict[str, Any] | None = None,
    aliases: bool = True,
    config: Any | None = None,
    new_weights: bool = False,
    weights_dtype: Any | None = None,
) -> LoadedModel:
    """Load a model by alias, hub name or folder (csekit, sentence-transformers or plain transformers layout).

    `model_class` builds the weights (AutoModel, a translation model's class), after AutoConfig with
    `config_overrides`; None loads the tokenizer only (`tokenizer_class`, AutoTokenizer by default). The tokenizer
    must define `special_tokens` (`ENCODER_SPECIAL_TOKENS` by default) and fit the embedding matrix. From a local
    folder, weights the checkpoint lacks (but the backbone's unread pooler layer) are refused: transformers would
    fill them in at random. Every failure is one line; `aliases`: the offline aliases are suggested for a name that
    cannot be found. `config`: a ready config for the weights instead of the folder's (a decoder built from an
    encoder's); `new_weights`: weights the checkpoint lacks are the model's own new ones (TSDAE's cross-attention
    and LM head: initialised at random by design), not a damaged folder. `weights_dtype`: the weights' torch dtype
    (None: fp32, as `from_pretrained` builds every model).
    """
    location = resolve_model_path(name_or_path)
    path = Path(location)
    local = path.is_dir()
    layout = local_model_layout(path, needs_config=model_class is not None) if local else SavedLayout(location)
    hub = hub_options(location)  # {} for a folder; refuses a path that does not exist
    from safetensors import SafetensorError  # here: importing csekit.prep must not import the model libraries

    try:
        with quiet_transformers():
            model, missing = None, frozenset[str]()
            if model_class is not None:
                model, missing = _load_weights(
                    model_class,
                    layout.transformer_dir,
                    local and not new_weights,
                    hub,
                    config_overrides,
                    config,
                    weights_dtype,
                )
            tokenizer = from_pretrained(tokenizer_class or _auto_tokenizer(), layout.transformer_dir, **hub)
    except (OSError, ValueError, RuntimeError, KeyError, EOFError, pickle.UnpicklingError, SafetensorError) as error:
        raise CsekitError(_load_failure(location, error, local, hub, aliases)) from None
    rows = model.get_input_embeddings().num_embeddings if model is not None else None
    default = DECODER_SPECIAL_TOKENS if model is not None and is_decoder_only(model.config) else ENCODER_SPECIAL_TOKENS
    check_tokenizer(location, tokenizer, rows, special_tokens or default)
    loaded = LoadedModel(location, local, tokenizer, model, missing, layout)
    if model is not None and layout.representation.head is not None:
        loaded.head = load_kept_head(path, layout.representation.head, int(model.config.hidden_size))
    for module in (model, loaded.head):
        if module is not None:
            refuse_non_finite(location, module)
    return loaded


def _auto_tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer


def _load_weights(
    model_class: Any,
    location: str,
    local: bool,
    hub: dict[str, Any],
    overrides: dict[str, Any] | None,
    config: Any | None = None,
    dtype: Any | None = None,
) -> tuple[Any, frozenset[str]]:
    """The model and the names of the weights its checkpoint lacked (initialised at random).

    Its NSP/pooler layer stays (so exports are complete) but is frozen (`freeze_unused_pooler`). transformers
    initialises weights a checkpoint lacks at random and goes on; from a local folder that means a damaged or
    wrong model, so missing weights (other than that pooler) are refused.
    """
    from transformers import AutoConfig

    if config is None:
        config = from_pretrained(AutoConfig, location, **hub, **(overrides or {}))
    config.output_hidden_states = False
    built = {"dtype": dtype} if dtype is not None else {}  # else from_pretrained's fp32
    # A weight of another shape is listed (and refused below, naming it) rather than raised as transformers' "look at
    # the above report", a report csekit's quiet loading hides.
    model, info = from_pretrained(
        model_class, location, config=config, output_loading_info=True, ignore_mismatched_sizes=True, **hub, **built
    )
    if getattr(model, "_hf_peft_config_loaded", False):  # the files checked first; this holds whatever changed since
        raise CsekitError(adapter_message(f'model "{location}"'))
    mismatched = sorted(info.get("mismatched_keys", ()), key=lambda entry: str(entry[0]))
    if mismatched:
        name, held, built_shape = mismatched[0]
        raise CsekitError(
            f"{location}: the weights do not fit the model in config.json: {len(mismatched)} weight(s) of another "
            f"shape (e.g. {name} is {list(held)}, the model's is {list(built_shape)}); refusing to fill them in at "
            "random"
        )
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
    freeze_unused_pooler(model)
    return model, frozenset(info.get("missing_keys", ()))


def _load_failure(location: str, error: BaseException, local: bool, hub: dict[str, Any], aliases: bool) -> str:
    """One line for a load that transformers refused: its own code, a name the offline cache lacks, a damaged file."""
    if "trust_remote_code" in str(error):
        return own_code_message(location, "custom code in its config or tokenizer")
    if hub.get("local_files_only"):
        if aliases:
            return unreachable_hub_message(location)
        return f'cannot load model "{location}": not in the Hugging Face cache, and the hub cannot be reached (offline)'
    # A damaged file: truncated weights (SafetensorError, EOFError, UnpicklingError), a broken tokenizer.json
    # (a ValueError); OSError is also what transformers raises for a missing one.
    reason = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
    if local:
        hint = "a file in it is missing or damaged"
    else:
        hint = "offline? use a local directory" + (", or the alias minilm-l6" if aliases else "")
    return f'cannot load model "{location}": {reason} ({hint})'

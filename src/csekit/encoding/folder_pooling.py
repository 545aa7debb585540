"""A model folder's own representation: which pooler reads it, and whether its vectors are scaled to unit length.

A sentence-transformers folder says how it embeds a sentence in `modules.json`: a Transformer, a Pooling module
(its `config.json` names the mode) and, for most sentence models (all-MiniLM-L6-v2 among them), a Normalize module.
A load that names no pooler, and `model.pooler: auto` / `--pooler auto`, read that representation, so csekit
encodes, trains and saves what `SentenceTransformer(folder).encode` gives; a csekit folder's own is in csekit.json.

Every setting read is honoured or refused, never ignored: a Pooling mode is mapped to the csekit pooler that
computes the same vector (`POOLER_OF_MODE`), the Transformer module's `max_seq_length` is where the tokenizer
truncates, and anything csekit cannot reproduce (two modes concatenated, a key it does not know, a Dense or other
module, a default prompt, lowercased text or arguments for the model in `sentence_bert_config.json`) is one line
naming the file. An explicit pooler reads the
transformer alone and none of this. `auto` on a folder that has no such representation (a plain transformers model,
a hub name) is refused, asking for a pooler.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from csekit.core.bounded_read import read_json_file
from csekit.core.errors import CsekitError
from csekit.core.safe_names import child_path
from csekit.encoding.pooling import POOLERS
from csekit.encoding.token_input import tokenize_texts

if TYPE_CHECKING:
    from csekit.encoding.representation import Representation

AUTO_POOLER = "auto"
"""`model.pooler` / `--pooler`: the backbone folder's own representation (pooler and normalisation)."""

MODE_OF_POOLER = {
    "cls": "cls",
    "pooler_output": "cls",  # then the pooler layer, exported as a Dense module
    "mean": "mean",
    "max": "max",
    "mean_sqrt_len": "mean_sqrt_len_tokens",
    "weighted_mean": "weightedmean",
    "last_token": "lasttoken",
}
"""The sentence-transformers Pooling mode each csekit pooler is exported as."""

POOLER_OF_MODE = {mode: pooler for pooler, mode in MODE_OF_POOLER.items() if pooler != "pooler_output"}
"""The csekit pooler that computes each sentence-transformers Pooling mode's vector
(tests/unit/encoding/test_folder_pooling.py)."""

MODE_FLAGS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
"""The Pooling config's one flag per mode, as sentence-transformers before 6 wrote it (and csekit writes it)."""

WIDTH_KEYS = ("word_embedding_dimension", "embedding_dimension")
POOLING_KEYS = frozenset({*MODE_FLAGS, *WIDTH_KEYS, "pooling_mode", "include_prompt"})
"""Every key of a Pooling config that sentence-transformers (2.x to 6) reads."""
NORMALIZE_KEYS = frozenset({"module_input_name", "module_output_name"})
MODULE_KEYS = frozenset({"idx", "name", "path", "type", "kwargs"})
"""The keys sentence-transformers writes for a module in modules.json."""
LIBRARY_PREFIX = "sentence_transformers."
SENTENCE_EMBEDDING = "sentence_embedding"
MODULES_LIMIT = 2**20
"""The largest modules.json read (a few hundred bytes for a sentence model)."""
MODULE_CONFIG_LIMIT = 2**16
"""The largest Pooling or Normalize config.json, or config_sentence_transformers.json, read (a few hundred bytes)."""
ST_CONFIG = "config_sentence_transformers.json"
TRANSFORMER_CONFIG = "sentence_bert_config.json"
TRANSFORMER_DEFAULTS: dict[str, Any] = {
    "do_lower_case": False,
    "transformer_task": "feature-extraction",
    "module_output_name": "token_embeddings",
    "processing_kwargs": {},
    "query_length": None,
    "document_length": None,
    "query_expansion": None,
    **{name: {} for name in ("model_args", "tokenizer_args", "config_args")},
    **{name: {} for name in ("model_kwargs", "processor_kwargs", "config_kwargs")},
}
"""The Transformer module's settings (sentence-transformers 2 to 6) csekit reproduces only at these values: another
(lowercasing the text, another task's output, multi-vector lengths, arguments for the model or tokenizer) is
refused. `max_seq_length` is honoured, `unpad_inputs` changes speed only, `modality_config` is checked to read
the text's last hidden states."""


@dataclass(frozen=True)
class FolderPooling:
    """A representation: the csekit pooler, whether a Normalize module follows it, and where that was read."""

    pooler: str
    normalize: bool = False
    width: int | None = None  # the width a Pooling config declares (checked against the model's)
    source: str = ""  # the file that says so ("" when the caller named the pooler)
    mode: str | None = None  # the sentence-transformers Pooling mode read (None: not read from a Pooling config)
    max_length: int | None = None  # the Transformer module's max_seq_length (sentence_bert_config.json), honoured


class SavedPooling(Protocol):
    """What `model_folder.SavedLayout` knows of a folder's representation."""

    representation: Representation
    csekit_trained: bool
    sentence_transformers: bool


def check_pooler_name(name: str, key: str | None = None) -> None:
    """`name` is `auto` or a registered pooler (else one line naming `key`)."""
    if name != AUTO_POOLER:
        POOLERS.get(name, key)


def choose_pooling(requested: str | None, location: str, saved: SavedPooling) -> FolderPooling:
    """The representation a load reads: the `requested` pooler alone, else (None or auto) the folder's own.

    A folder's own is csekit.json's pooler (a csekit model), else its sentence-transformers modules; a plain
    transformers model has none, so it reads `cls` when no pooler is named and `auto` is refused.
    """
    if requested is not None and requested != AUTO_POOLER:
        return FolderPooling(requested)
    own = saved.representation
    if saved.csekit_trained and own.pooler is not None:
        return FolderPooling(own.pooler, own.normalize, source=str(Path(location) / "csekit.json"))
    if saved.sentence_transformers:
        return read_folder_pooling(Path(location))
    if requested == AUTO_POOLER:
        check_auto_location(requested, location)
        plain = "it is a plain transformers model (no modules.json)"
        what = "its csekit.json names no pooler" if saved.csekit_trained else plain
        raise CsekitError(_auto_refused(location, what))
    return FolderPooling("cls")


def check_auto_location(requested: str | None, location: str) -> None:
    """`auto` needs a local folder: refused for a hub name before anything is downloaded or loaded."""
    if requested == AUTO_POOLER and not Path(location).is_dir():
        raise CsekitError(_auto_refused(location, "it is a hub name, not a local sentence-transformers folder"))


def _auto_refused(location: str, why: str) -> str:
    return (
        f'model "{location}": pooler auto reads a sentence-transformers folder\'s own pooling, and {why}; '
        "choose a pooler (cls, mean, ...)"
    )


def check_folder_pooling(pooling: FolderPooling, width: int, tokenizer: Any) -> None:
    """What only the loaded model can tell: the declared width is the model's, and a `lasttoken` folder's tokenizer
    ends each sentence with EOS (csekit's last_token pooler appends one where it does not; sentence-transformers
    reads whatever token is last)."""
    if pooling.width is not None and pooling.width != width:
        raise CsekitError(
            f"{pooling.source}: the Pooling module's width is {pooling.width}, the model's is {width}; "
            "the module does not belong to this model"
        )
    if pooling.mode == "lasttoken":
        eos = getattr(tokenizer, "eos_token_id", None)
        last = tokenize_texts(tokenizer, ["a"], 1)["input_ids"][0][-1]
        if not isinstance(eos, int) or last != eos:
            raise CsekitError(
                f"{pooling.source}: lasttoken pooling reads the tokenizer's last token, which is no EOS token here; "
                "csekit's last_token pooler appends EOS, so it would read another token: choose a pooler"
            )


def read_modules(folder: Path) -> list[dict[str, Any]]:
    """modules.json: a list of objects (what every load of a sentence-transformers folder reads)."""
    path = folder / "modules.json"
    modules = read_json_file(path, "sentence-transformers modules", MODULES_LIMIT)
    if not isinstance(modules, list) or not all(isinstance(module, dict) for module in modules):
        raise CsekitError(f"{path}: expected a list of modules (JSON objects)")
    return modules


def transformer_folder(folder: Path, modules: list[dict[str, Any]]) -> Path:
    """Where a sentence-transformers folder keeps its transformer: the Transformer module's path (else the folder)."""
    for module in modules:
        if _class_name(module) == "Transformer":
            return module_folder(folder, module.get("path", ""))
    return folder


def module_folder(folder: Path, name: Any) -> Path:
    """`folder / name` for a module's path read from modules.json, refused unless it stays inside `folder`."""
    if not isinstance(name, str):
        raise CsekitError(f'{folder / "modules.json"}: a module\'s "path" must be a string, found {_kind(name)}')
    return child_path(folder, name, f"{folder / 'modules.json'}: path", nested=True)


def read_folder_pooling(folder: Path) -> FolderPooling:
    """A sentence-transformers folder's representation, read strictly: a Transformer, a Pooling module of one
    mode, an optional Normalize; any other module, order or setting is refused in one line naming its file."""
    modules_file = folder / "modules.json"
    modules = read_modules(folder)
    for index, module in enumerate(modules):
        _check_module_entry(module, index, modules_file)
    kinds = [_class_name(module) for module in modules]
    if kinds not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
        other = next((kind for kind in kinds if kind not in ("Transformer", "Pooling", "Normalize")), None)
        found = f"a {other} module" if other else f"the modules {', '.join(kinds) or 'none'}"
        raise CsekitError(
            f"{modules_file}: csekit reads a folder's own representation as Transformer, Pooling and an optional "
            f"Normalize, and this one has {found}; choose a pooler to read its transformer alone"
        )
    _refuse_default_prompt(folder / ST_CONFIG)
    config_path = module_folder(folder, modules[1]["path"]) / "config.json"
    mode, width = _pooling_mode(_read_object(config_path, "Pooling config"), config_path)
    normalize = len(modules) == 3
    if normalize:
        _check_normalize(module_folder(folder, modules[2]["path"]) / "config.json")
    max_length = _transformer_max_length(module_folder(folder, modules[0]["path"]) / TRANSFORMER_CONFIG)
    return FolderPooling(POOLER_OF_MODE[mode], normalize, width, str(config_path), mode, max_length)


def _transformer_max_length(path: Path) -> int | None:
    """The Transformer module's `max_seq_length` (None when it gives none); any other setting it gives must be one
    csekit reproduces (`TRANSFORMER_DEFAULTS`), else one line naming it: never ignored."""
    if not path.exists():
        return None
    config = _read_object(path, "sentence-transformers Transformer config")
    for key, value in config.items():
        if key in ("max_seq_length", "unpad_inputs"):
            continue
        if key == "modality_config":
            reads_text = isinstance(value, dict) and all(
                entry == {"method": "forward", "method_output_name": "last_hidden_state"} for entry in value.values()
            )
            if reads_text:
                continue
        elif key in TRANSFORMER_DEFAULTS and value in (TRANSFORMER_DEFAULTS[key], None):
            continue
        raise CsekitError(
            f"{path}: {str(key)!r:.60} is {_shown(value)}, which csekit does not reproduce; choose a pooler to "
            "read the transformer alone"
        )
    length = config.get("max_seq_length")
    if length is not None and (not isinstance(length, int) or isinstance(length, bool) or length < 1):
        raise CsekitError(f'{path}: "max_seq_length" must be a whole number >= 1, found {_kind(length)}')
    return length


def apply_folder_length(pooling: FolderPooling, tokenizer: Any) -> None:
    """Truncate where the folder's Transformer module does (its `max_seq_length`), as sentence-transformers does:
    the tokenizer's limit is what `SentenceEncoder.max_seq_length` reads."""
    current = getattr(tokenizer, "model_max_length", None)
    if pooling.max_length is not None and (not isinstance(current, int) or pooling.max_length < current):
        tokenizer.model_max_length = pooling.max_length


def _check_module_entry(module: dict[str, Any], index: int, modules_file: Path) -> None:
    """One module of modules.json: the keys sentence-transformers writes, of their types; no keyword arguments."""
    where = f"{modules_file}: module {index}"
    unknown = sorted(str(key) for key in set(module) - MODULE_KEYS)
    if unknown:
        raise CsekitError(f"{where} has {unknown[0]!r:.60}, no key of a sentence-transformers module: refused")
    kind, path = module.get("type"), module.get("path")
    if not isinstance(kind, str) or not kind.startswith(LIBRARY_PREFIX):
        raise CsekitError(f'{where}: "type" must name a sentence-transformers module class, found {kind!r:.80}')
    if "path" not in module:
        raise CsekitError(f'{where}: the {_class_name(module)} module has no "path"')
    if not isinstance(path, str):
        raise CsekitError(f'{where}: "path" must be a string, found {_kind(path)}')
    idx, name, kwargs = module.get("idx", index), module.get("name", ""), module.get("kwargs", [])
    if not isinstance(idx, int) or isinstance(idx, bool) or not isinstance(name, str):
        raise CsekitError(f'{where}: "idx" must be a number and "name" a string')
    if kwargs != []:
        raise CsekitError(f'{where}: "kwargs" {kwargs!r:.80} passes arguments csekit does not take; csekit refuses it')


def _pooling_mode(config: dict[str, Any], path: Path) -> tuple[str, int | None]:
    """The one sentence-transformers mode a Pooling config names, and the width it declares (if it does)."""
    unknown = sorted(str(key) for key in set(config) - POOLING_KEYS)
    if unknown:
        raise CsekitError(f"{path}: {unknown[0]!r:.60} is no Pooling setting csekit knows; csekit refuses it")
    for key in (*MODE_FLAGS, "include_prompt"):  # include_prompt: csekit adds no prompt, so either value holds
        if key in config and not isinstance(config[key], bool):
            raise CsekitError(f'{path}: "{key}" must be true or false, found {_kind(config[key])}')
    flagged = [mode for key, mode in MODE_FLAGS.items() if config.get(key) is True]
    modes = flagged or ["mean"]  # sentence-transformers' default when no flag is set
    if "pooling_mode" in config:  # sentence-transformers 6: a mode or a list of modes (concatenated)
        value = config["pooling_mode"]
        modes = [value] if isinstance(value, str) else value
        if not isinstance(modes, list) or not modes or not all(isinstance(mode, str) for mode in modes):
            raise CsekitError(f'{path}: "pooling_mode" must be a mode or a list of modes, found {_kind(value)}')
        if flagged and flagged != modes:
            raise CsekitError(f'{path}: "pooling_mode" says {modes!r:.80} but the mode flags say {flagged}')
    if len(modes) > 1:
        raise CsekitError(
            f"{path}: {len(modes)} pooling modes at once ({modes!r:.80}), concatenated; csekit pools one way: "
            "choose a pooler"
        )
    if modes[0] not in POOLER_OF_MODE:
        raise CsekitError(f"{path}: pooling mode {modes[0]!r:.60} is none of {', '.join(POOLER_OF_MODE)}")
    return modes[0], _declared_width(config, path)


def _declared_width(config: dict[str, Any], path: Path) -> int | None:
    """The width a Pooling config declares (either name of the key; both must agree), or None."""
    widths = [config[key] for key in WIDTH_KEYS if key in config]
    if not widths:
        return None
    if any(not isinstance(width, int) or isinstance(width, bool) or width != widths[0] for width in widths):
        raise CsekitError(f"{path}: the Pooling module's width must be one whole number")
    return int(widths[0])


def _check_normalize(config_path: Path) -> None:
    """A Normalize module normalises the sentence embedding (its config, when it has one, may say nothing else)."""
    if not config_path.exists():  # sentence-transformers before 6 saved no config (all-MiniLM-L6-v2: no folder)
        return
    config = _read_object(config_path, "Normalize config")
    unknown = sorted(str(key) for key in set(config) - NORMALIZE_KEYS)
    names = [config.get("module_input_name", SENTENCE_EMBEDDING), config.get("module_output_name")]
    if unknown or names[0] != SENTENCE_EMBEDDING or names[1] not in (SENTENCE_EMBEDDING, None):
        raise CsekitError(
            f"{config_path}: a Normalize module that does anything but normalise the sentence embedding "
            f"({(unknown or names)!r:.60}); csekit refuses it"
        )


ST_CONFIG_KEYS = {
    "__version__", "prompts", "default_prompt_name", "similarity_fn_name", "model_type", "truncate_dim", "requirements"
}  # fmt: skip
"""config_sentence_transformers.json's keys (sentence-transformers 2 to 6.2): each honoured or refused below."""


def _refuse_default_prompt(path: Path) -> None:
    """config_sentence_transformers.json honoured or refused: versions and unused prompts change nothing; a default
    prompt (sentence-transformers puts it before every sentence; csekit adds none), a similarity other than cosine
    (csekit scores by cosine, SentEval's protocol), another kind of model or an unknown key is one line."""
    if not path.exists():
        return
    config = _read_object(path, "sentence-transformers config")
    unknown = sorted(str(key) for key in set(config) - ST_CONFIG_KEYS)
    if unknown:
        raise CsekitError(f"{path}: {unknown[0]!r:.60} is a setting csekit does not know; it refuses the folder")
    prompt = config.get("default_prompt_name")
    if prompt is not None:
        raise CsekitError(
            f'{path}: "default_prompt_name" {prompt!r:.60} puts a prompt before every sentence, which csekit does '
            "not; choose a pooler to read the transformer without it"
        )
    similarity = config.get("similarity_fn_name")
    if similarity not in (None, "cosine"):
        raise CsekitError(
            f'{path}: "similarity_fn_name" {similarity!r:.40} asks for a similarity csekit does not score with (it '
            "scores by cosine, SentEval's protocol); choose a pooler to read the transformer anyway"
        )
    if config.get("truncate_dim") is not None:
        raise CsekitError(
            f'{path}: "truncate_dim" {config["truncate_dim"]!r:.20} cuts every embedding short, which csekit does not; '
            "choose a pooler to read the transformer anyway"
        )
    if config.get("requirements"):
        raise CsekitError(f'{path}: "requirements" names package versions csekit does not check; it refuses the folder')
    kind = config.get("model_type")
    if kind not in (None, "SentenceTransformer"):
        raise CsekitError(f'{path}: "model_type" {kind!r:.40} is not a sentence-transformers dense model')


def _read_object(path: Path, what: str) -> dict[str, Any]:
    value = read_json_file(path, what, MODULE_CONFIG_LIMIT)
    if not isinstance(value, dict):
        raise CsekitError(f"{path}: expected a JSON object, found {_kind(value)}")
    return value


def _class_name(module: dict[str, Any]) -> str:
    """The class a module entry names (`sentence_transformers.models.Pooling` -> Pooling)."""
    kind = module.get("type")
    return kind.rsplit(".", 1)[-1] if isinstance(kind, str) else ""


def _shown(value: Any) -> str:
    """A value read from a JSON file, short, for a message."""
    return f"{value!r:.60}" if isinstance(value, str | int | float | bool) or value is None else _kind(value)


def _kind(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "true or false", type(None): "null"}
    return names.get(type(value), "a number")

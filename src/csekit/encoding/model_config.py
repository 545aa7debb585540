"""A model folder's config values, checked by type and range before transformers builds anything (issue #49).

transformers trusts config.json: `hidden_act: "nope"` failed at the first forward pass (a KeyError), a
`pad_token_id` beyond the vocabulary in the embedding's constructor, `layer_norm_eps` as text in its own
validation, a `quantization_config` or `attn_implementation: flash_attention_2` asked for libraries that
are not there, `num_labels: 30000000` built a dict of 30 million labels, and a model of 256 layers of
width 32,768 was allocated before anything refused it. So, for a local folder:

* `check_config_values`: sizes within `CONFIG_LIMITS`; keys csekit cannot honour refused
  (`REFUSED_KEYS`, `ALLOWED_VALUES`); every key the model type's config class declares (transformers 5's
  config classes are typed dataclasses) has a value of the declared type, and so has each key csekit reads
  itself (`RELIED_ON_TYPES`); activations, epsilons, dropouts, token ids, label counts and rotary thetas and
  factors within their ranges; then the config class is built from the values, and what its own validators
  refuse is one line too; tokenizer_config.json's `model_max_length` positive;
* `check_model_size`: the parameters the model would allocate, counted on the meta device (nothing is
  allocated), at most `PARAMETER_LIMIT`.

Each failure is one line naming the file and the key.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from pathlib import Path
from typing import Any

from csekit.core.bounded_read import read_json_file
from csekit.core.errors import CsekitError
from csekit.core.numbers import is_finite_number

CONFIG_LIMITS = {
    # layers
    "num_hidden_layers": 256,
    "encoder_layers": 256,
    "decoder_layers": 256,
    "num_layers": 256,
    "n_layer": 256,
    # widths
    "hidden_size": 32768,
    "d_model": 32768,
    "n_embd": 32768,
    "intermediate_size": 131072,
    "encoder_ffn_dim": 131072,
    "decoder_ffn_dim": 131072,
    # attention heads
    "num_attention_heads": 512,
    "encoder_attention_heads": 512,
    "decoder_attention_heads": 512,
    "n_head": 512,
    # positions, vocabularies, labels
    "max_position_embeddings": 131072,
    "n_positions": 131072,
    "vocab_size": 2_000_000,
    "src_vocab_size": 2_000_000,
    "tgt_vocab_size": 2_000_000,
    "type_vocab_size": 1024,
    "num_labels": 100_000,
}
"""The largest value csekit accepts for each config.json size (the largest public encoders are far below:
BERT-large has 24 layers, hidden size 1024, 16 heads, 512 positions, XLM-R a vocabulary of 250,002)."""

MAY_BE_ZERO = {"type_vocab_size"}

PARAMETER_LIMIT = 4_000_000_000
"""The most parameters a model may have (16 GB of fp32 weights; XLM-R XL has 3.5 billion, BERT-large 0.34)."""

REFUSED_KEYS = {
    "quantization_config": "quantized weights need their own libraries and cannot be trained as csekit trains",
}
"""config.json keys csekit refuses whatever their value, and why."""

ALLOWED_VALUES: dict[str, tuple[Any, ...]] = {
    "attn_implementation": (None, "eager", "sdpa"),
    "_attn_implementation": (None, "eager", "sdpa"),
    "chunk_size_feed_forward": (0,),  # csekit's passes run the feed-forward whole (packed rows have any length)
}
"""config.json keys with the only values csekit can run (flash attention needs a package and a GPU)."""


RELIED_ON_TYPES: dict[str, type] = {
    "is_causal": bool,  # csekit.encoding.decoder: the attention a backbone runs with
    "is_decoder": bool,
    "is_encoder_decoder": bool,
    "add_cross_attention": bool,
    "tie_word_embeddings": bool,  # MNTP: whether the LM head is the input embeddings
    "output_hidden_states": bool,
    "_name_or_path": str,
}
"""config.json keys csekit reads itself from a built config (which keeps any value it does not declare), and their
types: `is_causal: "no"` was taken as true (a non-empty string)."""


def check_config_values(config: dict[str, Any], path: Path) -> None:
    """config.json's values (already read) by type and range, before transformers builds a config from them; then
    the config class's own validation (transformers 5's typed configs refuse more), as one line."""
    for section in (config, *(v for v in config.values() if isinstance(v, dict))):  # text_config, encoder, ...
        _check_sizes(section, path)
        _check_refused(section, path)
    _check_declared_types(config, path)
    for key, expected in RELIED_ON_TYPES.items():
        if key in config and not isinstance(config[key], expected):
            raise _refuse(path, key, config[key], f"{'true or false' if expected is bool else 'a string'}")
    for key, value in config.items():
        _check_range(key, value, config, path)
    _check_rope(config, path)
    _check_config_class(config, path)


def _check_rope(section: dict[str, Any], path: Path, in_rope: bool = False) -> None:
    """A rotary embedding's theta and scaling factor, wherever they are (`rope_theta`, `rope_parameters`, per layer
    type, `rope_scaling`): a positive number. Zero gave inverse frequencies of infinity, refused later as weights of
    a diverged run."""
    for key, value in section.items():
        rotary = key == "rope_theta" or (in_rope and key == "factor")
        if rotary and value is not None and (not _number(value) or value <= 0):
            raise _refuse(path, key, value, "a positive number (the rotary embedding's frequencies divide by it)")
        if isinstance(value, dict):
            _check_rope(value, path, in_rope or key.startswith("rope"))


def _check_config_class(config: dict[str, Any], path: Path) -> None:
    """The model type's config class built from the values, as transformers' load builds it: its validators (an odd
    `head_dim` for RoPE, an `initializer_range` out of range, unknown `layer_types`, a `dtype` torch lacks) were
    tracebacks."""
    import copy

    from transformers import CONFIG_MAPPING

    model_type = config.get("model_type")
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        return  # transformers refuses an unknown type itself, in one line (see SentenceEncoder.load)
    try:
        CONFIG_MAPPING[model_type].from_dict(copy.deepcopy(config))
    except Exception as error:  # StrictDataclass*ValidationError, ValueError, TypeError, AttributeError...
        reason = " ".join(str(error).split())[:240] or type(error).__name__
        raise CsekitError(f"{path}: transformers refuses this config ({reason})") from None


def _refuse(path: Path, key: str, value: Any, expected: str) -> CsekitError:
    return CsekitError(f'{path}: "{key}" is {json.dumps(value)[:60]}; csekit loads models with {expected} there')


def _check_sizes(section: dict[str, Any], path: Path) -> None:
    for key, limit in CONFIG_LIMITS.items():
        if key not in section:
            continue
        value, lowest = section[key], 0 if key in MAY_BE_ZERO else 1
        if not isinstance(value, int) or isinstance(value, bool) or not lowest <= value <= limit:
            raise _refuse(path, key, value, f"a whole number from {lowest} to {limit:,}")


def _check_refused(section: dict[str, Any], path: Path) -> None:
    for key, reason in REFUSED_KEYS.items():
        if key in section:
            raise CsekitError(f'{path}: "{key}" is set; {reason}')
    for key, allowed in ALLOWED_VALUES.items():
        if key in section and section[key] not in allowed:
            raise _refuse(path, key, section[key], " or ".join(json.dumps(value) for value in allowed))


def _check_declared_types(config: dict[str, Any], path: Path) -> None:
    """Each key the model type's config class declares, against the declared type (int, float, str, Literal...)."""
    from transformers import CONFIG_MAPPING

    model_type = config.get("model_type")
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        return  # transformers refuses an unknown type itself, in one line (see SentenceEncoder.load)
    config_class = CONFIG_MAPPING[model_type]
    if not dataclasses.is_dataclass(config_class):
        return
    try:
        hints = typing.get_type_hints(config_class)
    except Exception:  # an annotation that does not resolve: the fields' own types
        hints = {field.name: field.type for field in dataclasses.fields(config_class)}
    for field in dataclasses.fields(config_class):
        if field.name in config and not _matches(config[field.name], hints.get(field.name, Any)):
            raise _refuse(path, field.name, config[field.name], f"a value of type {_type_name(hints[field.name])}")


def _matches(value: Any, expected: Any) -> bool:
    """Whether a JSON value fits a type annotation; True for types JSON cannot express (transformers checks)."""
    origin, args = typing.get_origin(expected), typing.get_args(expected)
    if expected is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, arg) for arg in args)
    if origin is typing.Literal:
        return value in args
    if expected in (None, type(None)):
        return value is None
    if expected is bool:
        return isinstance(value, bool)
    if expected is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if expected is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if expected is str:
        return isinstance(value, str)
    if expected is list or origin is list:
        return isinstance(value, list) and (not args or all(_matches(item, args[0]) for item in value))
    if expected is dict or origin is dict:
        return isinstance(value, dict) and (len(args) != 2 or all(_matches(v, args[1]) for v in value.values()))
    return True


def _type_name(expected: Any) -> str:
    return getattr(expected, "__name__", None) or str(expected).replace("typing.", "")


def _check_range(key: str, value: Any, config: dict[str, Any], path: Path) -> None:
    """Ranges by kind of key: activations, epsilons, dropouts, token ids, labels."""
    from transformers.activations import ACT2FN

    if (key.endswith(("_act", "_activation")) or key == "activation_function") and isinstance(value, str):
        if value not in ACT2FN:
            raise _refuse(path, key, value, f"an activation transformers has ({', '.join(sorted(ACT2FN)[:6])}, ...)")
    elif key.endswith(("_eps", "_epsilon")) and value is not None:
        if not _number(value) or not 0 < value < 1:
            raise _refuse(path, key, value, "a number between 0 and 1 (an epsilon such as 1e-12)")
    elif ("dropout" in key or key.endswith("_prob")) and value is not None:
        if not _number(value) or not 0 <= value < 1:
            raise _refuse(path, key, value, "a probability in [0, 1)")
    elif key.endswith("_token_id") and value is not None:
        rows = config.get("vocab_size")
        ids = value if isinstance(value, list) else [value]
        upper = rows if isinstance(rows, int) and not isinstance(rows, bool) else None
        if not all(_whole(i) and 0 <= i < (upper if upper is not None else i + 1) for i in ids):
            within = f"a token id from 0 to {upper - 1}" if upper is not None else "a token id (a whole number >= 0)"
            raise _refuse(path, key, value, f"{within} (vocab_size is {upper})")
    elif key in ("id2label", "label2id") and isinstance(value, dict) and len(value) > CONFIG_LIMITS["num_labels"]:
        raise _refuse(path, key, f"{len(value)} labels", f"at most {CONFIG_LIMITS['num_labels']:,} labels")


def _number(value: Any) -> bool:
    return is_finite_number(value)


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_tokenizer_config(folder: Path) -> None:
    """tokenizer_config.json's `model_max_length`: a positive whole number (a negative one overflowed in Rust)."""
    path = folder / "tokenizer_config.json"
    if not path.is_file():
        return
    values = read_json_file(path, "tokenizer config")
    if isinstance(values, dict) and values.get("model_max_length") is not None:
        length = values["model_max_length"]
        if not _whole(length) or length < 1:
            raise _refuse(path, "model_max_length", length, "a whole number of at least 1")


def check_model_size(config: dict[str, Any], path: Path, loader: Any, built: Any = None) -> None:
    """The parameters `loader` (AutoModel, a model class) would allocate for `config`, counted on the meta device
    (nothing is allocated), at most `PARAMETER_LIMIT`. `built`: the config object the load will pass, if any."""
    import torch
    from transformers import AutoConfig, PretrainedConfig

    model_type = config.get("model_type")
    if not isinstance(built, PretrainedConfig) and not isinstance(model_type, str):
        return  # transformers cannot tell the architecture either (it refuses the folder in one line)
    build = getattr(loader, "from_config", None) or loader._from_config  # AutoModel / a PreTrainedModel class
    try:
        if not isinstance(built, PretrainedConfig):
            values = {key: value for key, value in config.items() if key not in ("model_type", "transformers_version")}
            built = AutoConfig.for_model(model_type, **values)
        with torch.device("meta"):
            model = build(built)
    except Exception as error:  # transformers' own validation (StrictDataclassFieldValidationError, ValueError...)
        reason = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
        raise CsekitError(f"{path}: transformers cannot build this model ({reason})") from None
    count = sum(parameter.numel() for parameter in model.parameters())
    if count > PARAMETER_LIMIT:
        raise CsekitError(
            f"{path}: this model would have {count:,} parameters ({count * 4 / 2**30:,.0f} GiB in fp32); csekit "
            f"loads models of at most {PARAMETER_LIMIT:,}"
        )

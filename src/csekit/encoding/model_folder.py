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
  a link to /dev/zero, a 1 GiB chat template, a shard named `../x` are refused), and a vocabulary file is there;
* the weights' embedding matrices (read from the safetensors header) have the rows config.json says;

and after loading, `check_tokenizer` wants the tokenizer's special tokens in its vocabulary and its
vocabulary no larger than the embedding matrix. Each failure is one line naming the file.
`tests/test_architecture.py` finds any call of transformers' `from_pretrained` outside this module.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any

from csekit.core.bounded_read import open_regular, read_json_file
from csekit.core.errors import CsekitError
from csekit.core.json_lines import json_row
from csekit.encoding.model_config import check_config_values, check_model_size, check_tokenizer_config
from csekit.encoding.model_files import check_model_files

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

SAFETENSORS_HEADER_LIMIT = 64 * 2**20

EMBEDDING_ROWS = {
    "word_embeddings.weight": "vocab_size",
    "position_embeddings.weight": "max_position_embeddings",
    "encoder.embed_tokens.weight": "src_vocab_size",
    "decoder.embed_tokens.weight": "tgt_vocab_size",
}
"""Weight names (their ending) whose rows config.json gives, and the config key that gives them."""


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
    _check_embedding_rows(folder / "model.safetensors", config, config_path)
    return config


def _check_vocabulary_files(folder: Path) -> None:
    """At least one vocabulary file (`check_model_files` has checked that each is a bounded regular file)."""
    if not any((folder / name).is_file() for name in VOCABULARY_FILES):
        raise CsekitError(
            f"{folder}: no vocabulary (none of tokenizer.json, vocab.txt, vocab.json, a SentencePiece model); "
            "without one every word would be an unknown token"
        )


def _check_embedding_rows(weights: Path, config: dict[str, Any], config_path: Path) -> None:
    """The embedding matrices' rows in the safetensors header against config.json (transformers raised deep inside)."""
    shapes = _safetensors_shapes(weights)
    for name, shape in shapes.items():
        for ending, key in EMBEDDING_ROWS.items():
            if (name == ending or name.endswith("." + ending)) and key in config and shape[:1] != [config[key]]:
                raise CsekitError(
                    f'{config_path}: "{key}" is {config[key]} but {weights} holds {name} with '
                    f"{shape[0] if shape else 0} rows; the config does not belong to these weights"
                )


def _safetensors_shapes(path: Path) -> dict[str, list[int]]:
    """Tensor shapes from a safetensors file's header (8 bytes of length, then JSON); {} without the file."""
    try:
        with open_regular(path) as handle:  # a FIFO or a device is refused, never blocks
            size = os.fstat(handle.fileno()).st_size
            prefix = handle.read(8)
            length = struct.unpack("<Q", prefix)[0] if len(prefix) == 8 else -1
            if not 0 < length <= min(SAFETENSORS_HEADER_LIMIT, size - 8):
                raise CsekitError(f"{path}: not a safetensors file (its header length is {length})")
            header = json_row(handle.read(length))  # a JSON object, else a RowProblem (a ValueError)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, UnicodeDecodeError) as error:
        raise CsekitError(f"{path}: cannot read its header ({str(error)[:100]})") from None
    return {
        name: entry["shape"]
        for name, entry in header.items()
        if isinstance(entry, dict) and isinstance(entry.get("shape"), list)
    }


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
        config = check_model_folder(Path(location))
        if builds_a_model:
            # before a byte of it is allocated, with the config object the load passes when there is one
            check_model_size(config, Path(location) / "config.json", loader, options.get("config"))
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

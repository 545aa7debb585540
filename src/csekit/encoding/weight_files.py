"""What a model folder's weight files declare, checked before transformers reads them.

transformers converts whatever a weight file holds into the model's parameters without a word: a float weight
stored as I32 loads as its integer part (all zeros for a trained encoder's weights), a BOOL one as 0 and 1, an
F8 one as whatever the conversion gives. And an embedding matrix of another size than config.json says fails deep
inside the load. So every weight file transformers may read (`*.safetensors`, `*.bin`, shards included) is read
for its tensors' dtypes (a safetensors header, bounded; a .bin's tensors on the meta device, no data read) and:

* each tensor is floating point (`FLOATING_DTYPES`), or an integer index buffer the model keeps as one (a name
  ending in `INDEX_BUFFER_ENDINGS`: BERT's `position_ids`, `token_type_ids`);
* model.safetensors' embedding matrices have the rows config.json says (`EMBEDDING_ROWS`).

Each failure is one line naming the file and the tensor.
"""

from __future__ import annotations

import os
import struct
import warnings
from pathlib import Path
from typing import Any

from csekit.core.bounded_read import open_regular, read_with
from csekit.core.errors import CsekitError
from csekit.core.json_lines import json_row

SAFETENSORS_HEADER_LIMIT = 64 * 2**20

FLOATING_DTYPES = {"F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float64"}
"""The safetensors dtypes a weight may be stored in (torch's names beside): each converts to csekit's fp32."""

INDEX_BUFFER_ENDINGS = ("_ids",)
"""Name endings of the integer buffers transformers' text models save (`embeddings.position_ids`, I64)."""

EMBEDDING_ROWS = {
    "word_embeddings.weight": "vocab_size",
    "position_embeddings.weight": "max_position_embeddings",
    "encoder.embed_tokens.weight": "src_vocab_size",
    "decoder.embed_tokens.weight": "tgt_vocab_size",
}
"""Weight names (their ending) whose rows config.json gives, and the config key that gives them."""


def check_weight_files(folder: Path, config: dict[str, Any], config_path: Path) -> None:
    """Every weight file in `folder` (its listing checked by `check_model_files` first) against the rules above."""
    headers = {}
    for name in sorted(os.listdir(folder)):
        path = folder / name
        if name.endswith(".safetensors"):
            headers[name] = read_safetensors_header(path)
            _check_dtypes(path, {key: entry.get("dtype") for key, entry in headers[name].items()})
        elif name.endswith(".bin") and path.is_file():
            _check_dtypes(path, _bin_dtypes(path))
    for name, shape in _shapes(headers.get("model.safetensors", {})).items():
        for ending, key in EMBEDDING_ROWS.items():
            if (name == ending or name.endswith("." + ending)) and key in config and shape[:1] != [config[key]]:
                raise CsekitError(
                    f'{config_path}: "{key}" is {config[key]} but {folder / "model.safetensors"} holds {name} with '
                    f"{shape[0] if shape else 0} rows; the config does not belong to these weights"
                )


def stores_floating_point(dtype: Any) -> bool:
    """Whether a header's `dtype` (any JSON value: a list is no key of FLOATING_DTYPES) is a floating one."""
    return isinstance(dtype, str) and dtype in FLOATING_DTYPES


def _check_dtypes(path: Path, dtypes: dict[str, Any]) -> None:
    for name, dtype in dtypes.items():
        if stores_floating_point(dtype) or (isinstance(dtype, str) and name.endswith(INDEX_BUFFER_ENDINGS)):
            continue
        raise CsekitError(
            f"{path}: tensor {name!r} is stored as {str(dtype)[:40]}; a model's weights are floating point "
            f"({', '.join(FLOATING_DTYPES)}) and transformers would convert it to one without a word (an integer "
            "copy of a weight is its integer part); the file is not a model's weights as saved"
        )


_TORCH_TO_SAFETENSORS = {value: key for key, value in FLOATING_DTYPES.items()}


def _bin_dtypes(path: Path) -> dict[str, str]:
    """A pytorch_model.bin's tensors' dtypes (in safetensors' names where floating), loaded as transformers loads
    it (weights_only) onto the meta device: no tensor's data is read."""
    import torch

    try:
        with warnings.catch_warnings():  # torch's notes on a pickle's protocol: the error below says enough
            warnings.simplefilter("ignore")
            state = read_with(
                path, lambda handle: torch.load(handle, map_location="meta", weights_only=True), "weights"
            )
    except CsekitError:
        raise
    except Exception as error:  # any failure to read an untrusted pickle is one line
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:80]
        raise CsekitError(f"{path}: not a weights file torch reads without running its code ({reason})") from None
    if not isinstance(state, dict):
        raise CsekitError(f"{path}: expected a mapping of weight names to tensors, not {type(state).__name__}")
    return {
        str(name): _TORCH_TO_SAFETENSORS.get(str(tensor.dtype).removeprefix("torch."), str(tensor.dtype))
        if isinstance(tensor, torch.Tensor)
        else type(tensor).__name__
        for name, tensor in state.items()
    }


def read_safetensors_header(path: Path) -> dict[str, dict[str, Any]]:
    """A safetensors file's header (8 bytes of length, then JSON): {tensor: {"dtype", "shape", ...}}; {} without
    the file. The `__metadata__` entry and entries that are no JSON object are left out."""
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
    return {name: entry for name, entry in header.items() if name != "__metadata__" and isinstance(entry, dict)}


def _shapes(header: dict[str, dict[str, Any]]) -> dict[str, list[int]]:
    return {name: entry["shape"] for name, entry in header.items() if isinstance(entry.get("shape"), list)}

"""Every file a library may read in a model folder is listed and bounded before the library runs (issue #49).

transformers reads more of a model folder than csekit does: chat templates (`chat_template.jinja`,
`additional_chat_templates/*.jinja`), a versioned `tokenizer.X.json` that tokenizer_config.json's
`fast_tokenizer_files` names, the weight shards an index file names, `generation_config.json`... It joins
those names to the folder itself, so `../` or an absolute path in `fast_tokenizer_files` or an index's
`weight_map` read files outside the folder, and a 1 GiB chat template or tokenizer file was read whole.

So `check_model_files` reads the folder's whole listing: every entry whose name matches `LIBRARY_READS`
(anything transformers or safetensors may open by name) must be a regular file within its limit, and a
link only to a file inside the folder (or, in a Hugging Face cache snapshot, to the cache's `blobs/`).
Names written inside the folder's files (`fast_tokenizer_files`, the index files' `weight_map`) are
resolved and must be plain names of such checked files. Each failure is one line naming the file.
"""

from __future__ import annotations

import fnmatch
import os
from pathlib import Path
from typing import Any

from csekit.core.bounded_read import open_regular, read_json_file
from csekit.core.errors import CsekitError, absolute
from csekit.core.safe_names import check_name

MODEL_TEXT_LIMIT = 2**26
"""The largest tokenizer, vocabulary or config file of a model folder (XLM-R's tokenizer.json is 17 MB)."""

TEMPLATE_LIMIT = 2**20
"""The largest chat template (templates are a few KiB; transformers reads every one with the tokenizer)."""

CHAT_TEMPLATE_FOLDER = "additional_chat_templates"

LIBRARY_READS: dict[str, int | None] = {
    "*.jinja": TEMPLATE_LIMIT,  # chat_template.jinja
    "chat_template.json": TEMPLATE_LIMIT,
    "*.safetensors": None,  # weights and shards: any size (the header is read by csekit, bounded)
    "*.bin": None,  # pytorch_model.bin and its shards (torch.load with weights_only)
    "*.json": MODEL_TEXT_LIMIT,  # config, tokenizer, tokenizer.X.json, index, generation config, ...
    "*.txt": MODEL_TEXT_LIMIT,  # vocab.txt, merges.txt
    "*.model": MODEL_TEXT_LIMIT,  # SentencePiece
    "*.spm": MODEL_TEXT_LIMIT,  # Marian
}
"""Names (patterns, first match wins) a library may open in a model folder, and the bytes it may read (None: any
size). Other entries (README.md, onnx/, 1_Pooling/, tf_model.h5) are never opened by transformers' torch loads."""

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin")
"""peft's adapter files (transformers' ADAPTER_CONFIG_NAME, ADAPTER_SAFE_WEIGHTS_NAME, ADAPTER_WEIGHTS_NAME). With
adapter_config.json in a folder, transformers' model loads apply the adapter by themselves (without config.json,
to the base model its `base_model_name_or_path` names), outside every csekit check: other embeddings, a regex
`target_modules`, any rank. csekit saves a LoRA model with its adapters merged, so it loads no adapter."""

INDEX_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
"""Index files whose `weight_map` names the shards transformers loads."""


def check_model_files(folder: Path) -> None:
    """Before transformers reads `folder`: its listing against `LIBRARY_READS`, then the names its files give."""
    try:
        names = sorted(os.listdir(folder))
    except OSError as error:
        raise CsekitError(f"{folder}: cannot list the model folder ({error.strerror or error})") from None
    adapters = [name for name in names if name in ADAPTER_FILES]
    if adapters:
        raise CsekitError(adapter_message(str(folder / adapters[0])))
    for name in names:
        if name == CHAT_TEMPLATE_FOLDER:
            _check_template_folder(folder)
        elif (pattern := library_pattern(name)) is not None:
            check_library_file(folder, name, LIBRARY_READS[pattern], f"{folder / name}")
    _check_fast_tokenizer_files(folder)
    for index in INDEX_FILES:
        _check_shards(folder, index)


def adapter_message(found: str) -> str:
    """One line for a model that holds a peft adapter (`found`: its file)."""
    return (
        f"{found}: the model holds a peft adapter, which transformers would apply by itself, unchecked; csekit loads "
        "no adapter (it saves LoRA models merged): merge it into the weights (peft's merge_and_unload) and save that"
    )


def refuse_hub_adapter(location: str, options: dict[str, Any]) -> None:
    """A hub model (not a folder) whose repository holds adapter_config.json, looked up as transformers' own load
    would (`find_adapter_config_file`, with the load's cache options), is refused like a folder that holds one."""
    from transformers.utils import find_adapter_config_file

    lookup = {key: options[key] for key in ("local_files_only", "revision", "cache_dir") if key in options}
    try:
        found = find_adapter_config_file(location, **lookup)
    except (OSError, ValueError):  # a name the hub cannot give: transformers' load says so itself
        return
    if found is not None:
        raise CsekitError(adapter_message(f'model "{location}" ({ADAPTER_FILES[0]})'))


def library_pattern(name: str) -> str | None:
    """The `LIBRARY_READS` pattern a file name matches (a library may read it); None: no library opens it."""
    return next((pattern for pattern in LIBRARY_READS if fnmatch.fnmatchcase(name, pattern)), None)


def check_library_file(folder: Path, name: str, limit: int | None, what: str) -> None:
    """`folder/name` is a regular file of at most `limit` bytes, itself or through a link that stays inside."""
    path = folder / name
    try:
        open_regular(path, limit).close()
    except FileNotFoundError:
        raise CsekitError(f"{what}: {absolute(path)} does not exist (a dangling link or a missing file)") from None
    except OSError as error:
        raise CsekitError(f"{path}: cannot read it ({error.strerror or error})") from None
    _check_link_stays_inside(folder, path, what)


def _check_link_stays_inside(folder: Path, path: Path, what: str) -> None:
    """A link is followed only to a file inside `folder`, or to the `blobs/` of the Hugging Face cache repository
    whose snapshot `folder` is (`.../models--org--name/snapshots/REV/`: its files are links to `../../blobs/`)."""
    if not path.is_symlink():
        return
    root = Path(os.path.realpath(folder))
    target = Path(os.path.realpath(path))
    allowed = [root]
    if root.parent.name == "snapshots":
        allowed.append(root.parent.parent / "blobs")
    if not any(target.is_relative_to(place) for place in allowed):
        raise CsekitError(f"{what}: {path} is a link leading outside the model folder (to {target}); csekit refuses it")


def _check_template_folder(folder: Path) -> None:
    """`additional_chat_templates/`: transformers reads each `*.jinja` in it with the tokenizer."""
    templates = folder / CHAT_TEMPLATE_FOLDER
    _check_link_stays_inside(folder, templates, str(templates))
    if not templates.is_dir():
        check_library_file(folder, CHAT_TEMPLATE_FOLDER, TEMPLATE_LIMIT, str(templates))
        return
    for name in sorted(os.listdir(templates)):
        if name.endswith(".jinja"):
            check_library_file(templates, name, TEMPLATE_LIMIT, str(templates / name))


def _check_fast_tokenizer_files(folder: Path) -> None:
    """tokenizer_config.json's `fast_tokenizer_files`: transformers joins the name matching its version to the
    folder and reads it as the tokenizer, so each must be a plain name of a checked file here."""
    config_path = folder / "tokenizer_config.json"
    if not config_path.is_file():
        return
    config = read_json_file(config_path, "tokenizer config", MODEL_TEXT_LIMIT)
    names = config.get("fast_tokenizer_files") if isinstance(config, dict) else None
    if names is None:
        return
    what = f'{config_path}: "fast_tokenizer_files"'
    if not isinstance(names, list):
        raise CsekitError(f"{what} must be a list of file names in the model folder")
    for name in names:  # a version's file may be absent (transformers picks the newest not above its own)
        _check_named_file(folder, name, what, must_exist=False)


def _check_shards(folder: Path, index: str) -> None:
    """An index file's `weight_map` values: the shards transformers loads, each a plain name of a file here."""
    path = folder / index
    if not path.is_file():
        return
    value = read_json_file(path, "weights index", MODEL_TEXT_LIMIT)
    weight_map = value.get("weight_map") if isinstance(value, dict) else None
    if not isinstance(weight_map, dict):
        raise CsekitError(f'{path}: expected a JSON object with a "weight_map" object (weight name: shard file)')
    checked: set[str] = set()
    for shard in weight_map.values():
        if not isinstance(shard, str) or shard not in checked:  # thousands of weights name a few shards
            _check_named_file(folder, shard, f'{path}: "weight_map"', must_exist=True)
            checked.add(shard)


def _check_named_file(folder: Path, name: Any, what: str, must_exist: bool) -> None:
    """A file name read from a file of the folder: one component, of a file the listing check bounds."""
    check_name(name, what, folder=folder)
    pattern = library_pattern(name)
    if pattern is None:
        raise CsekitError(f"{what}: {name!r} is not the name of a file transformers reads (.json, .safetensors...)")
    if must_exist or os.path.lexists(folder / name):
        check_library_file(folder, name, LIBRARY_READS[pattern], what)

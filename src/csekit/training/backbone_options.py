"""The recipe's backbone options beyond the pooler: a decoder LLM's attention (`model.attention`), checked at load."""

from __future__ import annotations

from typing import Any

from csekit.core.errors import CsekitError
from csekit.encoding.decoder import ATTENTIONS


def check_backbone_options(model: Any, where: Any) -> None:
    """`model.attention` is causal, bidirectional or null (whether the backbone is a decoder is known at load)."""
    if model.attention is not None and model.attention not in ATTENTIONS:
        raise CsekitError(
            f"{where('model.attention')}: recipe key model.attention must be {' or '.join(ATTENTIONS)}, or null for "
            f'the backbone\'s own, not "{model.attention}"'
        )

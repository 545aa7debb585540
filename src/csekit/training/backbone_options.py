"""The recipe's backbone options beyond the pooler: a decoder LLM's attention (`model.attention`) and LoRA adapters
(`model.lora`), checked when the recipe is loaded."""

from __future__ import annotations

from typing import Any

from csekit.core.errors import CsekitError
from csekit.encoding.decoder import ATTENTIONS
from csekit.encoding.lora import lora_options


def check_backbone_options(model: Any, where: Any) -> None:
    """`model.attention` is causal, bidirectional or null (whether the backbone is a decoder is known at load);
    `model.lora` a mapping of LoRA's options."""
    if model.attention is not None and model.attention not in ATTENTIONS:
        raise CsekitError(
            f"{where('model.attention')}: recipe key model.attention must be {' or '.join(ATTENTIONS)}, or null for "
            f'the backbone\'s own, not "{model.attention}"'
        )
    if model.lora is not None:
        if not isinstance(model.lora, dict):
            raise CsekitError(
                f"{where('model.lora')}: recipe key model.lora must be a mapping ({{r: 16, ...}}) or null"
            )
        try:
            lora_options(model.lora)
        except CsekitError as error:
            raise CsekitError(f"{where('model.lora')}: recipe key {error}") from None

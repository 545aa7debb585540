"""The recipe's backbone options beyond the pooler: a decoder LLM's attention (`model.attention`), LoRA adapters
(`model.lora`) and the dtype of the backbone's stored weights (`model.weights_dtype`), checked when the recipe is
loaded.

`model.weights_dtype` is LLM2Vec's memory saving: a LoRA run keeps the frozen base weights in bf16 (half the memory
of fp32: 2 bytes a parameter, 14 GB for a 7B model) while the adapters, the method's heads and AdamW's state stay
fp32. Full fine-tuning of bf16 weights is refused: AdamW's update of a weight is often smaller than bf16's
spacing at that weight (8 significant bits: 1/256 to 1/128 of it), so the update rounds away and training silently
stalls; a correct version needs fp32 master weights, which is what fp32 weights under `train.precision: bf16` are.
bf16 weights compute in bf16, so they need `train.precision` bf16 (autocast runs the fp32 adapters and heads
beside them); `auto` picks bf16 exactly when the run has LoRA and its precision resolves to bf16 (where the
device runs bf16 natively: `csekit.core.precision`), else fp32.
"""

from __future__ import annotations

from typing import Any

import torch

from csekit.core.errors import CsekitError
from csekit.encoding.decoder import ATTENTIONS
from csekit.encoding.lora import lora_options

WEIGHTS_DTYPES = ("fp32", "bf16", "auto")
"""Values of `model.weights_dtype`."""


def check_backbone_options(model: Any, where: Any) -> None:
    """`model.attention` is causal, bidirectional or null (whether the backbone is a decoder is known at load);
    `model.lora` a mapping of LoRA's options; `model.weights_dtype` bf16 only with LoRA."""
    if model.weights_dtype not in WEIGHTS_DTYPES:
        raise CsekitError(
            f"{where('model.weights_dtype')}: recipe key model.weights_dtype must be {', '.join(WEIGHTS_DTYPES)}, "
            f'not "{model.weights_dtype}"'
        )
    if model.weights_dtype == "bf16" and model.lora is None:
        raise CsekitError(
            f"{where('model.weights_dtype')}: recipe key model.weights_dtype: bf16 weights train only as LoRA's frozen "
            "base (model.lora): AdamW's small updates round away on bf16 weights; full fine-tuning keeps fp32 "
            "weights (use fp32, or auto)"
        )
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


def backbone_weights_dtype(setting: str, precision: str, lora: Any) -> torch.dtype:
    """The dtype the backbone's weights are built in for `model.weights_dtype` at the run's resolved `precision`."""
    if setting == "fp32" or (setting == "auto" and (lora is None or precision != "bf16")):
        return torch.float32
    if precision != "bf16":
        raise CsekitError(
            f"recipe key model.weights_dtype: bf16 weights compute in bf16, and this run's precision is {precision}; "
            "set train.precision: bf16 (or model.weights_dtype: auto, bf16 where the device runs it natively)"
        )
    return torch.bfloat16

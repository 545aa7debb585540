"""LoRA adapters on the backbone (`model.lora`), through peft: only the adapters (and the method's heads) train.

`add_lora` wraps the backbone in peft's `PeftModel` with a `LoraConfig` (r, alpha, dropout, target_modules; by
default every linear layer of the backbone, which for Llama, Mistral, Qwen2 and Gemma is LLM2Vec's list: q, k, v,
o, gate, up and down projections) and freezes every other backbone weight. A checkpoint holds the whole
ContrastiveModel state (the frozen weights and the adapters) and the optimizer's state of the adapters, so a
resume is exact. The saved model is a plain sentence-transformers folder: `plain_weights` merges each adapter into
its weight (W + scale * B A) for the file only, so the training model's weights stay bit for bit as they were. The
merged folder is fp32 whatever the base's dtype: a bf16 base (`model.weights_dtype`) is written exactly, and its
adapters' deltas are not rounded to bf16 (many are smaller than bf16's spacing at their weight), at twice the bytes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from csekit.core.errors import CsekitError

LORA_KEYS = ("r", "alpha", "dropout", "target_modules")
"""`model.lora`'s keys (peft's LoraConfig: r, lora_alpha, lora_dropout, target_modules)."""

LORA_DEFAULTS: Mapping[str, Any] = {"r": 16, "alpha": 32, "dropout": 0.05, "target_modules": "all-linear"}
"""LLM2Vec's r (16) and peft's defaults; `all-linear`: every linear layer of the backbone."""

MAX_RANK = 4096
"""The largest `model.lora.r` (LLM2Vec trains 16; a rank beyond the layer's width adds nothing): 2^30 asked for
hundreds of gigabytes of adapter weights."""
MAX_TARGETS = 256
MODULE_NAME = re.compile(r"[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*")
"""A module name as `target_modules` lists it (`q_proj`, `self_attn.q_proj`): peft matches the end of each layer's
name against it. Text that is not `all-linear` is a regular expression to peft (a recipe's pattern could backtrack
for hours), so only lists of names are taken."""


def lora_options(spec: Mapping[str, Any]) -> dict[str, Any]:
    """`model.lora` with its defaults, checked; a one-line error names the bad key."""
    unknown = sorted(set(spec) - set(LORA_KEYS))
    if unknown:
        raise CsekitError(f"model.lora has no key {unknown[0]!r}; its keys are {', '.join(LORA_KEYS)}")
    options = {**LORA_DEFAULTS, **spec}
    r, alpha, dropout, targets = (options[key] for key in LORA_KEYS)
    if type(r) is not int or not 1 <= r <= MAX_RANK:
        raise CsekitError(f"model.lora.r must be a whole number from 1 to {MAX_RANK}, got {r!r}")
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or alpha <= 0:
        raise CsekitError(f"model.lora.alpha must be a positive number, got {alpha!r}")
    if isinstance(dropout, bool) or not isinstance(dropout, int | float) or not 0 <= dropout < 1:
        raise CsekitError(f"model.lora.dropout must be in [0, 1), got {dropout!r}")
    if targets == "all-linear":
        return options
    plain = isinstance(targets, list) and 0 < len(targets) <= MAX_TARGETS
    if not plain or not all(isinstance(name, str) and MODULE_NAME.fullmatch(name) for name in targets):
        raise CsekitError(
            f"model.lora.target_modules must be all-linear or a list of at most {MAX_TARGETS} module names (letters, "
            f"digits, _ and dots; peft reads any other text as a regular expression), got {str(targets)[:100]!r}"
        )
    return options


def add_lora(backbone: Any, spec: Mapping[str, Any]) -> Any:
    """`backbone` wrapped in peft's PeftModel with LoRA adapters as `spec` says; its other weights frozen."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise CsekitError("model.lora needs peft: pip install 'csekit[lora]'") from None
    options = lora_options(spec)
    config = LoraConfig(
        r=options["r"],
        lora_alpha=options["alpha"],
        lora_dropout=float(options["dropout"]),
        target_modules=options["target_modules"],
    )
    try:
        return get_peft_model(backbone, config)
    except ValueError as error:  # peft: a target module that is not in the model
        reason = str(error).strip().splitlines()[0][:200]
        raise CsekitError(f"model.lora.target_modules: {reason}") from None


def is_lora(backbone: Any) -> bool:
    """Whether `backbone` carries LoRA adapters (peft's PeftModel)."""
    return callable(getattr(backbone, "get_base_model", None)) and hasattr(backbone, "peft_config")


def plain_model(backbone: Any) -> Any:
    """The transformers model inside a LoRA backbone (its layers still hold the adapters), else `backbone`."""
    return backbone.get_base_model() if is_lora(backbone) else backbone


def plain_weights(backbone: Any) -> dict[str, Any] | None:
    """The state dict of the transformers model `backbone` would be with its adapters merged (W + scale * B A, under
    the plain model's names), each merged weight computed apart, all in fp32; None for a backbone without adapters."""
    if not is_lora(backbone):
        return None
    from peft.tuners.lora import LoraLayer

    model = backbone.get_base_model()
    merged: dict[str, Any] = {}
    for name, module in model.named_modules():
        if isinstance(module, LoraLayer):
            base = module.get_base_layer()
            delta = sum(module.get_delta_weight(adapter) for adapter in module.active_adapters)
            merged[f"{name}.weight"] = (base.weight.float() + delta.float()).detach()
    weights = {}
    for key, value in model.state_dict().items():
        if "lora_" in key:
            continue
        plain = key.replace(".base_layer.", ".")
        weight = merged.get(plain, value)
        weights[plain] = weight.float() if weight.is_floating_point() else weight
    return weights

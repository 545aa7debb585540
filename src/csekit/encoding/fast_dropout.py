"""Cheaper dropout for training on CPU, where drawing the masks is a large part of a step.

SimCSE's positive pairs come from dropout, so a step draws a mask for every dropout layer of every
backbone pass (19 a pass for a 6-layer BERT). PyTorch's CPU dropout draws one Bernoulli value at a
time (about 100M values/s on this project's 2-core machine, 13% of a bf16 step); here each mask
element is 16 bits of one 64-bit draw (four elements a draw), about four times cheaper. The drop
probability becomes a multiple of 1/65536 (0.1 -> 0.1000061) and kept values are scaled by the
reciprocal of that rounded keep probability, so a layer's output is still unbiased.

Attention dropout is not a module call in transformers models: the attention function receives the
probability, and PyTorch's SDPA on CPU then falls back to its slow reference path (one bf16
attention forward and backward of 32 rows of 20 tokens, 12 heads, took 7.6 ms with dropout, 4.6 ms in
plain ops with the mask here, and 21 ms with dropout 0 through the fused kernel).
`enable_fast_dropout` therefore registers an attention function through transformers'
`AttentionInterface` that computes softmax(QK^T)V in plain ops with this mask when gradients are on
and on CPU, and defers to transformers' own SDPA function otherwise (evaluation, GPUs), so only CPU
training changes.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

ATTENTION = "csekit_cpu_dropout"
"""The name csekit's attention function is registered under in transformers' `AttentionInterface`."""

_LEVELS = 1 << 16  # a mask element is one int16 of a 64-bit draw


def rounded_drop_probability(p: float) -> float:
    """The drop probability the 16-bit masks realise for a requested `p`."""
    return round(p * _LEVELS) / _LEVELS


def keep_mask(shape: torch.Size | tuple[int, ...], p: float, device: torch.device | str = "cpu") -> Tensor:
    """A boolean mask that keeps each element with probability 1 - `rounded_drop_probability(p)`.

    Uses the default generator on `device`, so `torch.manual_seed` makes it reproducible.
    """
    numel = math.prod(shape)
    words = torch.empty((numel + 3) // 4, dtype=torch.int64, device=device)
    words.random_(-(1 << 63), None)  # the full 64-bit range; the default range leaves the sign bit 0
    bits = words.view(torch.int16)[:numel].view(shape)
    return bits >= round(p * _LEVELS) - (_LEVELS // 2)


def fast_dropout(x: Tensor, p: float) -> Tensor:
    """`nn.functional.dropout(x, p, training=True)` with a 16-bit mask; autograd keeps only the mask."""
    dropped = rounded_drop_probability(p)
    if dropped <= 0.0:
        return x
    if dropped >= 1.0:
        return x * 0.0
    # The mask becomes one multiplier tensor in x's dtype (0 or the scale): one multiplication forward and
    # one backward, with no bool-to-float conversion inside either (15-30% cheaper than x * mask * scale).
    scale = torch.tensor(1.0 / (1.0 - dropped), dtype=x.dtype, device=x.device)
    multiplier = torch.where(keep_mask(x.shape, p, x.device), scale, torch.zeros((), dtype=x.dtype, device=x.device))
    return x * multiplier


class FastDropout(nn.Dropout):
    """`nn.Dropout` with `fast_dropout`'s masks on CPU in training; unchanged elsewhere."""

    def forward(self, x: Tensor) -> Tensor:
        if self.training and x.device.type == "cpu" and not self.inplace:
            return fast_dropout(x, self.p)
        return super().forward(x)


def cpu_training_attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """transformers' attention-function signature: [B, H, L, d] in, [B, L, H, d] out.

    Plain ops with `fast_dropout` on CPU with gradients on (SDPA's CPU backward is the slow part of
    attention there); transformers' SDPA function for anything else, including inputs this function
    does not handle (causal or grouped-query attention, position biases).
    """
    plain = (
        torch.is_grad_enabled()
        and query.device.type == "cpu"
        and not kwargs.get("is_causal")
        and not getattr(module, "is_causal", False)
        and kwargs.get("position_bias") is None
        and key.shape[1] == query.shape[1]
    )
    if not plain:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    scores = torch.matmul(query, key.transpose(2, 3)) * (scaling if scaling is not None else query.shape[-1] ** -0.5)
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:  # sdpa_mask's format: True where a query may attend
            scores = scores.masked_fill(~attention_mask, torch.finfo(scores.dtype).min)
        else:
            scores = scores + attention_mask
    weights = scores.softmax(dim=-1)
    if dropout > 0.0:
        weights = fast_dropout(weights, dropout)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), None


def enable_fast_dropout(backbone: PreTrainedModel) -> bool:
    """Swap the backbone's dropout layers for `FastDropout` and, where the model supports
    transformers' attention interface, its attention for `cpu_training_attention`.

    Parameters, saved weights and evaluation are unchanged. Returns whether attention was switched.
    """
    for parent in list(backbone.modules()):
        for name, child in parent.named_children():
            if type(child) is nn.Dropout:
                setattr(parent, name, FastDropout(child.p, child.inplace).train(child.training))
    AttentionInterface.register(ATTENTION, cpu_training_attention)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)
    if getattr(backbone.config, "_attn_implementation", None) != "sdpa":
        return False  # eager or a kernel the user chose: leave it
    backbone.set_attn_implementation(ATTENTION)
    return backbone.config._attn_implementation == ATTENTION

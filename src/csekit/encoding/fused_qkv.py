"""The query, key and value projections of one attention block, as three products or one (`run.fused_qkv`).

A BERT layer computes its query, key and value as three [d, d] products of the same states. One product
with the three weights stacked ([3d, d]) does the same arithmetic in one kernel launch instead of three,
and under autocast casts one weight and one bias to half precision instead of three of each (autocast's
casts were the largest share of a batch-64 step's operator calls on an H200: docs/performance.md, "On a GPU
III"). The weights are concatenated in every pass, from the parameters themselves: gradients reach the
original query, key and value parameters through the concatenation, the optimizer updates those, and a saved
model keeps BERT's layout. No parameter is added, so nothing can fall out of step with them.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


def project_qkv(attention: nn.Module, hidden: Tensor, fused: bool) -> tuple[Tensor, Tensor, Tensor]:
    """Query, key and value [T, H, d_h] of packed states `hidden` [T, d] (`fused`: as one product)."""
    heads, head_size = attention.num_attention_heads, attention.attention_head_size
    projections: tuple[nn.Linear, ...] = (attention.query, attention.key, attention.value)
    if not fused:
        query, key, value = (projection(hidden) for projection in projections)
    else:
        weight = torch.cat([projection.weight for projection in projections])
        biases = [projection.bias for projection in projections]
        bias = None
        if any(b is not None for b in biases):  # BERT's have biases; a missing one adds nothing
            pairs = zip(biases, projections, strict=True)
            bias = torch.cat([p.weight.new_zeros(p.out_features) if b is None else b for b, p in pairs])
        query, key, value = nn.functional.linear(hidden, weight, bias).split(
            [projection.out_features for projection in projections], dim=-1
        )
    return tuple(tensor.reshape(-1, heads, head_size) for tensor in (query, key, value))  # type: ignore[return-value]

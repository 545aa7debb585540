"""The padding-free pass on fixed shapes (`run.packed_bucket`), so that a compiler can capture it once.

The packed pass's shapes follow each batch's token count T, which differs in every step: CUDA graphs
(`run.compile: reduce-overhead`) record a graph per shape, and on an H200 that made the compiled padded step
2.8x slower than no compile at all (docs/performance.md, "On a GPU III"). Here the packed states are padded
to the next multiple of `run.packed_bucket` tokens, the extra tokens laid out as a fixed number of padding
rows (each at most the width bound W long, so no row is longer than any real one may be), and every shape the
layer stack sees is fixed by the bucket, the batch's row count and W:

* the states [T_bucket, d]; the cumulative row lengths [B + k + 1] (k padding rows, `padding_rows`);
* attention through the flash kernel's variable-length form with W as every row's bound (CUDA, bf16/fp16), or
  elsewhere over the rows gathered to [B + k, W] with the key-padding mask, and gathered back by index (no
  length is read on the host, unlike the length groups of `csekit.encoding.packed`).

Everything that depends on T itself (the gathers in and out, the padding, the row layout) runs before and
after the stack, eagerly; the stack (`run_layer_stack`) takes only tensors of those fixed shapes, and
`run.compile` compiles it (`csekit.training.compiled.compile_layer_stack`). Padding tokens attend among
themselves, never to a real token, and are dropped at the end: the real tokens' states and every gradient are
those of the unbucketed pass up to float rounding (tests/unit/encoding/test_packed_fixed.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from transformers.masking_utils import create_bidirectional_mask

from csekit.encoding.fused_qkv import project_qkv
from csekit.encoding.packed import (
    PackedOutput,
    PackedRows,
    PackingLayout,
    attention_function,
    flash_attention_runs,
    packed_start,
)


def bucket_tokens(tokens: int, bucket: int) -> int:
    """`tokens` rounded up to a multiple of `bucket` (at least one bucket)."""
    return bucket * max(1, math.ceil(tokens / bucket))


def padding_rows(bucket: int, width: int) -> int:
    """Padding rows of at most `width` tokens that always hold a bucket's padding (fewer than `bucket` tokens)."""
    return math.ceil(bucket / width)


@dataclass
class FixedRows:
    """A packed batch laid out on fixed shapes: B real rows, then `padding_rows` rows of padding tokens."""

    cumulative_lengths: Tensor  # [R + 1] int32, R = B + k: row r's tokens are [cum[r], cum[r + 1])
    width: int  # W: every row's (real or padding) length bound
    flash: bool  # attention through the flash kernel's variable-length form
    gather: Tensor | None  # [R, W] packed positions of each row's slots (T_bucket: an appended zero state)
    back: Tensor | None  # [T_bucket]: each packed position's slot in the flattened [R, W]
    mask: Any  # the backbone's attention mask for the gathered rows (None with flash)
    attend: Callable[..., tuple[Tensor, Any]] | None  # the backbone's attention function (None with flash)

    @classmethod
    def of(cls, rows: PackedRows, bucket: int, width: int, flash: bool, attention: nn.Module) -> FixedRows:
        """The layout of `rows` padded to a multiple of `bucket` tokens by rows of at most `width` tokens."""
        total, device = rows.index.shape[0], rows.index.device
        size, count = bucket_tokens(total, bucket), padding_rows(bucket, width)  # the padding: < bucket tokens
        ends = torch.arange(1, count + 1, device=device, dtype=torch.int32) * width + total
        cumulative = torch.cat([rows.cumulative_lengths.to(torch.int32), ends.clamp_(max=size)])
        if flash:
            return cls(cumulative, width, True, None, None, None, None)
        starts, lengths = cumulative[:-1], cumulative[1:] - cumulative[:-1]
        slots = torch.arange(width, device=device, dtype=torch.int32)
        valid = slots[None] < lengths[:, None]  # [R, W]
        gather = torch.where(valid, starts[:, None] + slots[None], size).long()
        positions = torch.arange(size, device=device, dtype=torch.int32)
        row = torch.searchsorted(cumulative[1:], positions, right=True)
        back = row * width + (positions - cumulative[row])
        # Every row keeps its first key (an empty padding row attends to the zero state): no row is all masked.
        keys = valid | (slots == 0)[None]
        # The mask's (eager: additive) dtype: the weights', as the length groups' and `ready_mask`'s.
        shape_only = torch.empty((*keys.shape, 0), device=device, dtype=attention.query.weight.dtype)
        mask = create_bidirectional_mask(attention.config, shape_only, keys.long(), allow_is_bidirectional_skip=False)
        return cls(cumulative, width, False, gather, back.long(), mask, attention_function(attention))


def _attend_fixed(attention: nn.Module, hidden: Tensor, rows: FixedRows, fused_qkv: bool) -> Tensor:
    """One self-attention block on the fixed-shape states [T_bucket, d]: the context [T_bucket, H * d_h]."""
    query, key, value = project_qkv(attention, hidden, fused_qkv)
    dropout = attention.dropout.p if attention.training else 0.0
    if rows.flash:
        cumulative = rows.cumulative_lengths
        context = torch.ops.aten._flash_attention_forward(
            query, key, value, cumulative, cumulative, rows.width, rows.width, dropout, False, False,
            scale=attention.scaling,
        )[0]  # fmt: skip
        return context.flatten(1)
    assert rows.gather is not None and rows.back is not None and rows.attend is not None
    with_zero = [torch.cat([tensor, tensor.new_zeros((1, *tensor.shape[1:]))]) for tensor in (query, key, value)]
    q, k, v = (tensor[rows.gather].transpose(1, 2) for tensor in with_zero)  # [R, H, W, d_h]
    context, _ = rows.attend(attention, q, k, v, rows.mask, dropout=dropout, scaling=attention.scaling)
    return context.flatten(0, 1)[rows.back].flatten(1)  # [R, W, H, d_h] -> [T_bucket, H * d_h]


def run_layer_stack(
    layers: nn.ModuleList,
    hidden: Tensor,
    rows: FixedRows,
    read: Tensor | None,
    all_layers: bool,
    fused_qkv: bool,
) -> list[Tensor]:
    """The transformer layers on fixed-shape packed states [T_bucket, d]: each layer's states (`all_layers`) or
    the last one's, [T_bucket, d]; with `read` [B], the last layer at those packed positions only ([B, d])."""
    states = []
    for number, layer in enumerate(layers):
        context = _attend_fixed(layer.attention.self, hidden, rows, fused_qkv)
        if read is not None and number == len(layers) - 1:
            context, hidden = context[read], hidden[read]  # only these positions are read
        hidden = layer.attention.output(context, hidden)
        hidden = layer.output(layer.intermediate(hidden), hidden)
        if all_layers or number == len(layers) - 1:
            states.append(hidden)
    return states


LayerStack = Callable[[nn.ModuleList, Tensor, FixedRows, "Tensor | None", bool, bool], list[Tensor]]
"""`run_layer_stack`, or its compiled form."""


def _runs_flash(hidden: Tensor, attention: nn.Module) -> bool:
    """Whether the stack's attention runs the flash kernel: the projections' dtype (autocast's where it is on)."""
    device = hidden.device
    dtype = torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else hidden.dtype
    return flash_attention_runs(attention.attention_head_size, device, dtype)


def fixed_packed_pass(
    backbone: nn.Module,
    inputs: dict[str, Tensor],
    bucket: int,
    width_bound: int,
    all_layers: bool = False,
    read_positions: Tensor | None = None,
    layout: PackingLayout | None = None,
    fused_qkv: bool = False,
    stack: LayerStack | None = None,
) -> PackedOutput:
    """`csekit.encoding.packed.packed_pass` with the packed states padded to a multiple of `bucket` tokens and
    every row bounded by `width_bound` (the recipe's max_length; a wider batch widens it): the layer stack's
    shapes repeat across steps. `stack`: how the layer stack runs (compiled; default eager)."""
    rows, embedded = packed_start(backbone, inputs, layout)
    packed = rows.pack(embedded)
    attention = backbone.encoder.layer[0].attention.self
    fixed = FixedRows.of(rows, bucket, max(width_bound, rows.width), _runs_flash(packed, attention), attention)
    size = bucket_tokens(packed.shape[0], bucket)
    hidden = torch.cat([packed, packed.new_zeros((size - packed.shape[0], packed.shape[1]))])
    layers = backbone.encoder.layer
    read = rows.packed_positions(read_positions) if read_positions is not None else None
    states = (stack or run_layer_stack)(layers, hidden, fixed, read, all_layers, fused_qkv)
    if read is not None:
        return PackedOutput((), states[-1])
    total = packed.shape[0]
    unpacked = [rows.unpack(state[:total]) for state in states]
    return PackedOutput(tuple([embedded, *unpacked] if all_layers else unpacked), None)

"""The padding-free pass for decoder LLMs (Llama, Mistral, Qwen2, Gemma), bidirectional or causal.

A decoder's layers differ by family (Gemma scales its embeddings, Qwen2 has biased projections, Mistral a
sliding window, every family its own rotary and RMSNorm code) but call attention the same way: through
transformers' `AttentionInterface`, looked up by `config._attn_implementation` at every call. So instead of
driving the layers module by module (as `csekit.encoding.packed` does for BERT), the family's own forward runs
on one row of the batch's real tokens ([1, T]), and only attention changes:

* position ids restart in every sentence (the padded pass's `real_token_positions`, packed), so the rotary
  embeddings are the padded pass's whether the batch was padded on the right or on the left;
* for the pass, the config names `PACKED_ATTENTION` (registered in transformers' `AttentionInterface`, with no
  mask function, so the model builds no mask), and the batch's layout reaches it as a keyword argument (as
  transformers' own variable-length keywords do); the name is put back when the pass ends;
* attention stays within each sentence, causal within it when the decoder is causal: on CUDA in fp16/bf16
  through the flash kernel's variable-length form (`aten::_flash_attention_forward`, PyTorch's own kernel,
  no flash-attn package needed; grouped-query heads as they are), elsewhere in length groups through the
  backbone's own attention function with the mask transformers builds for it (`AttentionGroups`).

LoRA (peft) wraps the projections only, so a LoRA backbone runs the same way. Gradient checkpointing (torch's
non-reentrant checkpoint, as `run.gradient_checkpointing` enables it) re-runs each layer in the backward, after
the pass has put the attention name back: for the pass, each checkpointed layer's checkpoint function gets a
`context_fn` whose recomputation context names `PACKED_ATTENTION` again (`recomputed_under`), so the
recomputation attends as the forward did (the packing keyword travels with the layer's saved call). Naming
csekit's function for the whole run instead would need a mask function of the backbone's own attention for its
padded passes (evaluation, a batch wider than the window), which transformers looks up by the same name. Reentrant
checkpointing takes no `context_fn` and is refused (`packing_refusal`). A batch wider than a sliding window
(Mistral's, 4096 tokens) runs padded (`rows_fit_window`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn
from transformers import AttentionInterface
from transformers.masking_utils import causal_mask_function, create_bidirectional_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from csekit.core.errors import CsekitError
from csekit.encoding.decoder import attention_of, real_token_positions
from csekit.encoding.lora import plain_model
from csekit.encoding.packed import (
    AttentionGroups,
    PackedOutput,
    PackedRows,
    PackingLayout,
    checkpointing_refusal,
    flash_attention_runs,
)

PACKED_ATTENTION = "csekit_packed_decoder"
"""The attention implementation a decoder's config names during a packed pass (`packed_attention`)."""

PACKING_KEY = "csekit_packing"
"""The keyword argument that carries a pass's `DecoderPacking` through the model's forward to attention."""


@dataclass
class DecoderPacking:
    """What every layer's attention needs to keep to each sentence in one packed pass."""

    rows: PackedRows
    causal: bool
    flash_dtype: torch.dtype | None  # the flash kernel's dtype where it runs; None: length groups
    groups: AttentionGroups | None  # the length groups (None with flash)
    masks: list[Any]  # each group's mask as transformers builds it for `implementation`
    implementation: str  # the backbone's own attention implementation (its name before the pass)


def _flash_kernel(*args: Any, **kwargs: Any) -> tuple[Tensor, ...]:
    """PyTorch's flash kernel, variable-length form (one place, so a CPU test can stand a reference in for it)."""
    return torch.ops.aten._flash_attention_forward(*args, **kwargs)


def _own_attention(module: nn.Module, implementation: str) -> Callable[..., tuple[Tensor, Any]]:
    """The attention function `module` calls under `implementation` (eager: its family's own, which repeats the
    grouped key and value heads)."""
    eager = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    if eager is None:
        raise CsekitError(f"{type(module).__name__} has no eager attention function to run packed attention with")
    return ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager)


def packed_attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """transformers' attention-function signature on the packed row: [1, H, T, d] in, [1, T, H, d] out; each token
    attends to its own sentence only (as the pass's `DecoderPacking` lays the sentences out)."""
    packing = kwargs.get(PACKING_KEY)
    if not isinstance(packing, DecoderPacking):
        raise CsekitError(f"attention implementation {PACKED_ATTENTION} runs inside csekit's packed decoder pass only")
    q, k, v = (tensor[0].transpose(0, 1) for tensor in (query, key, value))  # [T, heads, d]
    rows = packing.rows
    if packing.flash_dtype is not None:
        dtype = packing.flash_dtype  # rotary embeddings in fp32 promote autocast's half-precision query back
        # The padded width bounds every sentence's length without reading the lengths on the host.
        context = _flash_kernel(
            q.to(dtype), k.to(dtype), v.to(dtype), rows.cumulative_lengths, rows.cumulative_lengths,
            rows.width, rows.width, dropout, packing.causal, False, scale=scaling,
        )[0]  # fmt: skip
        return context.unsqueeze(0), None
    assert packing.groups is not None
    attend = _own_attention(module, packing.implementation)
    grouped = ([part.transpose(1, 2) for part in packing.groups.gather(tensor)] for tensor in (q, k, v))
    per_group = zip(*grouped, packing.masks, strict=True)  # per group [g, heads, w, d] and its mask
    contexts = [
        attend(module, gq, gk, gv, mask, dropout=dropout, scaling=scaling)[0] for gq, gk, gv, mask in per_group
    ]  # each [g, w, H, d]
    return packing.groups.scatter(contexts).unsqueeze(0), None


def rows_fit_window(backbone: nn.Module, width: int) -> bool:
    """Whether sentences of up to `width` tokens fit the decoder's sliding window (none: always), so that the
    packed pass, which does not apply it, attends as the padded pass does."""
    window = getattr(plain_model(backbone).config, "sliding_window", None)
    return not isinstance(window, int) or width <= window


def _flash_dtype(model: nn.Module, device: torch.device) -> torch.dtype | None:
    """The dtype the flash kernel runs attention in for this pass, or None where it does not run: autocast's
    where it is on, else the weights' (the projections' outputs)."""
    config = model.config
    head_size = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    weights = model.get_input_embeddings().weight.dtype
    dtype = torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else weights
    return dtype if flash_attention_runs(head_size, device, dtype) else None


def _group_masks(model: nn.Module, groups: AttentionGroups, causal: bool) -> list[Any]:
    """Each length group's mask as the model builds it for its own attention: its rows' padding, and causal
    within a row where the decoder is causal (a group's rows start at their first slot, padding after)."""
    dtype = model.get_input_embeddings().weight.dtype  # the mask's (eager: additive) dtype, as the padded pass's
    return [
        create_bidirectional_mask(
            model.config,
            torch.empty((*mask.shape, 0), dtype=dtype, device=mask.device),
            mask.long(),
            and_mask_function=causal_mask_function if causal else None,
            allow_is_bidirectional_skip=False,
        )
        for _, mask in groups.groups
    ]


class AttentionNamed:
    """`config` names `implementation` as its attention inside the block, its own name again after it. A class, not
    a generator, so that one instance may be entered again (a checkpoint's recomputation, once a backward)."""

    def __init__(self, config: Any, implementation: str) -> None:
        self.config, self.implementation, self.own = config, implementation, None

    def __enter__(self) -> None:
        self.own = self.config._attn_implementation
        self.config._attn_implementation = self.implementation

    def __exit__(self, *exception: object) -> None:
        self.config._attn_implementation = self.own


@contextmanager
def recomputed_under(model: nn.Module, implementation: str) -> Iterator[None]:
    """Inside the block, each checkpointed layer's checkpoint call gets a `context_fn` (torch.utils.checkpoint):
    nothing around the forward, `implementation` named around the recomputation in the backward, whenever that
    runs; the layers' own checkpoint functions are put back after the block (the padded passes never see it)."""
    layers = [layer for layer in model.layers if getattr(layer, "gradient_checkpointing", False)]
    owns = [layer._gradient_checkpointing_func for layer in layers]

    def contexts() -> tuple[Any, Any]:
        return nullcontext(), AttentionNamed(model.config, implementation)

    for layer, own in zip(layers, owns, strict=True):
        layer._gradient_checkpointing_func = partial(own, context_fn=contexts)
    try:
        yield
    finally:
        for layer, own in zip(layers, owns, strict=True):
            layer._gradient_checkpointing_func = own


def packed_decoder_pass(
    backbone: nn.Module,
    inputs: dict[str, Tensor],
    all_layers: bool = False,
    attention_group_rows: int = 0,
    layout: PackingLayout | None = None,
) -> PackedOutput:
    """Run a decoder `backbone` (LoRA's or plain) padding-free on `inputs` padded on either side (module docstring).

    `all_layers`: every layer's states (a pooler that reads more than the last layer); states come back padded.
    `attention_group_rows`: where attention runs in length groups (not the flash kernel), rows per group (0: one).
    `layout`: where the real tokens are, made with the batch (`PackingLayout`); else found on the device.
    """
    mask = inputs["attention_mask"]
    rows = PackedRows.of(mask, layout)
    model = plain_model(backbone)
    refusal = checkpointing_refusal(model.layers)
    if refusal is not None:
        raise CsekitError(refusal)
    causal = attention_of(model.config) == "causal"
    flash_dtype = _flash_dtype(model, mask.device)
    groups = None if flash_dtype is not None else rows.attention_groups(attention_group_rows)
    masks = [] if groups is None else _group_masks(model, groups, causal)
    packing = DecoderPacking(rows, causal, flash_dtype, groups, masks, model.config._attn_implementation)
    positions = inputs.get("position_ids")
    packed: dict[str, Tensor] = {
        "position_ids": rows.pack(real_token_positions(mask) if positions is None else positions)[None]
    }
    for key in ("input_ids", "inputs_embeds", "token_type_ids"):
        if key in inputs and not (key == "input_ids" and "inputs_embeds" in inputs):
            packed[key] = rows.pack(inputs[key])[None]
    AttentionInterface.register(PACKED_ATTENTION, packed_attention)
    with AttentionNamed(model.config, PACKED_ATTENTION), recomputed_under(model, PACKED_ATTENTION):
        outputs = backbone(
            **packed, use_cache=False, output_hidden_states=all_layers, return_dict=True, **{PACKING_KEY: packing}
        )
    states = outputs.hidden_states if all_layers else (outputs.last_hidden_state,)
    return PackedOutput(tuple(rows.unpack(state[0]) for state in states), None)

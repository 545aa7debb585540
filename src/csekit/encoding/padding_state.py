"""The last-layer state of a padding position in LLM2Vec's training runs: its pad token with no attention.

LLM2Vec's SimCSE stage averages every position of its left-padded rows, padding included (`mean_padded`,
`csekit.encoding.decoder_pooling`), so the states at padding positions are part of each sentence's vector. Its
configurations run flash-attention 2 (`attn_implementation: flash_attention_2`), whose variable-length kernel
computes attention for the real tokens only (transformers' `_upad_input` drops the padding queries) and puts zeros
back at the padding positions. So at a padding position every layer adds nothing from attention (its output
projection maps those zeros to zero, or to its bias) and only its MLP acts: the state is the pad token's embedding
through the residual MLPs and the final norm, the same at every padding position of every row (one draw of
dropout aside), whatever the row holds.

`padding_state` computes it with the family's own forward on one pad token, the attention function swapped for one
that returns zeros (`NO_ATTENTION`, registered in transformers' `AttentionInterface` as the packed pass registers
its own: no mask function, so the model builds no mask), with gradients to whatever trains (LoRA's adapters on the
MLPs), and with gradient checkpointing (each checkpointed layer recomputes under the same attention).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from transformers import AttentionInterface

from csekit.encoding.lora import plain_model
from csekit.encoding.packed_decoder import AttentionNamed, recomputed_under

NO_ATTENTION = "csekit_no_attention"
"""The attention implementation a decoder's config names while `padding_state` runs."""


def no_attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """transformers' attention-function signature ([B, H, T, d] in, [B, T, H, d] out): zeros, what flash-attention's
    variable-length kernel leaves at a padding query."""
    return value.new_zeros(query.shape[0], query.shape[2], query.shape[1], value.shape[-1]), None


def padding_state(backbone: nn.Module, token_id: int) -> Tensor:
    """The last layer's state [d] at a padding position holding `token_id` (LLM2Vec pads with EOS) when attention
    leaves padding out (module docstring); `backbone` a decoder, LoRA's or plain, in its current mode."""
    model = plain_model(backbone)
    device = model.get_input_embeddings().weight.device
    AttentionInterface.register(NO_ATTENTION, no_attention)
    inputs = {
        "input_ids": torch.tensor([[token_id]], device=device),
        "position_ids": torch.zeros((1, 1), dtype=torch.long, device=device),  # no attention: rotary reads none
    }
    with AttentionNamed(model.config, NO_ATTENTION), recomputed_under(model, NO_ATTENTION):
        states = backbone(**inputs, use_cache=False, return_dict=True).last_hidden_state
    return states[0, 0]


__all__ = ["NO_ATTENTION", "no_attention", "padding_state"]

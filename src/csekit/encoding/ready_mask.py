"""The training pass's attention mask, built without asking the host whether the batch has padding.

Given a 2-D mask, transformers' mask helper (`create_bidirectional_mask`) first asks `padding_mask.all()` on
the host, to drop a mask without padding (so that SDPA may pick its flash kernel). On a GPU that read waits
for the device in every encoder pass, which keeps sync-free steps (`run.sync_free`) from ever running
ahead. The same helper with that skip turned off builds the 4-D mask the model builds for a batch with
padding, and a 4-D mask goes through the model untouched: the same values whenever the batch has padding,
which a training batch of two views almost always has. Evaluation keeps the 2-D mask: `encode` sorts rows by
length, so most of its batches have no padding and gain from the dropped mask, and it reads every batch's
vectors on the host anyway.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from transformers.masking_utils import create_bidirectional_mask

from csekit.encoding.fast_dropout import ATTENTION as FAST_DROPOUT_ATTENTION

READY_MASK_MODEL_TYPES = ("bert", "roberta", "xlm-roberta", "camembert", "electra")
"""Model types whose forward passes its mask through `create_bidirectional_mask` (transformers 5.17 and later),
which returns a 4-D mask as it is; others may not accept a 4-D mask and keep the 2-D one."""

READY_MASK_ATTENTION = ("sdpa", "eager", FAST_DROPOUT_ATTENTION)
"""Attention implementations whose mask is a 4-D tensor (flash-attention's is the 2-D mask, flex's a BlockMask);
csekit's CPU training attention (`run.fast_dropout`) takes SDPA's."""


def ready_attention_mask(backbone: nn.Module, attention_mask: Tensor) -> Tensor:
    """The 4-D mask `backbone` would build from the 2-D `attention_mask` [B, L] for a batch with padding.

    A backbone outside `READY_MASK_MODEL_TYPES` / `READY_MASK_ATTENTION`, a decoder, or a mask that is not 2-D
    gets `attention_mask` back unchanged.
    """
    config = backbone.config
    if (
        getattr(config, "model_type", None) not in READY_MASK_MODEL_TYPES
        or getattr(config, "_attn_implementation", None) not in READY_MASK_ATTENTION
        or getattr(config, "is_decoder", False)
        or attention_mask.dim() != 2
    ):
        return attention_mask
    # Only the shape, device and dtype of the embeddings are read: the mask's (eager: additive) dtype is the
    # embedding layer's output dtype, its weights' (autocast leaves embeddings and LayerNorm in that dtype).
    dtype = _embedding_dtype(backbone)
    shape_only = attention_mask.new_empty((*attention_mask.shape, 0), dtype=dtype)
    return create_bidirectional_mask(config, shape_only, attention_mask, allow_is_bidirectional_skip=False)


def _embedding_dtype(backbone: nn.Module) -> torch.dtype:
    embedding = backbone.get_input_embeddings() if hasattr(backbone, "get_input_embeddings") else None
    weight = getattr(embedding, "weight", None)
    return weight.dtype if isinstance(weight, Tensor) else torch.get_default_dtype()

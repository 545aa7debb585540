"""Decoder LLM backbones (Llama, Mistral, Qwen2/Qwen3, Gemma...): their attention, tokenizer and positions.

A decoder-only model is an encoder for csekit once three things hold, as in LLM2Vec (BehnamGhader et al., 2024):
its attention may be made bidirectional (`model.attention: bidirectional`), its tokenizer pads (with its EOS
token when it has no pad token, as LLM2Vec), and its position ids count real tokens only, so a row's vector is
the same whether its padding is on the right (csekit's) or on the left (many decoder tokenizers').

Bidirectional attention is transformers' own switch, `config.is_causal = False` (its mask functions then build a
bidirectional padding mask instead of the causal one, transformers 5.17 and later), with each attention module's
`is_causal` flag turned off too (SDPA's and flash-attention's kernels read that flag when no mask is passed). The
config's flag is saved in config.json, so the saved model (and sentence-transformers loading it) attends as it
was trained. No model class is copied.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from csekit.core.errors import CsekitError

if TYPE_CHECKING:
    from torch import Tensor, nn

ATTENTIONS = ("causal", "bidirectional")
"""`model.attention` values: a decoder's own causal attention, or every token attending to every other."""

DECODER_SPECIAL_TOKENS = ("eos_token",)
"""What a decoder's tokenizer must define: its end-of-sequence token (the padding when it has no pad token, and
what the last_token pooler reads); decoders have no [CLS]/[SEP] and byte-level ones no unknown token."""


def is_decoder_only(config: Any) -> bool:
    """Whether `config` is a decoder-only language model's (transformers has a causal-LM class for its model type and
    no masked-LM one): Llama, Mistral, Qwen2/3, Gemma, GPT-2... but not BERT, RoBERTa (which have both) or T5."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    model_type = getattr(config, "model_type", None)
    return (
        model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
        and model_type not in MODEL_FOR_MASKED_LM_MAPPING_NAMES
        and not getattr(config, "is_encoder_decoder", False)
    )


def attention_of(config: Any) -> str:
    """The attention a backbone's config says it runs with (`config.is_causal`; encoders are bidirectional)."""
    if not is_decoder_only(config):
        return "bidirectional"
    return "causal" if getattr(config, "is_causal", True) else "bidirectional"


def set_attention(backbone: nn.Module, attention: str | None) -> None:
    """Make a decoder backbone's attention `attention` (None: what its config says, e.g. as saved); an encoder's is
    bidirectional already and cannot be made causal here."""
    config = backbone.config
    attention = attention or attention_of(config)
    if attention not in ATTENTIONS:
        raise CsekitError(f'model.attention must be {" or ".join(ATTENTIONS)}, not "{attention}"')
    if not is_decoder_only(config):
        if attention == "causal":
            raise CsekitError(
                f"model.attention causal is for decoder LLM backbones; {config.model_type} is a bidirectional encoder"
            )
        return
    causal = attention == "causal"
    config.is_causal = causal
    for module in backbone.modules():
        if module is not backbone and isinstance(getattr(module, "is_causal", None), bool):
            module.is_causal = causal


def prepare_tokenizer(tokenizer: Any, config: Any) -> None:
    """A decoder's tokenizer pads with its EOS token when it has no pad token (LLM2Vec's choice) and on the right, as
    csekit pads (`pooling.pad_ids`) and as the exported tokenizer then pads in sentence-transformers."""
    if not is_decoder_only(config):
        return
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise CsekitError(f"{type(tokenizer).__name__} has neither a pad token nor an EOS token to pad with")
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "right"


def real_token_positions(attention_mask: Tensor) -> Tensor:
    """Position ids that count real tokens only (0 at each row's first real token) [B, L]: the same positions for a
    row padded on the left or on the right. Padding gets position 0 (its states mean nothing)."""
    return (attention_mask.long().cumsum(dim=1) - 1).clamp(min=0)


def eos_token_id(tokenizer: Any) -> int:
    """The tokenizer's EOS id (the last_token pooler appends it), or a one-line error."""
    token_id = getattr(tokenizer, "eos_token_id", None)
    if not isinstance(token_id, int):
        raise CsekitError(
            f"the last_token pooler needs a tokenizer with an EOS token; {type(tokenizer).__name__} has none"
        )
    return token_id

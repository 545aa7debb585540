"""The decoder LLM poolers (LLM2Vec's): the last token's state with EOS appended, and the position-weighted mean.

Both read padding on either side (a row's real tokens by its attention mask), as `csekit.encoding.decoder`'s
position ids do; `mean` (csekit.encoding.pooling) is LLM2Vec's third and its default.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from transformers import PreTrainedTokenizerBase

from csekit.encoding.decoder import eos_token_id
from csekit.encoding.pooler_base import Pooler


def last_real_positions(attention_mask: Tensor) -> Tensor:
    """Each row's last real token [B], whether the row is padded on the right or on the left."""
    return attention_mask.shape[1] - 1 - attention_mask.flip(1).long().argmax(dim=1)


class LastTokenPooler(Pooler):
    """The last real token's state, the tokenizer's EOS appended to every sentence (LLM2Vec's eos_token pooling):
    under causal attention only the last token has seen the whole sentence."""

    name = "last_token"

    def encode_ids(
        self,
        tokenizer: PreTrainedTokenizerBase,
        sentences: Sequence[str],
        max_length: int | None,
        view: int = 0,
        max_positions: int | None = None,
    ) -> dict[str, list[list[int]]]:
        ids = super().encode_ids(tokenizer, sentences, max_length, view, max_positions)
        eos, limit = eos_token_id(tokenizer), min((n for n in (max_length, max_positions) if n), default=None)
        for row, tokens in enumerate(ids["input_ids"]):
            if tokens and tokens[-1] == eos:
                continue  # the tokenizer appends it (a saved last_token model's does)
            keep = len(tokens) if limit is None else min(len(tokens), limit - 1)
            for key, values in ids.items():
                last = (
                    eos
                    if key == "input_ids"
                    else 1
                    if key == "attention_mask"
                    else values[row][-1]
                    if values[row]
                    else 0
                )
                values[row] = [*values[row][:keep], last]
        return ids

    def read_positions(self, attention_mask: Tensor, input_ids: Tensor) -> Tensor:
        return last_real_positions(attention_mask)

    def forward(self, hidden_states: Sequence[Tensor], attention_mask: Tensor, input_ids: Tensor) -> Tensor:
        states = hidden_states[-1]
        rows = torch.arange(states.shape[0], device=states.device)
        return states[rows, last_real_positions(attention_mask)]


class WeightedMeanPooler(Pooler):
    """LLM2Vec's position-weighted mean: the i-th real token of n weighs i / (1 + ... + n), so the tokens that have
    seen more of the sentence under causal attention count more (sentence-transformers' weightedmean)."""

    name = "weighted_mean"

    def forward(self, hidden_states: Sequence[Tensor], attention_mask: Tensor, input_ids: Tensor) -> Tensor:
        states = hidden_states[-1]
        mask = attention_mask.to(states.dtype)
        weights = (mask.cumsum(dim=1) * mask).unsqueeze(-1)
        return (states * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)

"""Poolers: how a sentence vector is read off the encoder's token states.

A pooler owns two things that must stay together: how sentences are turned into token ids (a prompt
pooler wraps them in a template) and how the token states are reduced to one vector. Training,
evaluation and export all go through the same pooler object, so a model is never evaluated with a
different pooler than it was trained with by accident.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn
from transformers import PreTrainedTokenizerBase

from csekit.errors import CsekitError, did_you_mean


class Pooler(nn.Module):
    """Base pooler: plain tokenisation; subclasses reduce token states to one vector per sentence."""

    name: str = ""
    #: Whether `forward` needs every layer's states (`hidden_states`), not only the last one.
    needs_all_layers: bool = False
    #: Whether the token ids differ between views (prompt poolers use one template per view).
    view_dependent: bool = False

    def encode_ids(
        self,
        tokenizer: PreTrainedTokenizerBase,
        sentences: Sequence[str],
        max_length: int | None,
        view: int = 0,
    ) -> dict[str, list[list[int]]]:
        """Unpadded token ids for `sentences`; `view` lets prompt poolers use one template per view."""
        encoded = tokenizer(list(sentences), truncation=max_length is not None, max_length=max_length)
        return {key: list(value) for key, value in encoded.items()}

    def tokenize(
        self,
        tokenizer: PreTrainedTokenizerBase,
        sentences: Sequence[str],
        max_length: int | None,
        view: int = 0,
    ) -> dict[str, Tensor]:
        """Padded model inputs for `sentences` (see `encode_ids`)."""
        return pad_ids(self.encode_ids(tokenizer, sentences, max_length, view), tokenizer.pad_token_id or 0)

    def forward(
        self, hidden_states: Sequence[Tensor], attention_mask: Tensor, input_ids: Tensor
    ) -> Tensor:  # pragma: no cover - abstract
        raise NotImplementedError


def pad_ids(ids: dict[str, list[list[int]]], pad_token_id: int) -> dict[str, Tensor]:
    """Right-pad unpadded token ids into tensors; padding is `pad_token_id` for ids and 0 elsewhere."""
    rows = ids["input_ids"]
    length = max((len(row) for row in rows), default=0)
    batch: dict[str, Tensor] = {}
    for key, values in ids.items():
        fill = pad_token_id if key == "input_ids" else 0
        tensor = torch.full((len(values), length), fill, dtype=torch.long)
        for i, row in enumerate(values):
            tensor[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        batch[key] = tensor
    return batch


class ClsPooler(Pooler):
    """The last layer's state at the first position ([CLS] or <s>)."""

    name = "cls"

    def forward(self, hidden_states: Sequence[Tensor], attention_mask: Tensor, input_ids: Tensor) -> Tensor:
        return hidden_states[-1][:, 0]


def masked_mean(states: Tensor, attention_mask: Tensor) -> Tensor:
    """Mean over the real (unmasked) tokens of each sentence."""
    mask = attention_mask.unsqueeze(-1).to(states.dtype)
    return (states * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)


class MeanPooler(Pooler):
    """Attention-masked mean of the last layer's token states."""

    name = "mean"

    def forward(self, hidden_states: Sequence[Tensor], attention_mask: Tensor, input_ids: Tensor) -> Tensor:
        return masked_mean(hidden_states[-1], attention_mask)


class FirstLastAvgPooler(Pooler):
    """Masked mean over tokens of (first transformer layer + last layer) / 2.

    `hidden_states[0]` is the embedding layer; the first transformer layer is `hidden_states[1]`,
    as in SimCSE's `avg_first_last`.
    """

    name = "first_last_avg"
    needs_all_layers = True

    def forward(self, hidden_states: Sequence[Tensor], attention_mask: Tensor, input_ids: Tensor) -> Tensor:
        if len(hidden_states) < 2:
            raise CsekitError("the first_last_avg pooler needs the model's hidden states of every layer")
        return masked_mean((hidden_states[1] + hidden_states[-1]) / 2, attention_mask)


POOLERS: dict[str, type[Pooler]] = {
    ClsPooler.name: ClsPooler,
    MeanPooler.name: MeanPooler,
    FirstLastAvgPooler.name: FirstLastAvgPooler,
}
"""Pooler names a recipe or the CLI may use. The `mask` (prompt) pooler is added by OssCSE's parts."""


def make_pooler(name: str, **options: object) -> Pooler:
    """Build a pooler by name, with a one-line error that suggests the closest valid name."""
    if name not in POOLERS:
        raise CsekitError(f'unknown pooler "{name}"{did_you_mean(name, POOLERS)}; choose one of {", ".join(POOLERS)}')
    return POOLERS[name](**options)


__all__ = [
    "POOLERS",
    "ClsPooler",
    "FirstLastAvgPooler",
    "MeanPooler",
    "Pooler",
    "make_pooler",
    "masked_mean",
    "pad_ids",
]

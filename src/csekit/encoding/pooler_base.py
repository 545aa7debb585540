"""The pooler's base class and padding: what every pooler, view and objective that tokenises shares.

Kept apart from `pooling` (the built-in poolers and their table) so that poolers in other modules (the decoder
poolers) can subclass `Pooler` without an import cycle; `pooling` re-exports every name here.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch
from torch import Tensor, nn
from transformers import PreTrainedTokenizerBase

from csekit.core.errors import CsekitError
from csekit.encoding.token_input import tokenize_texts


class Pooler(nn.Module):
    """Base pooler: plain tokenisation; subclasses reduce token states to one vector per sentence."""

    name: str = ""
    #: Whether `forward` needs every layer's states (`hidden_states`), not only the last one.
    needs_all_layers: bool = False
    #: Whether the token ids differ between views (prompt poolers use one template per view).
    view_dependent: bool = False
    #: Whether `forward` in training reads the padded batch's width (`mean_padded`): the encoder then runs the batch
    #: unsplit (no length groups, which cut each group to its own longest row).
    reads_row_width: bool = False
    #: Whether the pooled vector is scaled to unit length (a sentence-transformers folder's Normalize module, read by
    #: `model.pooler: auto`; `csekit.encoding.folder_pooling`). Set on the instance; the encoder applies it.
    normalized: bool = False

    def bind(self, tokenizer: PreTrainedTokenizerBase) -> None:
        """Called once with the encoder's tokenizer; a pooler that needs token ids (the mask) reads them here."""

    def bind_backbone(self, backbone: nn.Module) -> None:
        """Called once with the encoder's backbone; a pooler that reads one of its layers takes it here."""

    def encode_ids(
        self,
        tokenizer: PreTrainedTokenizerBase,
        sentences: Sequence[str],
        max_length: int | None,
        view: int = 0,
        max_positions: int | None = None,
    ) -> dict[str, list[list[int]]]:
        """Unpadded token ids for `sentences`; `view` lets prompt poolers use one template per view.

        `max_length` bounds each sentence as a plain tokenisation would (its special tokens included):
        it is the recipe's training bound, None at inference. `max_positions` bounds the whole input
        (the backbone's own limit). For a plain pooler both cut the same row; a prompt pooler keeps
        `max_length` sentence tokens (PromptBERT's budget) and never cuts its template.
        """
        limits = [limit for limit in (max_length, max_positions) if limit is not None]
        limit = min(limits) if limits else None
        encoded = tokenize_texts(tokenizer, sentences, limit, truncation=limit is not None, max_length=limit)
        return {key: list(value) for key, value in encoded.items()}

    def encode_views(
        self, tokenizer: PreTrainedTokenizerBase, sentences: Sequence[str], max_length: int | None, views: int
    ) -> list[dict[str, list[list[int]]]]:
        """Unpadded ids of `views` views of `sentences` (training's views), the sentences tokenised once.

        Views that differ only by dropout share one tokenisation (the same lists); a view-dependent pooler
        wraps the same tokens per view.
        """
        if not self.view_dependent:
            return [self.encode_ids(tokenizer, sentences, max_length)] * views
        return [self.encode_ids(tokenizer, sentences, max_length, view=view) for view in range(views)]

    def tokenize(
        self,
        tokenizer: PreTrainedTokenizerBase,
        sentences: Sequence[str],
        max_length: int | None,
        view: int = 0,
        max_positions: int | None = None,
    ) -> dict[str, Tensor]:
        """Padded model inputs for `sentences` (see `encode_ids`)."""
        ids = self.encode_ids(tokenizer, sentences, max_length, view, max_positions)
        return pad_ids(ids, tokenizer.pad_token_id or 0)

    def read_positions(self, attention_mask: Tensor, input_ids: Tensor) -> Tensor | None:
        """The one last-layer position each row's vector is read from [B], or None if it reads more.

        The encoder uses it to run the last layer's position-wise part (attention output, feed-forward)
        at those positions only when no part needs the other token states.
        """
        return None

    def pool_read_states(self, states: Tensor) -> Tensor:
        """The vector from the last layer's states at `read_positions` only [B, d] (the encoder's shortcut)."""
        return states

    def forward(
        self, hidden_states: Sequence[Tensor], attention_mask: Tensor, input_ids: Tensor
    ) -> Tensor:  # pragma: no cover - abstract
        raise NotImplementedError


def pad_ids(ids: dict[str, list[list[int]]], pad_token_id: int) -> dict[str, Tensor]:
    """Right-pad unpadded token ids into tensors; padding is `pad_token_id` for ids and 0 elsewhere.

    One tensor is built per key (all rows' ids in one list, put in place through the real-token mask), not
    one per row and key: at batch 512 with two views that was 3,072 small tensors, a third of collation.
    """
    rows = ids["input_ids"]
    width = max((len(row) for row in rows), default=0)
    positions = torch.arange(width)
    batch: dict[str, Tensor] = {}
    for key, values in ids.items():
        fill = pad_token_id if key == "input_ids" else 0
        real = positions < torch.tensor([len(row) for row in values], dtype=torch.long).unsqueeze(1)
        tensor = torch.full((len(values), width), fill, dtype=torch.long)
        tensor[real] = torch.tensor(list(itertools.chain.from_iterable(values)), dtype=torch.long)
        batch[key] = tensor
    return batch


def masked_mean(states: Tensor, attention_mask: Tensor) -> Tensor:
    """Mean over the real (unmasked) tokens of each sentence."""
    mask = attention_mask.unsqueeze(-1).to(states.dtype)
    return (states * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)


def special_tokens_around(tokenizer: PreTrainedTokenizerBase) -> tuple[list[int], list[int]]:
    """The special ids a tokenizer puts before and after one sentence ([CLS] / [SEP], <s> / </s>).

    Read off a tokenised probe word, because transformers 5 tokenizers no longer all offer
    `build_inputs_with_special_tokens`.
    """
    plain = list(tokenizer("a", add_special_tokens=False)["input_ids"])
    full = list(tokenizer("a")["input_ids"])
    for start in range(len(full) - len(plain) + 1):
        if full[start : start + len(plain)] == plain:
            return full[:start], full[start + len(plain) :]
    raise CsekitError(f"cannot tell which special tokens {type(tokenizer).__name__} adds around a sentence")

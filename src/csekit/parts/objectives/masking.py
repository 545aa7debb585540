"""BERT's MLM masking as SimCSE's and DiffCSE's collators draw it (train.py `mask_tokens` in both repositories).

Every token but the special ones (padding among them) is chosen with probability `mask_ratio`; a chosen token
becomes the mask token (80%), a random token of the vocabulary (half the rest) or stays (the rest). The draws
are made in the collators' order from the given generator, so one seed gives their masks.
"""

from __future__ import annotations

import torch
from torch import Tensor


def mask_tokens(
    ids: Tensor, special: Tensor, mask_ratio: float, mask_token_id: int, vocab_len: int, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """(`ids` [B, L] masked, which positions were chosen): draws in the collators' order (chosen, [MASK], random
    token, the words). `special` [B, L] marks what is never chosen."""
    probability = torch.full(ids.shape, float(mask_ratio))
    probability.masked_fill_(special, 0.0)
    chosen = torch.bernoulli(probability, generator=generator).bool()
    to_mask = torch.bernoulli(torch.full(ids.shape, 0.8), generator=generator).bool() & chosen
    masked = ids.clone()
    masked[to_mask] = mask_token_id
    to_random = torch.bernoulli(torch.full(ids.shape, 0.5), generator=generator).bool() & chosen & ~to_mask
    words = torch.randint(vocab_len, ids.shape, dtype=torch.long, generator=generator)
    masked[to_random] = words[to_random]
    return masked, chosen


def by_sentence(rows: Tensor, views: int) -> Tensor:
    """[V*n, ...] stacked view by view -> [n*V, ...] sentence by sentence (the collators' `[batch, num_sent]`
    flattened), so that the mask draws fall on the rows the authors' code draws them for."""
    n = rows.shape[0] // views
    return rows.reshape(views, n, *rows.shape[1:]).transpose(0, 1).reshape(n * views, *rows.shape[1:])

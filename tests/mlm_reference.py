"""The MLM masking of SimCSE's and DiffCSE's collators, transcribed as a reference for tests (both repositories'
train.py, `OurDataCollatorWithPadding.mask_tokens`: the same function)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


def authors_mask_tokens(inputs: Tensor, tokenizer: Any, mask_ratio: float) -> Tensor:
    """train.py's `OurDataCollatorWithPadding.mask_tokens` (mlm inputs only), drawing from torch's global generator."""
    inputs = inputs.clone()
    labels = inputs.clone()
    probability_matrix = torch.full(labels.shape, mask_ratio)
    special_tokens_mask = [
        tokenizer.get_special_tokens_mask(val, already_has_special_tokens=True) for val in labels.tolist()
    ]
    special_tokens_mask = torch.tensor(special_tokens_mask, dtype=torch.bool)
    probability_matrix.masked_fill_(special_tokens_mask, value=0.0)
    masked_indices = torch.bernoulli(probability_matrix).bool()
    indices_replaced = torch.bernoulli(torch.full(labels.shape, 0.8)).bool() & masked_indices
    inputs[indices_replaced] = tokenizer.convert_tokens_to_ids(tokenizer.mask_token)
    indices_random = torch.bernoulli(torch.full(labels.shape, 0.5)).bool() & masked_indices & ~indices_replaced
    random_words = torch.randint(len(tokenizer), labels.shape, dtype=torch.long)
    inputs[indices_random] = random_words[indices_random]
    return inputs

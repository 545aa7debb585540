"""Views: how the two (or more) inputs of each sentence are made for the contrastive loss.

A view object is called in the DataLoader with the batch's sentences and returns the model inputs
for all views stacked along the batch ([V*n, L] tensors), so one forward pass encodes every view.
SimCSE's views differ only by dropout, so the sentences are tokenised once and the same token ids
repeated; a pooler whose ids depend on the view (prompt templates) wraps the same tokens per view.
"""

from __future__ import annotations

from torch import Tensor
from transformers import PreTrainedTokenizerBase

from csekit.encoding.pooling import Pooler, pad_ids


class DropoutViews:
    """SimCSE's views: each sentence is fed `num_views` times and dropout makes them differ."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, pooler: Pooler, max_length: int, num_views: int = 2) -> None:
        if num_views < 2:
            raise ValueError("num_views must be at least 2")
        self.tokenizer = tokenizer
        self.pooler = pooler
        self.max_length = max_length
        self.num_views = num_views

    def __call__(self, sentences: list[str]) -> dict[str, Tensor]:
        views = self.pooler.encode_views(self.tokenizer, sentences, self.max_length, self.num_views)
        stacked = {key: [row for view in views for row in view[key]] for key in views[0]}
        return pad_ids(stacked, self.tokenizer.pad_token_id or 0)

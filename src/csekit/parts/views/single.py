"""One view of each sentence: for methods whose second representation comes from a second encoder, not a view.

Contrastive Tension (`objectives: [{name: contrastive_tension}]`) encodes each sentence once with the trained
encoder and once with its own copy of it, as sentence-transformers' `ContrastiveTensionLossInBatchNegatives`
does with its one text column; two dropout views would encode every sentence a needless second time.
"""

from __future__ import annotations

from torch import Tensor
from transformers import PreTrainedTokenizerBase

from csekit.encoding.pooling import Pooler, pad_ids


class SingleView:
    """Each sentence's token ids once ([n, L]); dropout, if any, acts in whichever encoder reads them."""

    num_views = 1

    def __init__(self, tokenizer: PreTrainedTokenizerBase, pooler: Pooler, max_length: int) -> None:
        self.tokenizer = tokenizer
        self.pooler = pooler
        self.max_length = max_length

    def __call__(self, sentences: list[str]) -> dict[str, Tensor]:
        (view,) = self.pooler.encode_views(self.tokenizer, sentences, self.max_length, 1)
        return pad_ids(dict(view), self.tokenizer.pad_token_id or 0)

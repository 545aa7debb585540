"""ConSERT's views (Yan et al., ACL 2021): token shuffle and token, span and feature cutoff.

All four act at the embedding layer, so a view stays one set of token ids and all views still run
in one forward pass:

* shuffle: the sentence's tokens get permuted `position_ids` (an input the backbone accepts); the
  token ids are unchanged, so the model sees the same tokens in another order. [CLS]/[SEP]/<s>/</s>
  (every token in `tokenizer.all_special_ids`) and padding keep their positions.
* token_cutoff: floor(rate x n) randomly chosen token rows of the embedding layer's output are zeroed,
  n being the sentence's non-special tokens.
* span_cutoff: one contiguous span of floor(rate x n) non-special tokens is zeroed.
* feature_cutoff: floor(rate x d) randomly chosen dimensions are zeroed at every position.

The cutoffs travel as the `embedding_mask` input ([B, L, 1], [B, 1, d] or [B, L, d]), which
`SentenceEncoder.forward` multiplies into the output of `backbone.embeddings` (after its LayerNorm
and dropout), where ConSERT's code applies them. Unlike ConSERT's code, shuffle and token/span cutoff
leave special tokens alone (ConSERT draws from all attended tokens, [CLS] and [SEP] included), so a
[CLS] pooler never reads a zeroed or moved input. Dropout (the backbone's) stays on in every view
unless `model.dropout: 0.0`; ConSERT trained without dropout.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from transformers import PreTrainedTokenizerBase

from csekit.encoding.encoder import SentenceEncoder
from csekit.encoding.passes import EMBEDDING_MASK
from csekit.encoding.pooling import Pooler, pad_ids

AUGMENTATIONS = ("none", "shuffle", "token_cutoff", "span_cutoff", "feature_cutoff")


def _parse(augmentations: Sequence[str | Sequence[str]]) -> list[tuple[str, ...]]:
    """One tuple of augmentation names per view; a string is one augmentation, `none` is dropout only."""
    if isinstance(augmentations, str) or len(augmentations) < 2:
        raise ValueError(
            "option augmentations lists one entry per view (at least 2), e.g. [feature_cutoff, shuffle]; "
            "an entry may be a list of several augmentations or none"
        )
    views: list[tuple[str, ...]] = []
    for entry in augmentations:
        names = (entry,) if isinstance(entry, str) else tuple(entry)
        for name in names:
            if name not in AUGMENTATIONS:
                raise ValueError(f'option augmentations: unknown augmentation "{name}"; choose from {AUGMENTATIONS}')
        views.append(tuple(name for name in names if name != "none"))
    return views


class ConsertViews:
    """ConSERT's views: `augmentations` has one entry per view, each applied to that view only.

    `[feature_cutoff, shuffle]` is ConSERT's best pair (view 1 feature cutoff, view 2 token shuffle);
    `[none, token_cutoff]` keeps view 1 plain; `[[shuffle, token_cutoff], feature_cutoff]` combines.
    The rates are fractions of the sentence's non-special tokens (token and span cutoff) or of the
    hidden dimensions (feature cutoff). Each batch draws from its own generator, seeded by the run's
    `seed` and the batch's sentences: the draws do not depend on which process or DataLoader worker
    makes the batch, or when (the DataLoader fetches a batch ahead), so `--resume` continues exactly.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        pooler: Pooler,
        max_length: int,
        dim: int,
        encoder: SentenceEncoder | None = None,
        augmentations: Sequence[str | Sequence[str]] = ("feature_cutoff", "shuffle"),
        token_cutoff_rate: float = 0.1,
        span_cutoff_rate: float = 0.1,
        feature_cutoff_rate: float = 0.2,
        seed: int = 0,
    ) -> None:
        self.views = _parse(augmentations)
        for name, rate in (
            ("token_cutoff_rate", token_cutoff_rate),
            ("span_cutoff_rate", span_cutoff_rate),
            ("feature_cutoff_rate", feature_cutoff_rate),
        ):
            if not 0.0 <= rate < 1.0:
                raise ValueError(f"option {name} must be in [0, 1) (got {rate})")
        self.tokenizer = tokenizer
        self.pooler = pooler
        self.max_length = max_length
        self.dim = dim
        self.num_views = len(self.views)
        self.token_cutoff_rate = float(token_cutoff_rate)
        self.span_cutoff_rate = float(span_cutoff_rate)
        self.feature_cutoff_rate = float(feature_cutoff_rate)
        self.seed = int(seed)
        self.special_ids = torch.tensor(sorted(set(tokenizer.all_special_ids)), dtype=torch.long)
        # RoBERTa-style embeddings number real tokens from padding_idx + 1 and give padding padding_idx;
        # only that integer is kept (not the encoder), so the views pickle cheaply into DataLoader workers.
        embeddings = getattr(encoder.backbone, "embeddings", None) if encoder is not None else None
        if encoder is not None and not isinstance(embeddings, nn.Module):  # a decoder LLM's is `embed_tokens`
            raise ValueError(
                f"{type(encoder.backbone).__name__} has no `embeddings` module, so embedding-level views "
                "(ConSERT's cutoffs) cannot be applied to it"
            )
        padding_idx = getattr(embeddings, "padding_idx", None)
        self.position_padding_idx: int | None = int(padding_idx) if isinstance(padding_idx, int) else None

    @staticmethod
    def count_views(options: Mapping[str, Any]) -> int:
        """One view per entry of `augmentations` (read when the recipe is loaded, before anything is built)."""
        return len(_parse(options["augmentations"]))

    def default_position_ids(self, attention_mask: Tensor) -> Tensor:
        """The position ids the backbone would use by itself (right padding)."""
        length = attention_mask.shape[1]
        if self.position_padding_idx is None:
            return torch.arange(length).expand_as(attention_mask).clone()
        mask = attention_mask.long()
        return torch.cumsum(mask, dim=1) * mask + self.position_padding_idx

    def eligible(self, batch: dict[str, Tensor]) -> Tensor:
        """[B, L] bool: attended, non-special tokens (the ones augmentations may move or cut)."""
        special = torch.isin(batch["input_ids"], self.special_ids)
        return batch["attention_mask"].bool() & ~special

    def __call__(self, sentences: list[str]) -> dict[str, Tensor]:
        views = self.pooler.encode_views(self.tokenizer, sentences, self.max_length, self.num_views)
        stacked = {key: [row for view in views for row in view[key]] for key in views[0]}
        batch = pad_ids(stacked, self.tokenizer.pad_token_id or 0)
        return self.augment(batch, len(sentences), self.batch_generator(sentences))

    def batch_generator(self, sentences: list[str]) -> torch.Generator:
        """The batch's own generator: a function of the run's seed and the batch, like the data position."""
        digest = hashlib.blake2b(str(self.seed).encode(), digest_size=8)
        for sentence in sentences:
            digest.update(b"\0" + sentence.encode("utf-8", "surrogatepass"))
        return torch.Generator().manual_seed(int.from_bytes(digest.digest(), "little") >> 1)

    def augment(self, batch: dict[str, Tensor], n: int, generator: torch.Generator | None = None) -> dict[str, Tensor]:
        """Add `position_ids` and/or `embedding_mask` to padded inputs of `num_views` stacked views of n rows.

        Draws from `generator` (default: torch's global one)."""
        used = {name for view in self.views for name in view}
        eligible = self.eligible(batch)
        size, length = batch["input_ids"].shape
        positions = self.default_position_ids(batch["attention_mask"]) if "shuffle" in used else None
        tokens = torch.ones(size, length) if used & {"token_cutoff", "span_cutoff"} else None
        features = torch.ones(size, self.dim) if "feature_cutoff" in used else None
        for v, names in enumerate(self.views):
            for row in range(v * n, (v + 1) * n):
                where = eligible[row].nonzero().flatten()
                count = len(where)
                if "shuffle" in names and positions is not None:
                    positions[row, where] = positions[row, where[torch.randperm(count, generator=generator)]]
                if "token_cutoff" in names and tokens is not None:
                    cut = int(count * self.token_cutoff_rate)
                    tokens[row, where[torch.randperm(count, generator=generator)[:cut]]] = 0.0
                if "span_cutoff" in names and tokens is not None:
                    cut = int(count * self.span_cutoff_rate)
                    if cut > 0:
                        start = int(torch.randint(count - cut + 1, (), generator=generator).item())
                        tokens[row, where[start : start + cut]] = 0.0
                if "feature_cutoff" in names and features is not None:
                    cut = int(self.dim * self.feature_cutoff_rate)
                    features[row, torch.randperm(self.dim, generator=generator)[:cut]] = 0.0
        if positions is not None:
            batch["position_ids"] = positions
        if tokens is not None and features is not None:
            batch[EMBEDDING_MASK] = tokens[:, :, None] * features[:, None, :]
        elif tokens is not None:
            batch[EMBEDDING_MASK] = tokens[:, :, None]
        elif features is not None:
            batch[EMBEDDING_MASK] = features[:, None, :]
        return batch

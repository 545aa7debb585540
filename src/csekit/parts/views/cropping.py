"""Cropping views (Contriever's random crops; González-Márquez, Berens and Kobak, TMLR 2026): `data.views:
{name: cropping}`.

Each view is one random contiguous span of the sentence's tokens, drawn as Contriever's `randomcrop`
(facebookresearch/contriever, src/data.py): a ratio r ~ U(ratio_min, ratio_max), a span of
length int(r * N) of the N tokens, and a start uniform over the N - length + 1 places it fits. The
views of a sentence are drawn independently, so they may overlap or not. The tokens are the tokenizer's
(subwords) without the special tokens, cut to the recipe's `max_length` first; the crop is wrapped in the
special tokens again, as Contriever adds [CLS]/[SEP] (its `add_bos_eos`) after cropping.

One difference from Contriever: its crops come from 256-token chunks, where int(0.1 * 256) is never 0; a
sentence of fewer than 10 tokens would give an empty crop, so a span keeps at least `min_tokens` tokens
(default 1; 0 is Contriever's rule exactly). The draws are seeded by the run's seed and the batch's
sentences (`repetition.batch_generator`), so a resumed run crops a batch as the first run did.
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers import PreTrainedTokenizerBase

from csekit.core.errors import CsekitError
from csekit.encoding.pooling import Pooler, pad_ids
from csekit.parts.views.repetition import batch_generator


def crop_span(
    n: int, ratio_min: float, ratio_max: float, generator: torch.Generator, min_tokens: int = 1
) -> tuple[int, int]:
    """(start, length) of one crop of `n` tokens: length int(r * n), r ~ U(ratio_min, ratio_max), at least
    min(min_tokens, n); start ~ U{0, ..., n - length}."""
    ratio = ratio_min + (ratio_max - ratio_min) * float(torch.rand((), generator=generator, dtype=torch.float64))
    length = max(min(min_tokens, n), int(n * ratio))
    start = int(torch.randint(0, n - length + 1, (), generator=generator))
    return start, length


class CroppingViews:
    """`num_views` random contiguous crops of each sentence (Contriever's `randomcrop`).

    ratio_min, ratio_max: the crop's share of the sentence's tokens, drawn uniformly (Contriever's
    defaults, 0.1 and 0.5). min_tokens: the shortest crop (see the module docstring). seed: the run's
    `train.seed` (a build argument). Dropout stays on, as in every view.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        pooler: Pooler,
        max_length: int,
        num_views: int = 2,
        ratio_min: float = 0.1,
        ratio_max: float = 0.5,
        min_tokens: int = 1,
        seed: int = 0,
    ) -> None:
        if num_views < 2:
            raise ValueError("num_views must be at least 2")
        if not 0.0 <= ratio_min <= ratio_max <= 1.0:
            raise ValueError(
                f"options ratio_min and ratio_max need 0 <= ratio_min <= ratio_max <= 1 (got {ratio_min}, {ratio_max})"
            )
        if min_tokens < 0:
            raise ValueError(f"option min_tokens must be at least 0 (got {min_tokens})")
        if pooler.view_dependent:
            raise CsekitError(
                f"data.views cropping would cut the {pooler.name} pooler's template: use a pooler without a "
                "template (cls, mean, ...)"
            )
        self.tokenizer = tokenizer
        self.pooler = pooler
        self.max_length = max_length
        self.num_views = int(num_views)
        self.ratio_min = float(ratio_min)
        self.ratio_max = float(ratio_max)
        self.min_tokens = int(min_tokens)
        self.seed = int(seed)
        self.special_ids = set(tokenizer.all_special_ids)

    def crop(self, ids: list[int], generator: torch.Generator) -> list[int]:
        """One crop of a tokenised sentence: its leading and trailing special tokens kept, the words between cropped."""
        content = [i for i, token in enumerate(ids) if token not in self.special_ids]
        if not content:
            return list(ids)
        first, last = content[0], content[-1] + 1
        start, length = crop_span(last - first, self.ratio_min, self.ratio_max, generator, self.min_tokens)
        return ids[:first] + ids[first + start : first + start + length] + ids[last:]

    def __call__(self, sentences: list[str]) -> dict[str, Tensor]:
        original = self.pooler.encode_ids(self.tokenizer, sentences, self.max_length)
        generator = batch_generator(self.seed, sentences)
        rows = [self.crop(ids, generator) for _ in range(self.num_views) for ids in original["input_ids"]]
        stacked: dict[str, list[list[int]]] = {"input_ids": rows, "attention_mask": [[1] * len(row) for row in rows]}
        if "token_type_ids" in original:
            stacked["token_type_ids"] = [[0] * len(row) for row in rows]
        return pad_ids(stacked, self.tokenizer.pad_token_id or 0)

"""TSDAE's deletion noise (Wang, Reimers and Gurevych, Findings of EMNLP 2021): `data.views: {name: deletion}`.

The one view is the sentence with each word deleted with probability `del_ratio` (0.6, the paper's best),
at least one word kept; the `tsdae` objective reconstructs the clean sentence from its vector. As
sentence-transformers' `DenoisingAutoEncoderDataset.delete` the noise is made on words, not subwords, and
the kept words are joined again before tokenisation. Its words are NLTK's `word_tokenize` (Treebank)
and its join the Treebank detokenizer; csekit needs no NLTK, so its words are runs of letters and digits
(with an apostrophe suffix: "don't") and single punctuation marks, joined by spaces. They differ from NLTK's on
contractions ("don't": NLTK's "do" + "n't"), abbreviations and numbers ("U.S.", "3.50", "1,000": one NLTK token,
three csekit words), hyphenated words, "..." and "--", and quotes (NLTK's `` and ''); the space join leaves
" ." where the detokenizer writes "." (a BERT tokenizer splits it the same; a byte-level BPE does not). Examples:
docs/fidelity.md's TSDAE table and `tests/methods/test_tsdae.py`.
The draws are seeded by the run's seed and the batch's sentences (`repetition.batch_generator`).
"""

from __future__ import annotations

import re

import torch
from torch import Tensor
from transformers import PreTrainedTokenizerBase

from csekit.core.errors import CsekitError
from csekit.encoding.pooling import Pooler
from csekit.parts.views.repetition import batch_generator

WORD = re.compile(r"\w+(?:'\w+)?|[^\w\s]")
"""A word of the deletion noise: letters/digits (an apostrophe suffix kept with them), or one punctuation mark."""


def delete_words(text: str, del_ratio: float, generator: torch.Generator) -> str:
    """`text` with each word kept with probability 1 - del_ratio (at least one kept), joined by spaces."""
    words = WORD.findall(text)
    if not words:
        return text
    keep = (torch.rand(len(words), generator=generator, dtype=torch.float64) > del_ratio).tolist()
    if not any(keep):
        keep[int(torch.randint(0, len(words), (), generator=generator))] = True
    return " ".join(word for word, kept in zip(words, keep, strict=True) if kept)


class DeletionViews:
    """One view: the sentence with words deleted (TSDAE's noise). del_ratio: each word's deletion probability."""

    num_views = 1

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        pooler: Pooler,
        max_length: int,
        del_ratio: float = 0.6,
        seed: int = 0,
    ) -> None:
        if not 0.0 <= del_ratio < 1.0:
            raise ValueError(f"option del_ratio must be in [0, 1) (got {del_ratio})")
        if pooler.view_dependent:
            raise CsekitError(
                f"data.views deletion (TSDAE) reconstructs the bare sentence: use a pooler without a template "
                f"(cls, mean, ...), not {pooler.name}"
            )
        self.tokenizer = tokenizer
        self.pooler = pooler
        self.max_length = max_length
        self.del_ratio = float(del_ratio)
        self.seed = int(seed)

    def __call__(self, sentences: list[str]) -> dict[str, Tensor]:
        generator = batch_generator(self.seed, sentences)
        noisy = [delete_words(sentence, self.del_ratio, generator) for sentence in sentences]
        return self.pooler.tokenize(self.tokenizer, noisy, self.max_length)

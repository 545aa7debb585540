"""ESimCSE's word repetition (Wu et al., COLING 2022, section 3.1): `data.views: {name: repetition}`.

View 0 is the sentence; view 1 the same tokens with some of them repeated in place, so the positive
pair no longer shares its length (SimCSE's dropout pairs always do, which biases the model towards
equal-length sentences). For a sentence of N tokens (the recipe's truncation applied, special tokens
not counted) the paper draws dup_len uniformly from [0, max(2, int(dup_rate * N))] and repeats dup_len
tokens chosen uniformly without replacement; as in the paper the tokens are the tokenizer's (subwords).
The draws come from a generator seeded by the run's seed and the batch's sentences, not from torch's
global generator: the DataLoader collates a batch ahead of the step that uses it (accelerate looks one
batch ahead), so global draws made there would fall before the checkpoint that the batch comes after,
and a resumed run would draw other repetitions. Seeded by the batch, a batch gets the same views
whenever (and in whichever worker) it is made.
"""

from __future__ import annotations

import hashlib

import torch
from torch import Tensor
from transformers import PreTrainedTokenizerBase

from csekit.core.errors import CsekitError
from csekit.encoding.pooling import Pooler, pad_ids


def batch_generator(seed: int, sentences: list[str]) -> torch.Generator:
    """A generator seeded by the run's seed and the batch's sentences (the same batch, the same draws)."""
    digest = hashlib.blake2b(str(seed).encode(), digest_size=8)
    for sentence in sentences:
        digest.update(b"\x00" + sentence.encode("utf-8", "surrogatepass"))
    return torch.Generator().manual_seed(int.from_bytes(digest.digest(), "little") & (2**63 - 1))


def repeat_tokens(
    ids: list[int], eligible: list[int], dup_rate: float, generator: torch.Generator, limit: int | None = None
) -> list[int]:
    """`ids` with dup_len of the `eligible` positions doubled, dup_len ~ U{0, ..., max(2, int(dup_rate * N))}.

    N = len(eligible); at most N positions are doubled, and none once the row would exceed `limit`.
    """
    n = len(eligible)
    dup_len = int(torch.randint(0, max(2, int(dup_rate * n)) + 1, (), generator=generator))
    chosen = {eligible[j] for j in torch.randperm(n, generator=generator)[: min(dup_len, n)].tolist()} if n else set()
    repeated: list[int] = []
    room = len(ids) + len(chosen) if limit is None else limit
    extra = max(0, room - len(ids))
    for position, token in enumerate(ids):
        repeated.append(token)
        if position in chosen and extra > 0:
            repeated.append(token)
            extra -= 1
    return repeated


class RepetitionViews:
    """ESimCSE's views: the sentence (view 0) and the sentence with some tokens repeated (view 1).

    dup_rate: the paper's duplication rate, 0.32 for BERT-base. Dropout stays on in both views.
    seed: the run's `train.seed` (a build argument), which seeds each batch's draws with its sentences.
    """

    num_views = 2

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        pooler: Pooler,
        max_length: int,
        dup_rate: float = 0.32,
        seed: int = 0,
    ) -> None:
        if not 0.0 <= dup_rate <= 1.0:
            raise ValueError(f"option dup_rate must be in [0, 1] (got {dup_rate})")
        if pooler.view_dependent:
            raise CsekitError(
                f"data.views repetition would repeat the {pooler.name} pooler's template tokens: use a pooler "
                "without a template (cls, mean, ...)"
            )
        self.tokenizer = tokenizer
        self.pooler = pooler
        self.max_length = max_length
        self.dup_rate = float(dup_rate)
        self.seed = int(seed)
        self.special_ids = set(tokenizer.all_special_ids)
        model_max = getattr(tokenizer, "model_max_length", None)
        self.limit = int(model_max) if isinstance(model_max, int) and model_max < 100_000 else None

    def __call__(self, sentences: list[str]) -> dict[str, Tensor]:
        original = self.pooler.encode_ids(self.tokenizer, sentences, self.max_length)
        repeated: dict[str, list[list[int]]] = {key: [] for key in original}
        generator = batch_generator(self.seed, sentences)
        for ids in original["input_ids"]:
            eligible = [i for i, token in enumerate(ids) if token not in self.special_ids]
            row = repeat_tokens(ids, eligible, self.dup_rate, generator, self.limit)
            repeated["input_ids"].append(row)
            repeated["attention_mask"].append([1] * len(row))
            if "token_type_ids" in repeated:
                repeated["token_type_ids"].append([0] * len(row))
        stacked = {key: original[key] + repeated[key] for key in original}
        return pad_ids(stacked, self.tokenizer.pad_token_id or 0)

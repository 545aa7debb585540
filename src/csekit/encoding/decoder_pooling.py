"""The decoder LLM poolers (LLM2Vec's): the last token's state with EOS appended, the position-weighted mean, and
LLM2Vec's two means as its code computes them.

All read padding on either side (a row's real tokens by its attention mask), as `csekit.encoding.decoder`'s
position ids do; `mean` (csekit.encoding.pooling) is LLM2Vec's third and its default, averaged over every real
token. LLM2Vec's code averages other tokens (llm2vec.py `tokenize` and `get_pooling`, rows padded on the left):

* at inference (`encode`), the text's tokens: each input is "instruction!@#$%^&*()text", `embed_mask` marks the
  last len(tokenize(text)) positions, so BOS is left out: `mean_text` here;
* in its unsupervised SimCSE training (`run_simcse.py`'s collator passes the sentences without the separator), the
  text part is empty, `embed_mask` is all zeros, and `last_hidden_states[i, -0:]` is the whole row: every position
  of the padded row, padding and BOS included: `mean_padded` here, whose test-time form is `mean` or, with
  `test_bos: false` (`model.test_bos`), `mean_text`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn
from transformers import PreTrainedTokenizerBase

from csekit.core.errors import CsekitError
from csekit.encoding.decoder import eos_token_id, is_decoder_only
from csekit.encoding.padding_state import padding_state
from csekit.encoding.pooler_base import Pooler, masked_mean, special_tokens_around


def last_real_positions(attention_mask: Tensor) -> Tensor:
    """Each row's last real token [B], whether the row is padded on the right or on the left."""
    return attention_mask.shape[1] - 1 - attention_mask.flip(1).long().argmax(dim=1)


class LastTokenPooler(Pooler):
    """The last real token's state, the tokenizer's EOS appended to every sentence (LLM2Vec's eos_token pooling):
    under causal attention only the last token has seen the whole sentence."""

    name = "last_token"

    def encode_ids(
        self,
        tokenizer: PreTrainedTokenizerBase,
        sentences: Sequence[str],
        max_length: int | None,
        view: int = 0,
        max_positions: int | None = None,
    ) -> dict[str, list[list[int]]]:
        ids = super().encode_ids(tokenizer, sentences, max_length, view, max_positions)
        eos, limit = eos_token_id(tokenizer), min((n for n in (max_length, max_positions) if n), default=None)
        for row, tokens in enumerate(ids["input_ids"]):
            if tokens and tokens[-1] == eos:
                continue  # the tokenizer appends it (a saved last_token model's does)
            keep = len(tokens) if limit is None else min(len(tokens), limit - 1)
            for key, values in ids.items():
                last = (
                    eos
                    if key == "input_ids"
                    else 1
                    if key == "attention_mask"
                    else values[row][-1]
                    if values[row]
                    else 0
                )
                values[row] = [*values[row][:keep], last]
        return ids

    def read_positions(self, attention_mask: Tensor, input_ids: Tensor) -> Tensor:
        return last_real_positions(attention_mask)

    def forward(self, hidden_states: Sequence[Tensor], attention_mask: Tensor, input_ids: Tensor) -> Tensor:
        states = hidden_states[-1]
        rows = torch.arange(states.shape[0], device=states.device)
        return states[rows, last_real_positions(attention_mask)]


class WeightedMeanPooler(Pooler):
    """LLM2Vec's position-weighted mean: the i-th real token of n weighs i / (1 + ... + n), so the tokens that have
    seen more of the sentence under causal attention count more (sentence-transformers' weightedmean)."""

    name = "weighted_mean"

    def forward(self, hidden_states: Sequence[Tensor], attention_mask: Tensor, input_ids: Tensor) -> Tensor:
        states = hidden_states[-1]
        mask = attention_mask.to(states.dtype)
        weights = (mask.cumsum(dim=1) * mask).unsqueeze(-1)
        return (states * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)


def text_token_mask(attention_mask: Tensor, leading: int) -> Tensor:
    """Each row's text tokens [B, L] (bool): its real tokens less its first `leading` (those the tokenizer puts before
    the text: BOS), padded on either side. A row with no other token keeps its real tokens (an empty sentence)."""
    real = attention_mask.bool()
    text = real & (attention_mask.long().cumsum(dim=1) > leading)
    return torch.where(text.any(dim=1, keepdim=True), text, real)


def _leading_tokens(tokenizer: PreTrainedTokenizerBase) -> int:
    """How many special tokens the tokenizer puts before a sentence's text (Llama's, Mistral's, Gemma's: BOS)."""
    return len(special_tokens_around(tokenizer)[0])


class MeanTextPooler(Pooler):
    """The mean of each sentence's text tokens, the tokenizer's BOS left out: LLM2Vec's `encode` (module docstring).

    sentence-transformers' Pooling cannot leave BOS out, so a saved `mean_text` model names a module that refuses to
    load there (`TextMeanNotExported`) and loads with `csekit.SentenceEncoder.load`.
    """

    name = "mean_text"

    def __init__(self) -> None:
        super().__init__()
        self.leading: int | None = None

    def bind(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.leading = _leading_tokens(tokenizer)

    def text_mean(self, states: Tensor, attention_mask: Tensor) -> Tensor:
        if self.leading is None:
            raise CsekitError(f"the {self.name} pooler was not given a tokenizer (SentenceEncoder binds it)")
        return masked_mean(states, text_token_mask(attention_mask, self.leading))

    def forward(self, hidden_states: Sequence[Tensor], attention_mask: Tensor, input_ids: Tensor) -> Tensor:
        return self.text_mean(hidden_states[-1], attention_mask)


class MeanPaddedPooler(MeanTextPooler):
    """LLM2Vec's SimCSE training pooling, `model.pooler: mean_padded` (module docstring). In training, each row's mean
    over every position of the padded batch, its padding and BOS included: the sum of its real tokens' states and,
    for each padding position, the state LLM2Vec's flash-attention run gives it (`csekit.encoding.padding_state`:
    the pad token, EOS as LLM2Vec pads, with no attention), over the batch's width. Outside training, the test-time
    pooler: `mean` (every real token), or `mean_text` with `test_bos` false (LLM2Vec's `encode`); that is the name a
    saved model records, as `mask_denoised` saves `mask`.

    The width is the padded row's (the batch's longest, as LLM2Vec pads each view's batch; its dropout views are the
    same sentences, so csekit's batch of both views has the same width), so the encoder runs such a batch unsplit
    (`reads_row_width`); chunks of rows (`run.chunk_size`) keep the batch's width, and a packed pass gives the
    real tokens' states, all this pooler reads.
    """

    name = "mean"  # per instance: the test-time pooler (see above)
    reads_row_width = True

    def __init__(self, test_bos: bool = True) -> None:
        super().__init__()
        if not isinstance(test_bos, bool):
            raise CsekitError(f"the mean_padded pooler's test_bos must be true or false, not {test_bos!r}")
        self.test_bos = test_bos
        self.name = "mean" if test_bos else MeanTextPooler.name
        self.pad_token_id: int | None = None

    def bind(self, tokenizer: PreTrainedTokenizerBase) -> None:
        super().bind(tokenizer)
        eos = getattr(tokenizer, "eos_token_id", None)  # LLM2Vec pads with EOS (tokenizer.pad_token = eos_token)
        self.pad_token_id = eos if isinstance(eos, int) else None

    def bind_backbone(self, backbone: nn.Module) -> None:
        if not is_decoder_only(backbone.config):
            raise CsekitError(
                f"the mean_padded pooler is LLM2Vec's training pooling for decoder LLM backbones; "
                f"{backbone.config.model_type} is a bidirectional encoder (use mean)"
            )
        if self.pad_token_id is None:
            raise CsekitError("the mean_padded pooler needs a tokenizer with an EOS token (LLM2Vec pads with it)")
        object.__setattr__(self, "_backbone", backbone)  # not a submodule: the encoder owns it

    def forward(self, hidden_states: Sequence[Tensor], attention_mask: Tensor, input_ids: Tensor) -> Tensor:
        states = hidden_states[-1]
        if not self.training:
            return masked_mean(states, attention_mask) if self.test_bos else self.text_mean(states, attention_mask)
        backbone = self.__dict__.get("_backbone")
        if backbone is None or self.pad_token_id is None:
            raise CsekitError(
                "the mean_padded pooler was not given a backbone and tokenizer (SentenceEncoder binds them)"
            )
        mask = attention_mask.to(states.dtype).unsqueeze(-1)
        width = attention_mask.shape[1]
        padding = padding_state(backbone, self.pad_token_id).to(states.dtype)
        return ((states * mask).sum(dim=1) + (width - mask.sum(dim=1)) * padding) / width


class TextMeanNotExported:
    """Named in the modules.json of a saved `mean_text` model so that sentence-transformers refuses it in one line
    (its Pooling would average BOS too). Load such a model with `csekit.SentenceEncoder.load(path)`."""

    MESSAGE = (
        "this csekit model averages the text tokens without the tokenizer's BOS (pooler mean_text, LLM2Vec's encode), "
        "which sentence-transformers' Pooling cannot; load it with csekit.SentenceEncoder.load(path) and call "
        ".encode(sentences), or train with model.test_bos: true for a sentence-transformers model"
    )

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise CsekitError(self.MESSAGE)

    @classmethod
    def load(cls, *args: object, **kwargs: object) -> TextMeanNotExported:
        raise CsekitError(cls.MESSAGE)

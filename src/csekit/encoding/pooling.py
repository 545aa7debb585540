"""Poolers: how a sentence vector is read off the encoder's token states.

A pooler owns two things that must stay together: how sentences are turned into token ids (a prompt
pooler wraps them in a template) and how the token states are reduced to one vector. Training,
evaluation and export all go through the same pooler object, so a model is never evaluated with a
different pooler than it was trained with by accident.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from types import MappingProxyType

import torch
from torch import Tensor, nn
from transformers import PreTrainedTokenizerBase

from csekit.core.errors import CsekitError
from csekit.core.registry import Registry
from csekit.encoding.decoder_pooling import (
    LastTokenPooler,
    MeanPaddedPooler,
    MeanTextPooler,
    TextMeanNotExported,
    WeightedMeanPooler,
    last_real_positions,
)
from csekit.encoding.pooler_base import Pooler, masked_mean, pad_ids
from csekit.encoding.pooler_base import special_tokens_around as _special_tokens
from csekit.encoding.prompteol import PROMPTEOL_TEMPLATE, PromptEOLPooler
from csekit.encoding.token_input import tokenize_texts


class ClsPooler(Pooler):
    """The last layer's state at the first position ([CLS] or <s>)."""

    name = "cls"

    def read_positions(self, attention_mask: Tensor, input_ids: Tensor) -> Tensor:
        return torch.zeros(input_ids.shape[0], dtype=torch.long, device=input_ids.device)

    def forward(self, hidden_states: Sequence[Tensor], attention_mask: Tensor, input_ids: Tensor) -> Tensor:
        return hidden_states[-1][:, 0]


def backbone_pooler_layer(backbone: nn.Module, reader: str) -> nn.Module:
    """The backbone's own pooler layer (BERT's: dense + tanh on [CLS]), or a one-line error naming `reader`.

    Only the BERT layout (a `dense` Linear and an `activation`, as in BERT, RoBERTa, XLM-R, MPNet) is
    accepted: csekit applies it to the [CLS] vector itself and exports it as a Dense layer.
    """
    layer = getattr(backbone, "pooler", None)
    if (
        not isinstance(layer, nn.Module)
        or not isinstance(getattr(layer, "dense", None), nn.Linear)
        or not callable(getattr(layer, "activation", None))
    ):
        raise CsekitError(
            f"{reader} needs a backbone with a pooler layer (dense + activation on [CLS], as in BERT); "
            f"{type(backbone).__name__} has none, so choose another pooler (cls reads the same [CLS] state raw)"
        )
    return layer


class PoolerOutputPooler(Pooler):
    """The backbone's own pooler layer on the last layer's [CLS] state (transformers' `pooler_output`).

    For bert-base-uncased that layer is BERT's pre-trained NSP pooler (dense + tanh); in SimCSE's hub
    checkpoints (princeton-nlp/unsup-simcse-*) it holds SimCSE's training MLP, so this pooler gives
    SimCSE's training representation, which is how DCLR's code reads its complementary model.
    The encoder freezes the backbone's pooler layer because other poolers never read it; this pooler
    unfreezes it, so a model trained with it trains the layer (as transformers' models do). The layer
    stays owned by the backbone (one state_dict entry); the pooler keeps a plain reference to it.
    """

    name = "pooler_output"

    def bind_backbone(self, backbone: nn.Module) -> None:
        layer = backbone_pooler_layer(backbone, f"the {self.name} pooler")
        layer.requires_grad_(True)
        object.__setattr__(self, "_layer", layer)  # not a submodule: the backbone already owns it

    @property
    def layer(self) -> nn.Module:
        """The backbone's pooler layer (dense + activation)."""
        layer = self.__dict__.get("_layer")
        if layer is None:
            raise CsekitError(f"the {self.name} pooler was not given a backbone (SentenceEncoder binds it)")
        return layer

    def read_positions(self, attention_mask: Tensor, input_ids: Tensor) -> Tensor:
        return torch.zeros(input_ids.shape[0], dtype=torch.long, device=input_ids.device)

    def pool_read_states(self, states: Tensor) -> Tensor:
        return self.layer.activation(self.layer.dense(states))

    def forward(self, hidden_states: Sequence[Tensor], attention_mask: Tensor, input_ids: Tensor) -> Tensor:
        return self.pool_read_states(hidden_states[-1][:, 0])


class MeanPooler(Pooler):
    """Attention-masked mean of the last layer's token states."""

    name = "mean"

    def forward(self, hidden_states: Sequence[Tensor], attention_mask: Tensor, input_ids: Tensor) -> Tensor:
        return masked_mean(hidden_states[-1], attention_mask)


class MaxPooler(Pooler):
    """Per channel, the largest last-layer state over the real tokens (sentence-transformers' `max` mode)."""

    name = "max"

    def forward(self, hidden_states: Sequence[Tensor], attention_mask: Tensor, input_ids: Tensor) -> Tensor:
        states = hidden_states[-1]
        padding = ~attention_mask.bool().unsqueeze(-1)
        return states.masked_fill(padding, float("-inf")).max(dim=1).values


class MeanSqrtLenPooler(Pooler):
    """The masked sum of the last layer's states over the square root of the sentence's length
    (sentence-transformers' `mean_sqrt_len_tokens` mode): longer sentences get longer vectors."""

    name = "mean_sqrt_len"

    def forward(self, hidden_states: Sequence[Tensor], attention_mask: Tensor, input_ids: Tensor) -> Tensor:
        states = hidden_states[-1]
        mask = attention_mask.unsqueeze(-1).to(states.dtype)
        return (states * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9).sqrt()


class FirstLastAvgPooler(Pooler):
    """Masked mean over tokens of (first transformer layer + last layer) / 2.

    `hidden_states[0]` is the embedding layer; the first transformer layer is `hidden_states[1]`,
    as in SimCSE's `avg_first_last`.
    """

    name = "first_last_avg"
    needs_all_layers = True

    def forward(self, hidden_states: Sequence[Tensor], attention_mask: Tensor, input_ids: Tensor) -> Tensor:
        if len(hidden_states) < 2:
            raise CsekitError("the first_last_avg pooler needs the model's hidden states of every layer")
        return masked_mean((hidden_states[1] + hidden_states[-1]) / 2, attention_mask)


PROMPT_TEMPLATES = ('This sentence : "[X]" means [MASK] .', 'This sentence of "[X]" means [MASK] .')
"""OssCSE's two templates (its section 4), view 0 (also used at evaluation) and view 1, each with PromptBERT's
trailing " ." (run.sh: `means*mask*.`): the paper prints them without it but follows PromptBERT."""


def check_prompt_template(template: str) -> None:
    """One [X] (the sentence) and one [MASK] after it (the pooler reads the last mask), else one line."""
    if template.count("[X]") != 1 or template.count("[MASK]") != 1:
        raise CsekitError(f'prompt template "{template}" needs exactly one [X] and one [MASK]')
    if template.index("[MASK]") < template.index("[X]"):
        raise CsekitError(f'prompt template "{template}" needs its [MASK] after the sentence [X]')


class MaskPooler(Pooler):
    """PromptBERT's representation: wrap the sentence in a template, read the last layer at its mask token.

    Each view gets its own template (OssCSE's positive pair differs by template as well as dropout);
    evaluation and export use view 0. When the input is too long the sentence is truncated, never the
    template, so every input keeps exactly one mask token to read. Sentence and template pieces are
    tokenised separately and joined as ids: the template has no space between the quote and the
    sentence, so a byte-level BPE tokenizer (RoBERTa) sees the sentence's first word as it would after
    a quote.
    """

    name = "mask"
    view_dependent = True

    def __init__(self, templates: Sequence[str] = PROMPT_TEMPLATES) -> None:
        super().__init__()
        if not templates:
            raise CsekitError("the mask pooler needs at least one prompt template (one per view)")
        for template in templates:
            check_prompt_template(template)
        self.templates = tuple(templates)
        self.mask_token_id: int | None = None
        self._pieces: dict[tuple[int, int], tuple[list[int], list[int]]] = {}
        self._specials: dict[int, tuple[list[int], list[int]]] = {}

    def bind(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.mask_token_id = _mask_token_id(tokenizer)

    def _template_ids(self, tokenizer: PreTrainedTokenizerBase, view: int) -> tuple[list[int], list[int]]:
        """Ids before and after the sentence for `view`'s template (cached per tokenizer and view)."""
        key = (id(tokenizer), view)
        if key not in self._pieces:
            mask_id = _mask_token_id(tokenizer)
            template = self.templates[view % len(self.templates)]
            before, after = template.split("[X]")
            after = after.replace("[MASK]", str(tokenizer.mask_token))
            pieces = tokenize_texts(tokenizer, [before, after], None, add_special_tokens=False)["input_ids"]
            prefix_ids, suffix_ids = list(pieces[0]), list(pieces[1])
            if suffix_ids.count(mask_id) != 1 or mask_id in prefix_ids:
                raise CsekitError(
                    f'prompt template "{template}": the tokenizer does not keep {tokenizer.mask_token} as one token'
                )
            self._pieces[key] = (prefix_ids, suffix_ids)
        return self._pieces[key]

    def _special_ids(self, tokenizer: PreTrainedTokenizerBase) -> tuple[list[int], list[int]]:
        """`_special_tokens(tokenizer)`, cached per tokenizer (it tokenises a probe word twice)."""
        key = id(tokenizer)
        if key not in self._specials:
            self._specials[key] = _special_tokens(tokenizer)
        return self._specials[key]

    def check_room(self, tokenizer: PreTrainedTokenizerBase, max_positions: int) -> None:
        """Every template, with the special tokens, leaves room for a sentence in the backbone's positions.

        Checked when the model is built, not at the first batch (a traceback there left a run folder behind).
        """
        head, tail = self._special_ids(tokenizer)
        for view, template in enumerate(self.templates):
            prefix, suffix = self._template_ids(tokenizer, view)
            taken = len(prefix) + len(suffix) + len(head) + len(tail)
            if taken >= max_positions:
                raise CsekitError(
                    f'prompt template "{template[:60]}" takes {taken} tokens with the special tokens; the model '
                    f"accepts {max_positions}, which leaves no room for the sentence"
                )

    def encode_ids(
        self,
        tokenizer: PreTrainedTokenizerBase,
        sentences: Sequence[str],
        max_length: int | None,
        view: int = 0,
        max_positions: int | None = None,
    ) -> dict[str, list[list[int]]]:
        """Template-wrapped ids. As in PromptBERT (`encode(s, add_special_tokens=False)[:max_seq_length]`),
        `max_length` is the number of sentence tokens kept, and the template and the special tokens come on
        top; `max_positions` (the backbone's limit) cuts the sentence further so that everything fits."""
        budget = self._sentence_budget(tokenizer, view, max_length, max_positions)
        bodies = tokenize_texts(tokenizer, sentences, budget, add_special_tokens=False)["input_ids"]
        return self._wrapped(tokenizer, bodies, view, budget)

    def encode_views(
        self, tokenizer: PreTrainedTokenizerBase, sentences: Sequence[str], max_length: int | None, views: int
    ) -> list[dict[str, list[list[int]]]]:
        """Each view's template around the same sentence tokens: the sentences are tokenised once."""
        budgets = [self._sentence_budget(tokenizer, view, max_length, None) for view in range(views)]
        widest = None if None in budgets else max(budgets)  # type: ignore[type-var]
        bodies = tokenize_texts(tokenizer, sentences, widest, add_special_tokens=False)["input_ids"]
        return [self._wrapped(tokenizer, bodies, view, budget) for view, budget in enumerate(budgets)]

    def _sentence_budget(
        self, tokenizer: PreTrainedTokenizerBase, view: int, max_length: int | None, max_positions: int | None
    ) -> int | None:
        """How many sentence tokens `view`'s template keeps (None: all), or a one-line error if none fit."""
        prefix, suffix = self._template_ids(tokenizer, view)
        head, tail = self._special_ids(tokenizer)
        specials = len(head) + len(tail)
        budgets = []
        if max_length is not None:
            budgets.append(max_length)
        if max_positions is not None:
            budgets.append(max_positions - len(prefix) - len(suffix) - specials)
        budget = min(budgets) if budgets else None
        if budget is not None and budget < 1:
            raise CsekitError(
                f"max_length {max_length} / max_positions {max_positions} leave no room for the sentence in the "
                f"mask pooler's template (the template takes {len(prefix) + len(suffix) + specials} tokens)"
            )
        return budget

    def _wrapped(
        self, tokenizer: PreTrainedTokenizerBase, bodies: Sequence[Sequence[int]], view: int, budget: int | None
    ) -> dict[str, list[list[int]]]:
        """Tokenised sentences (`bodies`) cut to `budget` and wrapped in `view`'s template and the special tokens."""
        prefix, suffix = self._template_ids(tokenizer, view)
        head, tail = self._special_ids(tokenizer)
        rows: dict[str, list[list[int]]] = {"input_ids": [], "attention_mask": []}
        with_types = "token_type_ids" in tokenizer.model_input_names
        if with_types:
            rows["token_type_ids"] = []
        for body in bodies:
            ids = head + prefix + list(body[:budget]) + suffix + tail
            rows["input_ids"].append(ids)
            rows["attention_mask"].append([1] * len(ids))
            if with_types:
                rows["token_type_ids"].append([0] * len(ids))
        return rows

    def read_positions(self, attention_mask: Tensor, input_ids: Tensor) -> Tensor | None:
        return self.mask_positions(attention_mask, input_ids)

    def mask_positions(self, attention_mask: Tensor, input_ids: Tensor) -> Tensor:
        """Each row's template mask position [B]."""
        if self.mask_token_id is None:
            raise CsekitError("the mask pooler was not given a tokenizer (SentenceEncoder binds it)")
        is_mask = (input_ids == self.mask_token_id) & attention_mask.bool()
        if not bool(is_mask.any(dim=1).all()):
            raise CsekitError("the mask pooler got an input without a mask token (tokenise through the pooler)")
        # The template's mask is the last one: a sentence may itself contain the mask token's text.
        length = input_ids.shape[1]
        return (length - 1) - is_mask.flip(dims=[1]).int().argmax(dim=1)

    def forward(self, hidden_states: Sequence[Tensor], attention_mask: Tensor, input_ids: Tensor) -> Tensor:
        states = hidden_states[-1]
        last = self.mask_positions(attention_mask, input_ids)
        return states[torch.arange(states.shape[0], device=states.device), last]


PROMPTBERT_TEMPLATES = ('This sentence of "[X]" means [MASK] .', 'This sentence : "[X]" means [MASK] .')
"""PromptBERT's unsupervised BERT templates (run.sh, `unsup-bert`): view 0 (also used at evaluation) and view 1."""


class DenoisedMaskPooler(MaskPooler):
    """PromptBERT's template denoising (Jiang et al., EMNLP 2022, section 4.2): `model.pooler: mask_denoised`.

    In training, each row's [MASK] state minus that of its template alone, h_i - h~_i: the template's ids
    without the sentence, run through the backbone with the position ids they have in the row (the part
    after the sentence shifted by its length), so the bias the template and the positions put into the
    [MASK] state is removed. As in the authors' code (`get_delta`), the template pass runs in training
    mode with gradients. At test time the pooler is the plain `mask` pooler: PromptBERT evaluates its
    unsupervised models without denoising (run.sh passes `--mask_embedding_sentence_delta` to training
    only), so a saved model records the `mask` pooler and its templates, and reloads as one.
    """

    name = "mask"  # what a saved model records: the test-time pooler (see above)

    def __init__(self, templates: Sequence[str] = PROMPTBERT_TEMPLATES, template_positions: str = "row") -> None:
        super().__init__(templates)
        if template_positions not in ("row", "from_zero"):
            raise CsekitError(f"template_positions must be row or from_zero, not {template_positions!r}")
        #: row: the template-alone pass at the positions the template has in the row (the paper); from_zero:
        #: numbered from 0 as PromptBERT's get_delta does (models.py L96-98), which on RoBERTa (whose rows
        #: start at padding_idx + 1) puts the template two positions earlier than in the row.
        self.template_positions = template_positions
        #: Denoise outside training too (`denoising()`): PromptBERT's code scores dev that way.
        self.denoise_at_test = False

    @property
    def denoises(self) -> bool:
        """Whether this pass subtracts the template's state: in training, or inside `denoising()`."""
        return self.training or self.denoise_at_test

    @contextlib.contextmanager
    def denoising(self) -> Iterator[None]:
        """Inside the block the pooler denoises in eval mode too (PromptBERT's dev evaluation during training)."""
        before, self.denoise_at_test = self.denoise_at_test, True
        try:
            yield
        finally:
            self.denoise_at_test = before

    def bind(self, tokenizer: PreTrainedTokenizerBase) -> None:
        super().bind(tokenizer)
        self._tokenizer = tokenizer

    def bind_backbone(self, backbone: nn.Module) -> None:
        object.__setattr__(self, "_backbone", backbone)  # not a submodule: the encoder owns it

    def read_positions(self, attention_mask: Tensor, input_ids: Tensor) -> Tensor | None:
        # When denoising, the template pass needs the whole input, so the encoder's one-position shortcut is off.
        return None if self.denoises else self.mask_positions(attention_mask, input_ids)

    def forward(self, hidden_states: Sequence[Tensor], attention_mask: Tensor, input_ids: Tensor) -> Tensor:
        pooled = super().forward(hidden_states, attention_mask, input_ids)
        if not self.denoises:
            return pooled
        return pooled - self.template_states(attention_mask, input_ids).to(pooled.dtype)

    def _view_of(self, row: list[int]) -> int:
        """Which template (view) a tokenised row was wrapped in."""
        head, tail = self._special_ids(self._tokenizer)
        for view in range(len(self.templates)):
            prefix, suffix = self._template_ids(self._tokenizer, view)
            end = len(row) - len(tail)
            if row[len(head) : len(head) + len(prefix)] == prefix and row[end - len(suffix) : end] == suffix:
                return view
        raise CsekitError("the mask_denoised pooler got an input without its templates (tokenise through the pooler)")

    def template_states(self, attention_mask: Tensor, input_ids: Tensor) -> Tensor:
        """Per row, the last layer at the [MASK] of its template alone, at the positions it has in the row [B, d]."""
        tokenizer, backbone = self._tokenizer, self.__dict__["_backbone"]
        head, tail = self._special_ids(tokenizer)
        lengths = attention_mask.sum(dim=1).tolist()
        keys = [(self._view_of(row[:length]), length) for row, length in zip(input_ids.tolist(), lengths, strict=True)]
        unique = sorted(set(keys))
        # RoBERTa numbers a row's positions from padding_idx + 1, BERT from 0; PromptBERT's code from 0 always.
        row_start = getattr(getattr(backbone, "embeddings", None), "padding_idx", -1) + 1
        first = row_start if self.template_positions == "row" else 0
        rows: dict[str, list[list[int]]] = {"input_ids": [], "attention_mask": [], "position_ids": []}
        reads = []
        for view, length in unique:
            prefix, suffix = self._template_ids(tokenizer, view)
            ids = head + prefix + suffix + tail
            start, sentence = len(head) + len(prefix), length - len(ids)
            rows["input_ids"].append(ids)
            rows["attention_mask"].append([1] * len(ids))
            rows["position_ids"].append([first + p + (sentence if p >= start else 0) for p in range(len(ids))])
            reads.append(start + suffix.index(int(self.mask_token_id or 0)))
        batch = {key: value.to(input_ids.device) for key, value in pad_ids(rows, tokenizer.pad_token_id or 0).items()}
        states = backbone(**batch, return_dict=True).last_hidden_state
        template = states[torch.arange(len(unique), device=states.device), torch.tensor(reads, device=states.device)]
        return template[torch.tensor([unique.index(key) for key in keys], device=states.device)]


def _mask_token_id(tokenizer: PreTrainedTokenizerBase) -> int:
    if tokenizer.mask_token is None or tokenizer.mask_token_id is None:
        raise CsekitError(
            f"the mask pooler needs a tokenizer with a mask token; {type(tokenizer).__name__} has none "
            "(use a masked-language-model backbone such as BERT or RoBERTa, or another pooler)"
        )
    return int(tokenizer.mask_token_id)


class PromptNotExported:
    """Named in the modules.json of a saved `mask` model so that sentence-transformers refuses it loudly.

    sentence-transformers tokenises raw text and cannot put a sentence inside a template, so it would
    otherwise embed a prompt model wrongly. Load such a model with `csekit.SentenceEncoder.load(path)`.
    """

    MESSAGE = (
        "this csekit model uses the prompt (mask) pooler, which sentence-transformers cannot reproduce; "
        "load it with csekit.SentenceEncoder.load(path) and call .encode(sentences)"
    )

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise CsekitError(self.MESSAGE)

    @classmethod
    def load(cls, *args: object, **kwargs: object) -> PromptNotExported:
        raise CsekitError(cls.MESSAGE)


BUILTIN: Mapping[str, type[Pooler]] = MappingProxyType(
    {
        ClsPooler.name: ClsPooler,
        MeanPooler.name: MeanPooler,
        MaxPooler.name: MaxPooler,  # sentence-transformers' max mode
        MeanSqrtLenPooler.name: MeanSqrtLenPooler,  # sentence-transformers' mean_sqrt_len_tokens mode
        FirstLastAvgPooler.name: FirstLastAvgPooler,
        MaskPooler.name: MaskPooler,
        "mask_denoised": DenoisedMaskPooler,  # PromptBERT: template denoising in training
        PoolerOutputPooler.name: PoolerOutputPooler,
        LastTokenPooler.name: LastTokenPooler,  # decoder LLMs (LLM2Vec): the EOS token's state
        WeightedMeanPooler.name: WeightedMeanPooler,  # decoder LLMs (LLM2Vec): later tokens weigh more
        PromptEOLPooler.name: PromptEOLPooler,  # decoder LLMs (PromptEOL): the last token of a one-word prompt
        MeanTextPooler.name: MeanTextPooler,  # decoder LLMs (LLM2Vec's encode): the mean without BOS
        "mean_padded": MeanPaddedPooler,  # decoder LLMs (LLM2Vec's SimCSE training): every position of the row
    }
)
"""`model.pooler` / `--pooler` names; see `POOLERS`."""

POOLERS: Registry[type[Pooler]] = Registry("pooler", BUILTIN, "pooler")
"""`model.pooler` / `--pooler`: how token states become one sentence vector."""


def make_pooler(name: str, **options: object) -> Pooler:
    """Build a pooler by name, with a one-line error that suggests the closest valid name."""
    return POOLERS.get(name)(**options)


__all__ = [
    "BUILTIN",
    "PROMPTBERT_TEMPLATES",
    "PROMPTEOL_TEMPLATE",
    "PROMPT_TEMPLATES",
    "ClsPooler",
    "DenoisedMaskPooler",
    "FirstLastAvgPooler",
    "LastTokenPooler",
    "MaskPooler",
    "MaxPooler",
    "MeanPaddedPooler",
    "MeanPooler",
    "MeanSqrtLenPooler",
    "MeanTextPooler",
    "Pooler",
    "PoolerOutputPooler",
    "PromptEOLPooler",
    "PromptNotExported",
    "TextMeanNotExported",
    "WeightedMeanPooler",
    "backbone_pooler_layer",
    "check_prompt_template",
    "last_real_positions",
    "make_pooler",
    "masked_mean",
    "pad_ids",
]

"""SLT-FAI's auxiliary terms (Wang et al.): adversarial tuning and incomplete sentence filtering.

Both are ordinary objectives added beside a contrastive one in a recipe:

* `slt_fai_at` — a similarity discriminator predicts each token's frequency label (see
  `csekit.prep.frequency`) from its last-layer state through a gradient reversal layer: the
  discriminator learns to tell high- from low-frequency tokens while the encoder, receiving the
  negated gradient, learns to make them indistinguishable (a frequency-invariant space).
* `slt_fai_isf` — a fraction `mask_rate` (epsilon) of each sentence's low-frequency words are
  replaced by the tokenizer's mask token; an information discriminator tells original from
  incomplete sentence embeddings and the encoder trains WITH it, so the embedding comes to depend
  on the (informative) low-frequency words.

Both switch on after `start_after_epochs` of training (the paper's warm-up: 0.1 epoch for SimCSE,
0.5 for ConSERT), read from `StepState.step` and `StepState.steps_per_epoch`. Before that they
return a zero tied to the discriminator's parameters without running it, so the graph stays valid
(DDP sees every parameter used) and no time is spent. The discriminators live in the objectives,
so the one optimizer trains them (an own `learning_rate` is allowed) and they never reach the
exported sentence encoder.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import PreTrainedTokenizerBase

from csekit.encoding.pooling import Pooler, pad_ids
from csekit.encoding.token_input import tokenize_texts
from csekit.parts.step_state import StepState
from csekit.prep.frequency import FrequencyLabels


class GradientReversal(torch.autograd.Function):
    """Identity forward; the backward pass multiplies the gradient by -scale (Ganin and Lempitsky)."""

    @staticmethod
    def forward(ctx: Any, inputs: Tensor, scale: float) -> Tensor:
        ctx.scale = scale
        return inputs.view_as(inputs)

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor, None]:
        return -ctx.scale * grad_output, None


def reverse_gradient(inputs: Tensor, scale: float = 1.0) -> Tensor:
    """`inputs` unchanged, with the gradient flowing back through it negated (and scaled)."""
    return GradientReversal.apply(inputs, scale)


DISCRIMINATORS = ("paper", "code")
"""`discriminator` choices: the paper's G (section 4.1: two linear layers with a ReLU between them), or the authors'
code's (wangbing1416/SLT-FAI `AdvCLSoftmaxLoss.py`: linear layers with no activation between them and a ReLU on the
two logits; `freqDiscrim` for L_AT at `--high_rank` 2, the scripts' and `main.py`'s default, `maskDiscrim` for
L_ISF)."""


CODE_FREQUENCY_RANK = 2
"""`--high_rank` of the authors' frequency discriminator: `main.py`'s default, kept by their scripts."""


class Discriminator(nn.Module):
    """Two-class logits from a vector: the paper's G, or the authors' code's stack (`DISCRIMINATORS`).

    `rank` widens the code's stack as `--high_rank` does (dim -> rank*hidden -> rank*hidden -> hidden -> 2); rank
    0 is the code's short form (dim -> hidden -> 2), `maskDiscrim`'s. The paper's form ignores it.
    """

    def __init__(self, dim: int, hidden_dim: int | None = None, form: str = "paper", rank: int = 0) -> None:
        super().__init__()
        if form not in DISCRIMINATORS:
            raise ValueError(f"discriminator must be one of {', '.join(DISCRIMINATORS)}, got {form!r}")
        hidden = hidden_dim or dim
        if form == "paper":
            self.layers = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, 2))
        elif rank:
            wide = rank * hidden
            self.layers = nn.Sequential(
                nn.Linear(dim, wide), nn.Linear(wide, wide), nn.Linear(wide, hidden), nn.Linear(hidden, 2), nn.ReLU()
            )
        else:
            self.layers = nn.Sequential(nn.Linear(dim, hidden), nn.Linear(hidden, 2), nn.ReLU())

    def forward(self, inputs: Tensor) -> Tensor:
        return self.layers(inputs)


def warmed_up(state: StepState, start_after_epochs: float) -> bool:
    """Whether the warm-up of `start_after_epochs` epochs is over (always, outside the trainer)."""
    if start_after_epochs <= 0 or state.steps_per_epoch is None:
        return True
    return state.step >= start_after_epochs * state.steps_per_epoch


def warm_up_steps(start_after_epochs: float, steps_per_epoch: int) -> int:
    """The steps done before `warmed_up` holds: the first step (counted from 0) on which a term trains."""
    return 0 if start_after_epochs <= 0 else math.ceil(start_after_epochs * steps_per_epoch)


def zero_through(module: nn.Module) -> Tensor:
    """A scalar 0 that depends on every parameter of `module` (keeps DDP's used-parameter check happy)."""
    parameters = list(module.parameters())
    total = parameters[0].sum()
    for parameter in parameters[1:]:
        total = total + parameter.sum()
    return total * 0.0


def _check_options(
    low_fraction: float, start_after_epochs: float, learning_rate: float | None, discriminator: str
) -> None:
    if not 0 < low_fraction < 1:
        raise ValueError(f"low_fraction must be in (0, 1), got {low_fraction}")
    if start_after_epochs < 0:
        raise ValueError(f"start_after_epochs must be >= 0, got {start_after_epochs}")
    if learning_rate is not None and learning_rate <= 0:
        raise ValueError(f"learning_rate must be positive, got {learning_rate}")
    if discriminator not in DISCRIMINATORS:
        raise ValueError(f"discriminator must be one of {', '.join(DISCRIMINATORS)}, got {discriminator!r}")


class AdversarialTuning(nn.Module):
    """L_AT: token-level frequency-label cross-entropy through gradient reversal.

    Averaged over each sentence's real tokens (no padding, no special tokens), then over the
    sentences of every view in `views` (all views by default: each is a sentence the encoder embeds).
    `discriminator: code` takes the authors' code's frequency discriminator instead of the paper's G.
    """

    #: The view options that index the step's inputs (not the training representations): checked at load.
    input_view_options = ("views",)
    #: The options naming a token counts file: recorded absolute when a run starts (csekit.training.recipe_paths).
    counts_options = ("counts",)

    reads_token_states = True  # the encoder keeps every position of the last layer for it

    def __init__(
        self,
        dim: int,
        tokenizer: PreTrainedTokenizerBase,
        counts: str,
        low_fraction: float = 0.5,
        hidden_dim: int | None = None,
        learning_rate: float | None = None,
        start_after_epochs: float = 0.0,
        reversal_scale: float = 1.0,
        views: list[int] | None = None,
        discriminator: str = "paper",
    ) -> None:
        super().__init__()
        _check_options(low_fraction, start_after_epochs, learning_rate, discriminator)
        self.frequency = FrequencyLabels.from_counts(counts, tokenizer, low_fraction)
        self.discriminator = Discriminator(dim, hidden_dim, discriminator, rank=CODE_FREQUENCY_RANK)
        self.learning_rate = learning_rate
        self.start_after_epochs = start_after_epochs
        self.reversal_scale = reversal_scale
        self.views = views

    def first_active_step(self, steps_per_epoch: int) -> int:
        """After the warm-up (the trainer warns when a run ends before it; `csekit.parts.hooks.StartsLater`)."""
        return warm_up_steps(self.start_after_epochs, steps_per_epoch)

    def forward(self, state: StepState) -> dict[str, Tensor]:
        if not warmed_up(state, self.start_after_epochs):
            return {"slt_fai_at": zero_through(self.discriminator)}
        output = state.encoder_output
        tokens, ids, mask = output.token_states, output.input_ids, output.attention_mask
        if self.views is not None:
            n = state.batch_size
            rows = torch.cat([torch.arange(v * n, (v + 1) * n, device=ids.device) for v in self.views])
            tokens, ids, mask = tokens[rows], ids[rows], mask[rows]
        real = mask.bool() & ~self.frequency.is_special(ids)
        logits = self.discriminator(reverse_gradient(tokens, self.reversal_scale)).float()
        per_token = F.cross_entropy(logits.flatten(0, 1), self.frequency(ids).flatten(), reduction="none")
        per_token = per_token.view(ids.shape) * real
        counts = real.sum(dim=1)
        has_tokens = counts > 0
        if not bool(has_tokens.any()):
            return {"slt_fai_at": zero_through(self.discriminator) + tokens.sum() * 0.0}
        per_sentence = per_token.sum(dim=1)[has_tokens] / counts[has_tokens]
        return {"slt_fai_at": per_sentence.mean()}


def mask_low_frequency_words(
    input_ids: Tensor,
    word_index: Tensor,
    low_token: Tensor,
    rate: float,
    mask_token_id: int,
    generator: torch.Generator | None = None,
    min_words: int = 0,
) -> tuple[Tensor, Tensor]:
    """Mask a fraction `rate` of each sentence's low-frequency words, every piece of a chosen word.

    `word_index` [n, L] gives each token's word in its sentence (-1 for special tokens and padding),
    `low_token` [n, L] whether a token is low-frequency. A word is low-frequency when any of its
    pieces is. Each sentence with m such words masks k = floor(rate * m + u) of them, u ~ U(0, 1)
    (stochastic rounding: exactly `rate` in expectation, even for sentences with one or two rare
    words), chosen uniformly without replacement; `min_words` raises k to at least that many (as far
    as the sentence has them). Returns the masked ids and the masked positions.
    """
    valid = word_index >= 0
    if not bool(valid.any()):
        return input_ids.clone(), torch.zeros_like(input_ids, dtype=torch.bool)
    n = input_ids.shape[0]
    words = int(word_index.max()) + 1
    index = word_index.clamp(min=0)
    low_word = torch.zeros(n, words, dtype=torch.long).scatter_add_(1, index, (low_token & valid).long()) > 0
    low_count = low_word.sum(dim=1)
    take = torch.floor(rate * low_count + torch.rand(n, generator=generator)).long()
    take = torch.maximum(take, torch.full_like(take, min_words)).minimum(low_count)
    scores = torch.rand(n, words, generator=generator).masked_fill(~low_word, 2.0)
    rank = scores.argsort(dim=1).argsort(dim=1)
    chosen = low_word & (rank < take.unsqueeze(1))
    masked = chosen.gather(1, index) & valid
    return input_ids.masked_fill(masked, mask_token_id), masked


def _mask_token_id(tokenizer: PreTrainedTokenizerBase, mask_token: str | None) -> int:
    """The tokenizer's own mask token, else `mask_token` (a decoder LLM's tokenizer has none: "_" as LLM2Vec's MNTP)."""
    if tokenizer.mask_token_id is not None:
        return int(tokenizer.mask_token_id)
    if mask_token is None:
        raise ValueError(
            "slt_fai_isf masks words with the tokenizer's mask token, and the tokenizer of model.backbone has none; "
            'set mask_token (a token of its vocabulary, e.g. "_" as LLM2Vec\'s MNTP) or drop this objective'
        )
    token_id = tokenizer.convert_tokens_to_ids(mask_token)
    if not isinstance(token_id, int) or (token_id == tokenizer.unk_token_id and mask_token != tokenizer.unk_token):
        raise ValueError(f"slt_fai_isf: the mask token {mask_token!r} is not in the tokenizer's vocabulary")
    return int(token_id)


class IncompleteSentenceFiltering(nn.Module):
    """L_ISF (Eq. 6): (1/N) sum_i CE(G(h_incomplete_i), 1) + CE(G(h_i), 0), over all N sentences.

    The sentences are re-tokenised here with the fast tokenizer to know word boundaries
    (`word_ids`). When that tokenisation equals view `view`'s ids (plain poolers), the original
    embedding is that view's pooled vector from the main pass; otherwise the originals are encoded
    again beside the incomplete sentences. Every sentence has an incomplete version, encoded in its
    own pass: a sentence with no masked word is its own incomplete version, as in the paper's Eq. 6
    and the authors' code (both average over the whole batch). With counts from a small corpus few
    sentences hold a low-frequency word at all, and epsilon = 0.2 of one or two words often rounds to
    none: `min_masked_words: 1` then masks at least one word in every sentence that has one (above
    the paper's rate; off by default). `mask_token` is used only where the tokenizer has no mask token of its
    own (a decoder LLM's). `discriminator: code` takes the authors' code's information discriminator.
    """

    #: The view options that index the step's inputs (not the training representations): checked at load.
    input_view_options = ("view",)
    #: The options naming a token counts file: recorded absolute when a run starts (csekit.training.recipe_paths).
    counts_options = ("counts",)

    def __init__(
        self,
        dim: int,
        tokenizer: PreTrainedTokenizerBase,
        max_length: int,
        counts: str,
        low_fraction: float = 0.5,
        mask_rate: float = 0.2,
        hidden_dim: int | None = None,
        learning_rate: float | None = None,
        start_after_epochs: float = 0.0,
        view: int = 0,
        min_masked_words: int = 0,
        pooler: Pooler | None = None,
        mask_token: str | None = None,
        discriminator: str = "paper",
    ) -> None:
        super().__init__()
        _check_options(low_fraction, start_after_epochs, learning_rate, discriminator)
        if pooler is not None and pooler.view_dependent:
            raise ValueError(
                f'slt_fai_isf re-tokenises the plain sentences, so it cannot yet be combined with the "{pooler.name}" '
                "pooler (a prompt template would be lost); use cls, mean or first_last_avg"
            )
        if not 0 < mask_rate <= 1:
            raise ValueError(f"mask_rate must be in (0, 1], got {mask_rate}")
        if min_masked_words < 0:
            raise ValueError(f"min_masked_words must be >= 0, got {min_masked_words}")
        self.mask_token_id = _mask_token_id(tokenizer, mask_token)
        if not tokenizer.is_fast:
            raise ValueError("slt_fai_isf needs a fast tokenizer (word_ids) to find word boundaries")
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.frequency = FrequencyLabels.from_counts(counts, tokenizer, low_fraction)
        self.discriminator = Discriminator(dim, hidden_dim, discriminator)
        self.mask_rate = mask_rate
        self.learning_rate = learning_rate
        self.start_after_epochs = start_after_epochs
        self.view = view
        self.min_masked_words = min_masked_words

    def first_active_step(self, steps_per_epoch: int) -> int:
        """After the warm-up (the trainer warns when a run ends before it; `csekit.parts.hooks.StartsLater`)."""
        return warm_up_steps(self.start_after_epochs, steps_per_epoch)

    def tokenize(self, sentences: list[str]) -> tuple[dict[str, Tensor], Tensor]:
        """Padded inputs of the sentences and each token's word index [n, L] (-1: special or padding)."""
        encoded = tokenize_texts(
            self.tokenizer, sentences, self.max_length, truncation=True, max_length=self.max_length
        )
        inputs = pad_ids({key: list(value) for key, value in encoded.items()}, self.tokenizer.pad_token_id or 0)
        word_index = torch.full_like(inputs["input_ids"], -1)
        for row in range(len(sentences)):
            ids = [-1 if word is None else word for word in encoded.word_ids(row)]
            word_index[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        return inputs, word_index

    def make_incomplete(self, sentences: list[str]) -> tuple[dict[str, Tensor], Tensor, Tensor]:
        """Original inputs, their incomplete ids, and the masked positions (all on the CPU)."""
        inputs, word_index = self.tokenize(sentences)
        ids = inputs["input_ids"]
        labels = self.frequency.labels.cpu()[ids]
        low = (labels == 1) & ~self.frequency.special.cpu()[ids] & inputs["attention_mask"].bool()
        masked_ids, masked = mask_low_frequency_words(ids, word_index, low, self.mask_rate, self.mask_token_id)
        return inputs, masked_ids, masked

    def forward(self, state: StepState) -> dict[str, Tensor]:
        device = state.embeddings[0].device
        if not warmed_up(state, self.start_after_epochs):
            return {"slt_fai_isf": zero_through(self.discriminator)}
        inputs, masked_ids, _ = self.make_incomplete(state.sentences)
        original = self._view_features(state, inputs)
        batch = {key: value.to(device) for key, value in inputs.items()}
        if original is None:  # encode originals and incomplete sentences in one pass
            both = {key: torch.cat([value, value]) for key, value in batch.items()}
            both["input_ids"] = torch.cat([batch["input_ids"], masked_ids.to(device)])
            pooled = state.encoder(both, token_states=False).pooled
            original, incomplete = pooled.chunk(2)
        else:
            batch["input_ids"] = masked_ids.to(device)
            incomplete = state.encoder(batch, token_states=False).pooled
        logits = self.discriminator(torch.cat([incomplete, original])).float()
        k = incomplete.shape[0]
        targets = torch.cat([torch.ones(k, dtype=torch.long), torch.zeros(k, dtype=torch.long)]).to(device)
        per_sentence = F.cross_entropy(logits, targets, reduction="none")
        return {"slt_fai_isf": per_sentence[:k].mean() + per_sentence[k:].mean()}

    def _view_features(self, state: StepState, inputs: dict[str, Tensor]) -> Tensor | None:
        """View `view`'s pooled vectors if that view holds exactly these token ids, else None."""
        n = state.batch_size
        rows = slice(self.view * n, (self.view + 1) * n)
        ids = state.encoder_output.input_ids[rows].cpu()
        mask = state.encoder_output.attention_mask[rows].cpu()
        ours, our_mask = inputs["input_ids"], inputs["attention_mask"]
        if ids.shape[0] != ours.shape[0] or ids.shape[1] < ours.shape[1] or mask[:, ours.shape[1] :].any():
            return None
        same = torch.equal(mask[:, : ours.shape[1]], our_mask) and torch.equal(
            ids[:, : ours.shape[1]] * mask[:, : ours.shape[1]], ours * our_mask
        )
        return state.features[self.view] if same else None

"""MNTP: masked next-token prediction (LLM2Vec, BehnamGhader et al., 2024), a decoder's adaptation to bidirectional
attention.

Some tokens of the sentence are chosen, replaced, and each chosen token is predicted from the output of the position
BEFORE it, through the model's own LM head (a decoder's pre-trained head predicts the next token there). As LLM2Vec's
`run_mntp.py`: each real token that is not a special one (the mask token counts as one, as the tokenizer LLM2Vec
gives it) is chosen with `probability`, then replaced as its `data_collator_type` says, `masking` here:

* `bert` (its `default`, transformers' `DataCollatorForLanguageModeling`; LLM2Vec's Llama-family configurations,
  probability 0.2): 80% of the chosen tokens become the mask token, 10% a random token of the tokenizer's
  vocabulary, 10% stay as they are;
* `all` (its `all_mask`, `DataCollatorForLanguageModelingWithFullMasking`; its Mistral configuration, probability
  0.8): every chosen token becomes the mask token.

The draws are the collator's, in its order (Bernoulli draws of the chosen tokens, then of the replaced ones, then
of the random ones among the rest, then the random tokens), so from one seed on the CPU the masks are those of the
authors' collator (tests/methods/test_llm2vec_fidelity.py). The mask token is the tokenizer's own, else `mask_token`
("_", LLM2Vec's `blank`); the loss is the mean cross-entropy over chosen tokens (position 0 has no previous position
and is never a target). The objective runs its own encoder pass on the masked ids of view `view`; it composes with
any other objective (MNTP + SimCSE in one run by weights), or a run of MNTP alone saves a model that a SimCSE run
loads.

The LM head: the input embeddings where the config ties them (Gemma, small Qwen2s), else the checkpoint's LM head,
loaded once through csekit's model loading (the causal-LM model is read and all but its head dropped). It trains
(`train_lm_head: true`, the default) as in LLM2Vec, whose head sits outside the LoRA-wrapped model (`LlamaBiForMNTP`:
`get_peft_model` wraps `.model` only, so the head keeps `requires_grad`); `train_lm_head: false` freezes it. A tied
head is the input embeddings, which train only where the backbone's weights do (not under LoRA, as in LLM2Vec).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import PreTrainedTokenizerBase

from csekit.core.errors import CsekitError
from csekit.encoding.encoder import SentenceEncoder
from csekit.encoding.model_folder import load_model, quiet_transformers
from csekit.parts.step_state import StepState

IGNORED = -100
"""The label of an unmasked position (no loss), as transformers' losses."""
MASKINGS = ("bert", "all")
"""`masking` choices: BERT's 80/10/10 replacement (LLM2Vec's `default`) or always the mask token (`all_mask`)."""
BERT_REPLACED, BERT_RANDOM = 0.8, 0.5
"""transformers' collator: 80% of the chosen tokens become the mask token, then half of the rest a random token."""


def load_lm_head(backbone: nn.Module) -> nn.Module | None:
    """The backbone's untied LM head (Linear hidden -> vocabulary) from its checkpoint; None where the config ties it
    to the input embeddings. A backbone built in memory (no checkpoint) gets a new head initialised at random."""
    from transformers import AutoModelForCausalLM

    config = backbone.config
    if getattr(config, "tie_word_embeddings", False):
        return None
    location = str(getattr(config, "_name_or_path", "") or "")
    with quiet_transformers():
        if location:
            try:
                model = load_model(location, AutoModelForCausalLM).model
            except CsekitError as error:  # a folder of the encoder alone (csekit saves no LM head)
                raise CsekitError(f"mntp predicts tokens with the backbone's LM head, which {error}") from None
        else:
            model = AutoModelForCausalLM.from_config(config)
    head = model.get_output_embeddings()
    if not isinstance(head, nn.Linear):
        raise ValueError(f"mntp: {type(model).__name__} has no linear LM head")
    return head


def mntp_loss(states: Tensor, output_weight: Tensor, input_ids: Tensor, masked: Tensor) -> Tensor:
    """Mean cross-entropy of each masked token (`masked` [B, L]) predicted from the previous position's state."""
    labels = torch.where(masked[:, 1:], input_ids[:, 1:], torch.full_like(input_ids[:, 1:], IGNORED))
    logits = F.linear(states[:, :-1], output_weight)
    if not bool((labels != IGNORED).any()):
        return logits.sum() * 0.0  # nothing masked in this batch: a zero with the graph's gradient
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1), ignore_index=IGNORED)


class MaskedNextTokenPrediction(nn.Module):
    """LLM2Vec's MNTP loss on view `view`'s token ids (see the module's docstring)."""

    def __init__(
        self,
        encoder: SentenceEncoder,
        tokenizer: PreTrainedTokenizerBase,
        probability: float = 0.2,
        mask_token: str = "_",
        view: int = 0,
        train_lm_head: bool = True,
        masking: str = "all",
    ) -> None:
        super().__init__()
        if not 0 < probability < 1:
            raise ValueError(f"mntp: probability must be in (0, 1), got {probability}")
        if masking not in MASKINGS:
            raise ValueError(f"mntp: masking must be one of {', '.join(MASKINGS)}, got {masking!r}")
        token = tokenizer.mask_token if tokenizer.mask_token is not None else mask_token
        token_id = tokenizer.convert_tokens_to_ids(token)
        if not isinstance(token_id, int) or (token_id == tokenizer.unk_token_id and token != tokenizer.unk_token):
            raise ValueError(f"mntp: the mask token {token!r} is not in the tokenizer's vocabulary; set mask_token")
        self.mask_token_id = int(token_id)
        # The mask token is special to LLM2Vec's tokenizer (it sets tokenizer.mask_token): never chosen itself.
        self.special_ids = torch.tensor(sorted({*tokenizer.all_special_ids, self.mask_token_id}), dtype=torch.long)
        self.vocabulary_size = len(tokenizer)  # the collator's random tokens: randint(len(tokenizer))
        self.masking = masking
        self.probability = float(probability)
        self.view = view
        self.lm_head = load_lm_head(encoder.backbone)
        if self.lm_head is not None:
            self.lm_head.requires_grad_(train_lm_head)
        #: The tied case reads the encoder's input embeddings (not a submodule: the encoder owns them).
        object.__setattr__(self, "_embeddings", encoder.backbone.get_input_embeddings())

    def output_weight(self) -> Tensor:
        """The LM head's matrix [vocabulary, hidden]."""
        return self.lm_head.weight if self.lm_head is not None else self._embeddings.weight

    def mask(self, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor]:
        """Masked ids and where tokens were chosen [B, L]: each real, non-special token with `probability`, replaced
        as `masking` says, drawn as transformers' collator draws (the module's docstring)."""
        shape, device = input_ids.shape, input_ids.device
        candidates = attention_mask.bool() & ~torch.isin(input_ids, self.special_ids.to(device))
        probabilities = torch.full(shape, self.probability, device=device).masked_fill_(~candidates, 0.0)
        chosen = torch.bernoulli(probabilities).bool()
        if self.masking == "all":
            return torch.where(chosen, torch.full_like(input_ids, self.mask_token_id), input_ids), chosen
        replaced = torch.bernoulli(torch.full(shape, BERT_REPLACED, device=device)).bool() & chosen
        masked_ids = torch.where(replaced, torch.full_like(input_ids, self.mask_token_id), input_ids)
        randomised = torch.bernoulli(torch.full(shape, BERT_RANDOM, device=device)).bool() & chosen & ~replaced
        words = torch.randint(self.vocabulary_size, shape, dtype=torch.long, device=device)
        return torch.where(randomised, words, masked_ids), chosen

    def forward(self, state: StepState) -> dict[str, Tensor]:
        output, rows = state.encoder_output, state.batch_size
        ids = output.input_ids[self.view * rows : (self.view + 1) * rows]
        attention_mask = output.attention_mask[self.view * rows : (self.view + 1) * rows]
        masked_ids, masked = self.mask(ids, attention_mask)
        states = state.encoder({"input_ids": masked_ids, "attention_mask": attention_mask}).token_states
        return {"mntp": mntp_loss(states, self.output_weight(), ids, masked)}

    def extra_repr(self) -> str:
        return (
            f"probability={self.probability}, masking={self.masking}, mask_token_id={self.mask_token_id}, "
            f"view={self.view}"
        )


__all__ = ["MaskedNextTokenPrediction", "load_lm_head", "mntp_loss"]

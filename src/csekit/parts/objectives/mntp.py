"""MNTP: masked next-token prediction (LLM2Vec, BehnamGhader et al., 2024), a decoder's adaptation to bidirectional
attention.

Some tokens of the sentence are replaced by a mask token and each masked token is predicted from the output of the
position BEFORE it, through the model's own LM head (a decoder's pre-trained head predicts the next token there).
As LLM2Vec's `run_mntp.py`: each real, non-special token is masked with `probability` (0.2), always by the mask
token (no random or kept tokens); the mask token is the tokenizer's own, else `mask_token` ("_", LLM2Vec's
`blank`); the loss is the mean cross-entropy over masked tokens (position 0 has no previous position and is never
a target). The objective runs its own encoder pass on the masked ids of view `view`; it composes with any other
objective (MNTP + SimCSE in one run by weights), or a run of MNTP alone saves a model that a SimCSE run loads.

The LM head: the input embeddings where the config ties them (Gemma, small Qwen2s), else the checkpoint's LM head,
loaded once through csekit's model loading (the causal-LM model is read and all but its head dropped), frozen
unless `train_lm_head` (LoRA never adapts it: peft's all-linear leaves the output layer out).
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
        train_lm_head: bool = False,
    ) -> None:
        super().__init__()
        if not 0 < probability < 1:
            raise ValueError(f"mntp: probability must be in (0, 1), got {probability}")
        token = tokenizer.mask_token if tokenizer.mask_token is not None else mask_token
        token_id = tokenizer.convert_tokens_to_ids(token)
        if not isinstance(token_id, int) or (token_id == tokenizer.unk_token_id and token != tokenizer.unk_token):
            raise ValueError(f"mntp: the mask token {token!r} is not in the tokenizer's vocabulary; set mask_token")
        self.mask_token_id = int(token_id)
        self.special_ids = torch.tensor(sorted(set(tokenizer.all_special_ids)), dtype=torch.long)
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
        """Masked ids and where they were masked [B, L]: each real, non-special token with `probability`."""
        candidates = attention_mask.bool() & ~torch.isin(input_ids, self.special_ids.to(input_ids.device))
        draw = torch.rand(input_ids.shape, device=input_ids.device)
        masked = candidates & (draw < self.probability)
        return torch.where(masked, torch.full_like(input_ids, self.mask_token_id), input_ids), masked

    def forward(self, state: StepState) -> dict[str, Tensor]:
        output, rows = state.encoder_output, state.batch_size
        ids = output.input_ids[self.view * rows : (self.view + 1) * rows]
        attention_mask = output.attention_mask[self.view * rows : (self.view + 1) * rows]
        masked_ids, masked = self.mask(ids, attention_mask)
        states = state.encoder({"input_ids": masked_ids, "attention_mask": attention_mask}).token_states
        return {"mntp": mntp_loss(states, self.output_weight(), ids, masked)}

    def extra_repr(self) -> str:
        return f"probability={self.probability}, mask_token_id={self.mask_token_id}, view={self.view}"


__all__ = ["MaskedNextTokenPrediction", "load_lm_head", "mntp_loss"]

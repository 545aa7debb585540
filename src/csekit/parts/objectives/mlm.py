"""SimCSE's MLM auxiliary objective (Gao et al., 2021, Appendix; `--do_mlm` in princeton-nlp/SimCSE):
`objectives: [{name: infonce}, {name: mlm, weight: 0.1}]`.

As SimCSE's code computes it (train.py's collator `mask_tokens`, simcse/models.py `cl_forward`): each view's tokens
are masked as BERT's MLM masks them (`mask_ratio`, the code's `mlm_probability`, 0.15), the trained encoder reads
the masked rows in a second pass (dropout on), and an LM head predicts the chosen tokens; the loss is the
cross-entropy at the chosen positions only, weighted by the recipe's `weight` (the code's `mlm_weight`, 0.1).

The LM head is the backbone's own pre-trained one, loaded from the backbone's checkpoint (the code's `lm_head`:
BERT's `cls.predictions`, RoBERTa's `lm_head`), trained, its output matrix a copy of the word embeddings, not
the encoder's own (the code's head is tied to nothing). It is in the checkpoint, not the saved model. The rows
are masked sentence by sentence, views inside, from a generator seeded by the run's seed and the batch's
sentences.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import PreTrainedTokenizerBase

from csekit.encoding.encoder import SentenceEncoder
from csekit.encoding.model_folder import load_model
from csekit.parts.objectives.masking import by_sentence, mask_tokens
from csekit.parts.step_state import StepState
from csekit.parts.views.repetition import batch_generator

HEAD_ATTRIBUTES = ("cls", "lm_head")
"""Where transformers' masked-LM classes keep their LM head: BERT's family `cls`, RoBERTa's family `lm_head`."""


def load_lm_head(backbone: nn.Module) -> nn.Module:
    """The backbone's pre-trained LM head, from its checkpoint (from its config alone when it was built in memory).
    A model type without such a head raises ValueError naming it."""
    from transformers import AutoModelForMaskedLM
    from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES

    config = copy.deepcopy(backbone.config)
    if config.model_type not in MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        raise ValueError(
            f"mlm needs the backbone's LM head, and transformers has no masked-LM model for model type "
            f"{config.model_type!r}: choose another model.backbone"
        )
    location = str(getattr(config, "_name_or_path", "") or "")
    if location:  # checked as every model load; a checkpoint without an LM head gets a new one
        model = load_model(location, AutoModelForMaskedLM, config=config, new_weights=True).model
    else:
        model = AutoModelForMaskedLM.from_config(config)
    head = next((getattr(model, name) for name in HEAD_ATTRIBUTES if hasattr(model, name)), None)
    if not isinstance(head, nn.Module):
        raise ValueError(
            f"mlm needs the backbone's LM head, and model type {config.model_type!r} keeps none as "
            f"{' or '.join(HEAD_ATTRIBUTES)}: choose another model.backbone"
        )
    return head  # its output matrix is the loaded copy's, apart from the encoder's embeddings (as the code's)


class MaskedLanguageModeling(nn.Module):
    """SimCSE's MLM auxiliary loss (see the module docstring). mask_ratio: the code's `mlm_probability`.

    `encoder`, `tokenizer` and `seed` are build arguments."""

    def __init__(
        self, encoder: SentenceEncoder, tokenizer: PreTrainedTokenizerBase, mask_ratio: float = 0.15, seed: int = 0
    ) -> None:
        super().__init__()
        if not 0.0 < mask_ratio < 1.0:
            raise ValueError(f"option mask_ratio must be between 0 and 1 (got {mask_ratio})")
        if tokenizer.mask_token_id is None:
            raise ValueError("mlm masks sentences: the backbone's tokenizer needs a mask token")
        if encoder.pooler.view_dependent:
            raise ValueError(f"mlm masks the bare sentence: use a pooler without a template, not {encoder.pooler.name}")
        #: The code's `lm_head`, trained.
        self.lm_head = load_lm_head(encoder.backbone)
        self.mask_ratio = float(mask_ratio)
        self.seed = int(seed)
        self.mask_token_id = int(tokenizer.mask_token_id)
        self.vocab_len = len(tokenizer)
        self.special_ids = torch.tensor(sorted(set(tokenizer.all_special_ids)), dtype=torch.long)

    def forward(self, state: StepState) -> dict[str, Tensor]:
        output, views = state.encoder_output, state.num_views
        ids, attention_mask = by_sentence(output.input_ids, views), by_sentence(output.attention_mask, views)
        cpu_ids = ids.cpu()
        generator = batch_generator(self.seed, ["mlm", *state.sentences])
        special = torch.isin(cpu_ids, self.special_ids)
        masked, chosen = mask_tokens(cpu_ids, special, self.mask_ratio, self.mask_token_id, self.vocab_len, generator)
        labels = cpu_ids.masked_fill(~chosen, -100).to(ids.device)
        inputs: dict[str, Any] = {"input_ids": masked.to(ids.device), "attention_mask": attention_mask}
        states = state.encoder(inputs, token_states=True).token_states
        scores = self.lm_head(states)
        return {"mlm": F.cross_entropy(scores.reshape(-1, scores.shape[-1]).float(), labels.reshape(-1))}

    def extra_repr(self) -> str:
        return f"mask_ratio={self.mask_ratio}"

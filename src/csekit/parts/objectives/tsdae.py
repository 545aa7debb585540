"""TSDAE's reconstruction loss (Wang, Reimers and Gurevych, Findings of EMNLP 2021): `objectives: [{name: tsdae}]`.

A decoder sees only the sentence vector of the noisy view (cross-attention to one position) and predicts the
clean sentence token by token; the loss is the cross-entropy of its next-token predictions, pads ignored.
This is sentence-transformers' `DenoisingAutoEncoderLoss` as csekit parts: the noise is the `deletion`
views part, and the decoder is this objective's own module, trained by the run's optimizer with the encoder.

The decoder is the backbone's causal-LM class (BERT's `BertLMHeadModel`) with cross-attention, loaded from
the encoder's checkpoint as sentence-transformers loads it (its LM head from the checkpoint where it has one;
the cross-attention new). With `tie_encoder_decoder` (the default, as sentence-transformers') every decoder
weight that the encoder has is the encoder's own parameter: sentence-transformers points the encoder at the
decoder's, csekit the decoder at the encoder's (the encoder stays as built); both start from the same
checkpoint, so the values and the sharing are the same. A backbone without such a class, or whose class has
no cross-attention (OPT, Llama), is refused in one line.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import PreTrainedTokenizerBase

from csekit.encoding.encoder import SentenceEncoder
from csekit.encoding.model_folder import load_model, quiet_transformers
from csekit.parts.step_state import StepState


def load_decoder(backbone: nn.Module) -> Any:
    """The backbone's causal-LM model with cross-attention, from the backbone's checkpoint (from its config alone
    when it was built in memory). A model type without one raises ValueError naming it."""
    from transformers import AutoModelForCausalLM
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    config = copy.deepcopy(backbone.config)
    if config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ValueError(
            f"tsdae needs a decoder of the backbone's kind, and transformers has no causal-LM model for model type "
            f"{config.model_type!r} (BERT, RoBERTa and ELECTRA have one, with cross-attention): choose another "
            "model.backbone"
        )
    config.is_decoder, config.add_cross_attention, config.output_hidden_states = True, True, False
    location = str(getattr(config, "_name_or_path", "") or "")
    with quiet_transformers():
        if location:  # checked as every model load (csekit.encoding.model_folder.load_model)
            decoder = load_model(location, AutoModelForCausalLM, config=config, new_weights=True).model
        else:
            decoder = AutoModelForCausalLM.from_config(config)
    if not any("crossattention" in name.replace("_", "") for name, _ in decoder.named_parameters()):
        raise ValueError(
            f"tsdae needs a decoder that attends to the sentence vector, and transformers' causal-LM model for "
            f"model type {config.model_type!r} ({type(decoder).__name__}) has no cross-attention: choose another "
            "model.backbone"
        )
    return decoder


def tie_decoder_to_encoder(decoder: Any, backbone: nn.Module) -> int:
    """Make every decoder weight whose name and shape the encoder's backbone shares the encoder's parameter; the
    number tied. The LM head's output matrix follows the word embeddings where the decoder ties them."""
    base = getattr(decoder, decoder.base_model_prefix)
    output = decoder.get_output_embeddings()
    embeddings = base.get_input_embeddings().weight
    output_tied = output is not None and output.weight is embeddings
    shared = dict(backbone.named_parameters())
    tied = 0
    for module_name, module in base.named_modules():
        for attr, param in list(module.named_parameters(recurse=False)):
            own = shared.get(f"{module_name}.{attr}" if module_name else attr)
            if own is not None and own.shape == param.shape:
                setattr(module, attr, own)
                tied += 1
    if output_tied:
        output.weight = base.get_input_embeddings().weight
    return tied


class DenoisingReconstruction(nn.Module):
    """TSDAE's loss: the decoder reconstructs the clean sentence from view `view`'s pooled vector.

    `encoder`, `tokenizer`, `pooler`, `max_length` are build arguments; the target is the clean sentence
    tokenised as the encoder's input is (the recipe's `max_length`), teacher-forced: input ids[:-1], labels
    ids[1:], no decoder attention mask (as sentence-transformers), pads ignored in the loss.
    """

    def __init__(
        self,
        encoder: SentenceEncoder,
        tokenizer: PreTrainedTokenizerBase,
        max_length: int,
        view: int = 0,
        tie_encoder_decoder: bool = True,
    ) -> None:
        super().__init__()
        if encoder.pooler.view_dependent:
            raise ValueError(
                f"tsdae reconstructs the bare sentence: use a pooler without a template, not {encoder.pooler.name}"
            )
        self.decoder = load_decoder(encoder.backbone)
        if int(self.decoder.config.hidden_size) != int(encoder.backbone.config.hidden_size):
            raise ValueError("tsdae: the decoder's hidden size is not the encoder's")
        if tie_encoder_decoder and tie_decoder_to_encoder(self.decoder, encoder.backbone) == 0:
            raise ValueError(
                "tsdae: no decoder weight matches the encoder's (tie_encoder_decoder needs one architecture)"
            )
        self.tokenizer = tokenizer
        self.pooler = encoder.pooler
        self.max_length = max_length
        self.view = view
        self.pad_token_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)

    def forward(self, state: StepState) -> dict[str, Tensor]:
        vectors = state.features[self.view]
        target = self.pooler.tokenize(self.tokenizer, state.sentences, self.max_length)["input_ids"]
        target = target.to(vectors.device)
        logits = self.decoder(
            input_ids=target[:, :-1],
            attention_mask=None,
            encoder_hidden_states=vectors[:, None],
            encoder_attention_mask=torch.ones(vectors.shape[0], 1, dtype=torch.long, device=vectors.device),
            use_cache=False,
        ).logits
        labels = target[:, 1:]
        loss = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1), ignore_index=self.pad_token_id
        )
        return {"tsdae": loss}

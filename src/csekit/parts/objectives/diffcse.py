"""DiffCSE's conditional replaced-token detection (Chuang et al., NAACL 2022): `objectives: [{name: diffcse}]`.

Beside SimCSE's InfoNCE (a second objective of the recipe), each view of each sentence is edited and a
discriminator, told the sentence vector, says which tokens were edited. As the authors' code does it
(voidism/DiffCSE: train.py's collator `mask_tokens`, diffcse/models.py `cl_forward`, modeling_bert.py `cls_input`):

1. mask: every token but the special ones is chosen with probability `mask_ratio`; a chosen token becomes the
   mask token (80%), a random token of the vocabulary (half the rest) or stays (the rest): BERT's MLM masking;
2. edit: a frozen MLM `generator` (DistilBERT in the paper) reads the masked sentence and every position takes
   its most likely token (argmax: the code does not sample), the first position the [CLS] token;
3. label: a position is "replaced" where the edit differs from the view's token (at any position, masked or
   not; padding counts as not replaced);
4. detect: the discriminator (a trained copy of the backbone as it starts, the code's `discriminator` loaded
   with the pre-trained weights) reads the edit with its first position's embedding output replaced by the
   view's training representation (after the head: the code's `before_mlp` is off), and a Linear(d, 2) head
   scores each position; the loss is the cross-entropy over every position of every row, padding included
   (the code's `CrossEntropyLoss` over `view(-1, 2)`), weighted by the recipe's `weight` (lambda).

The rows are laid out sentence by sentence, views inside (the code's `[batch, num_sent]` flattened), so the
mask draws follow the code's order. The draws come from a generator seeded by the run's seed and the batch's
sentences (the code's collator draws from torch's global one), so a resumed run masks a batch as the first
run did. The generator runs with dropout while training (it is a submodule of the code's model, in train mode)
and is frozen and kept in no state dict, checkpoint, optimizer or saved model; the discriminator and its
head train with the encoder and are in the checkpoint, not the saved model. The generator must share the
backbone's vocabulary (distilbert-base-uncased for BERT uncased and MiniLM, distilroberta-base for RoBERTa).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import PreTrainedTokenizerBase

from csekit.core.errors import CsekitError
from csekit.encoding.encoder import SentenceEncoder
from csekit.encoding.model_folder import load_model
from csekit.parts.objectives.masking import by_sentence, mask_tokens
from csekit.parts.step_state import StepState
from csekit.parts.views.repetition import batch_generator


def load_generator(name: str, tokenizer: PreTrainedTokenizerBase, vocab_rows: int) -> Any:
    """The frozen MLM generator `name`, checked to share the backbone's vocabulary (ValueError naming the option)."""
    from transformers import AutoModelForMaskedLM

    try:
        loaded = load_model(name, AutoModelForMaskedLM, aliases=False)
    except CsekitError as error:
        raise ValueError(f"generator: {error}") from None
    if loaded.tokenizer.get_vocab() != tokenizer.get_vocab():
        raise ValueError(
            f"generator: {name}'s vocabulary is not the backbone's; DiffCSE's generator writes the backbone's token "
            "ids (distilbert-base-uncased for BERT uncased and MiniLM, distilroberta-base for RoBERTa)"
        )
    generator = loaded.model
    if int(generator.config.vocab_size) > vocab_rows:
        raise ValueError(
            f"generator: {name} predicts {generator.config.vocab_size} tokens, the backbone has {vocab_rows}"
        )
    return generator.requires_grad_(False)


class ReplacedTokenDetection(nn.Module):
    """DiffCSE's conditional ELECTRA loss (see the module docstring).

    generator: the MLM that edits (a hub name or model folder); mask_ratio: the code's `masking_ratio` (0.30
    in its run script). `encoder`, `tokenizer` and `seed` are build arguments.
    """

    #: The options naming a model (a folder, an alias or a hub name): a folder is recorded absolute when a run starts
    #: (csekit.training.recipe_paths).
    model_options = ("generator",)

    def __init__(
        self,
        encoder: SentenceEncoder,
        tokenizer: PreTrainedTokenizerBase,
        generator: str | None = None,
        mask_ratio: float = 0.3,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if generator is None:
            raise ValueError(
                "option generator is required: the MLM that edits the sentences (DiffCSE: distilbert-base-uncased "
                "for BERT, distilroberta-base for RoBERTa), a hub name or a model folder"
            )
        if not 0.0 < mask_ratio < 1.0:
            raise ValueError(f"option mask_ratio must be between 0 and 1 (got {mask_ratio})")
        if tokenizer.mask_token_id is None or tokenizer.cls_token_id is None:
            raise ValueError("diffcse masks and edits sentences: the backbone's tokenizer needs a mask and a cls token")
        if encoder.pooler.view_dependent:
            raise ValueError(
                f"diffcse edits the bare sentence: use a pooler without a template, not {encoder.pooler.name}"
            )
        discriminator = copy.deepcopy(encoder.backbone).requires_grad_(True)
        if not isinstance(getattr(discriminator, "embeddings", None), nn.Module):
            raise ValueError(
                f"diffcse conditions the discriminator through its embedding output, and model type "
                f"{discriminator.config.model_type!r} has no `embeddings` module: choose another model.backbone"
            )
        if getattr(discriminator, "pooler", None) is not None:
            discriminator.pooler = None  # the code's discriminator has no pooling layer
        rows = discriminator.get_input_embeddings().num_embeddings
        #: The code's `discriminator`: a copy of the backbone as it starts, trained.
        self.discriminator = discriminator
        #: The code's `electra_head`: torch.nn.Linear(hidden, 2), PyTorch's initialisation.
        self.electra_head = nn.Linear(int(discriminator.config.hidden_size), 2)
        self.generator_name = str(generator)
        self.mask_ratio = float(mask_ratio)
        self.seed = int(seed)
        self.mask_token_id = int(tokenizer.mask_token_id)
        self.cls_token_id = int(tokenizer.cls_token_id)
        self.vocab_len = len(tokenizer)
        self.special_ids = torch.tensor(sorted(set(tokenizer.all_special_ids)), dtype=torch.long)
        # Plain attribute, not a submodule: the frozen generator is in no state dict, checkpoint or optimizer.
        object.__setattr__(self, "_generator", load_generator(self.generator_name, tokenizer, rows))

    @property
    def generator(self) -> Any:
        return self.__dict__["_generator"]

    def edit(self, ids: Tensor, attention_mask: Tensor, generator: torch.Generator) -> Tensor:
        """The generator's edit of `ids` [B, L]: argmax at every position of the masked sentence, [CLS] first."""
        cpu_ids = ids.cpu()
        special = torch.isin(cpu_ids, self.special_ids)
        masked = mask_tokens(cpu_ids, special, self.mask_ratio, self.mask_token_id, self.vocab_len, generator)[0]
        masked = masked.to(ids.device)
        model = self.generator
        if next(model.parameters()).device != ids.device:
            model.to(ids.device)
        model.train(self.training)
        with torch.no_grad():
            edited = model(input_ids=masked, attention_mask=attention_mask).logits.argmax(-1)
        edited[:, 0] = self.cls_token_id
        return edited

    def detection_loss(self, ids: Tensor, attention_mask: Tensor, edited: Tensor, conditions: Tensor) -> Tensor:
        """The conditional discriminator's cross-entropy on `edited` [B, L] given `conditions` [B, d]."""
        replaced = (edited != ids).long() * attention_mask
        inputs = edited * attention_mask

        def condition(module: nn.Module, args: Any, output: Tensor) -> Tensor:
            return torch.cat([conditions[:, None].to(output.dtype), output[:, 1:]], dim=1)

        handle = self.discriminator.embeddings.register_forward_hook(condition)
        try:
            states = self.discriminator(input_ids=inputs, attention_mask=attention_mask).last_hidden_state
        finally:
            handle.remove()
        scores = self.electra_head(states)
        return F.cross_entropy(scores.reshape(-1, 2).float(), replaced.reshape(-1))

    def forward(self, state: StepState) -> dict[str, Tensor]:
        output, n, views = state.encoder_output, state.batch_size, state.num_views
        if output.input_ids.shape[0] != n * views:
            raise CsekitError(
                f"objective diffcse: {output.input_ids.shape[0]} encoded rows for {views} training views of {n} "
                "sentences (a head that makes views of its own cannot be used with diffcse)"
            )
        ids, attention_mask = by_sentence(output.input_ids, views), by_sentence(output.attention_mask, views)
        conditions = torch.stack(state.embeddings, dim=1).reshape(n * views, -1)
        edited = self.edit(ids, attention_mask, batch_generator(self.seed, ["diffcse", *state.sentences]))
        return {"rtd": self.detection_loss(ids, attention_mask, edited, conditions)}

    def extra_repr(self) -> str:
        return f"generator={self.generator_name!r}, mask_ratio={self.mask_ratio}"

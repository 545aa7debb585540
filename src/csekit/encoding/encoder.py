"""The sentence encoder: a Hugging Face backbone, its tokenizer and a pooler.

`SentenceEncoder` is what users train, evaluate, encode with and save. It loads csekit model
directories, sentence-transformers directories, plain transformers checkpoints and hub names
(`model_folder.load_model`, names through `hub`), and saves in the sentence-transformers layout
(`export`) so `SentenceTransformer(path)` loads a csekit model unchanged.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from transformers import AutoModel, PreTrainedModel
from transformers import PreTrainedTokenizerBase as Tokenizer

from csekit.core.errors import CsekitError
from csekit.core.precision import DTYPES, resolve_precision
from csekit.core.progress import progress
from csekit.encoding.decoder import is_decoder_only, prepare_tokenizer, real_token_positions, set_attention
from csekit.encoding.export import save_model
from csekit.encoding.folder_pooling import (
    apply_folder_length,
    check_auto_location,
    check_folder_pooling,
    choose_pooling,
)
from csekit.encoding.hub import resolve_model_path
from csekit.encoding.instruction import instruction_ids
from csekit.encoding.lora import add_lora
from csekit.encoding.model_folder import freeze_unused_pooler, load_model
from csekit.encoding.packed import PackingLayout, packed_pass, split_layout
from csekit.encoding.packed_decoder import packed_decoder_pass, rows_fit_window
from csekit.encoding.packed_fixed import fixed_packed_pass
from csekit.encoding.passes import EMBEDDING_MASK, ONE_PADDED_PASS, POOLING_MASK, PassPlan
from csekit.encoding.pooling import MaskPooler, Pooler, PoolerOutputPooler, make_pooler, pad_ids
from csekit.encoding.ready_mask import ready_attention_mask
from csekit.encoding.representation import Reading, Representation

INPUT_EMBEDDINGS = "inputs_embeds"
"""transformers' input key for token embeddings looked up in advance (they replace `input_ids` in the backbone)."""


@dataclass
class EncoderOutput:
    """What one forward pass gives the training parts: pooled vectors and token states."""

    pooled: Tensor  # [B, d]
    #: The last layer's states [B, L, d]; None when the pass ran the last layer at the pooled positions only.
    last_layer_states: Tensor | None
    attention_mask: Tensor  # [B, L]
    input_ids: Tensor  # [B, L]

    @property
    def token_states(self) -> Tensor:
        """The last layer's states [B, L, d] (values at padding mean nothing)."""
        if self.last_layer_states is None:
            raise CsekitError(
                "this encoder pass computed the last layer only where the pooler reads it (token_states=False); "
                "a recipe part that reads token states sets `reads_token_states = True`"
            )
        return self.last_layer_states


def _position_wise_tail(backbone: nn.Module) -> nn.Module | None:
    """The module where a BERT-style last layer's position-wise part begins, or None for other layouts.

    BERT-style layers (BERT, RoBERTa, XLM-R, ELECTRA, DeBERTa-v2) call `attention.output(context,
    residual)` after attention; from there on (output projection, residual, LayerNorm, feed-forward:
    3/4 of the layer's matrix-product FLOPs) each position is computed on its own, so positions no one
    reads can be dropped. Other layouts (MPNet, DistilBERT) run whole.
    """
    layers = getattr(getattr(backbone, "encoder", None), "layer", None)
    if not isinstance(layers, nn.ModuleList) or len(layers) == 0:
        return None
    last = layers[-1]
    if getattr(last, "add_cross_attention", False) or getattr(last, "gradient_checkpointing", False):
        return None  # checkpointing re-runs the layer in backward, after the hook is gone
    tail = getattr(getattr(last, "attention", None), "output", None)
    if not isinstance(tail, nn.Module) or not isinstance(getattr(tail, "LayerNorm", None), nn.LayerNorm):
        return None
    return tail


def _dropout_overrides(dropout: float | None) -> dict[str, Any]:
    """The config keys that set a backbone's dropout to `dropout` (none: its own): BERT's, and decoder LLMs'
    (Llama's, Qwen2's...: attention dropout only, as LLM2Vec's SimCSE sets it); a config ignores the keys it lacks."""
    if dropout is None:
        return {}
    return {"hidden_dropout_prob": dropout, "attention_probs_dropout_prob": dropout, "attention_dropout": dropout}


class SentenceEncoder(nn.Module):
    """A backbone, its tokenizer and a pooler; optionally a head kept at test time; and the test-time representation
    that `encode` applies (`csekit.encoding.representation`: how the authors' evaluation wrote and tokenised each
    sentence, and what reads its vector)."""

    def __init__(
        self,
        backbone: PreTrainedModel,
        tokenizer: Tokenizer,
        pooler: Pooler,
        head: nn.Module | None = None,
        *,
        representation: Representation | None = None,
    ) -> None:
        super().__init__()
        self.backbone = backbone
        self.tokenizer = tokenizer
        self.pooler = pooler
        self.head = head
        #: The test-time representation, its pooler's and head's part read off `pooler` and `head`.
        self.representation = (representation or Representation()).describing(pooler, self.dim if head else None)
        #: The pooler a csekit-trained model was saved with (the representation it learnt); None for other models.
        self.trained_pooler: str | None = None
        #: A decoder LLM (`csekit.encoding.decoder`): position ids count real tokens, so padding may be on either side.
        self.decoder_only = is_decoder_only(backbone.config)
        prepare_tokenizer(tokenizer, backbone.config)
        set_attention(backbone, None)  # the attention its config says (a saved bidirectional model's flags)
        pooler.bind(tokenizer)
        pooler.bind_backbone(backbone)

    def with_head(self, head: nn.Module | None) -> SentenceEncoder:
        """This encoder (the same backbone, tokenizer and pooler) with `head` applied to what it pools."""
        return self._sharing(self.pooler, head, self.representation)

    def with_pooler(self, pooler: Pooler) -> SentenceEncoder:
        """This encoder (the same backbone, tokenizer and head) pooling with `pooler` instead; the test template stays
        only with a prompt pooler."""
        kept = self.representation.dropping(test_template=not isinstance(pooler, MaskPooler))
        return self._sharing(pooler, self.head, kept)

    def with_representation(self, representation: Representation | None = None, /, **changes: Any) -> SentenceEncoder:
        """This encoder (the backbone and tokenizer shared) reading `representation` (default: its own) with `changes`
        (`dataclasses.replace`'s): the pooler and head are shared while the representation keeps them, a pooler it
        changes is built anew."""
        wanted = replace(representation or self.representation, **changes)
        pooler = self.pooler if wanted.pooling == self.representation.pooling else wanted.make_pooler()
        if wanted.head is not None and self.head is None:
            raise CsekitError("this encoder has no head to apply at test time; give it one with `with_head`")
        return self._sharing(pooler, self.head if wanted.head is not None else None, wanted)

    def _sharing(self, pooler: Pooler, head: nn.Module | None, representation: Representation) -> SentenceEncoder:
        """A view of this encoder: the same backbone and tokenizer (and what it was trained with), `pooler`, `head`,
        `representation`."""
        encoder = type(self)(self.backbone, self.tokenizer, pooler, head, representation=representation)
        encoder.trained_pooler = self.trained_pooler
        return encoder

    # ----------------------------------------------------------------- loading
    @classmethod
    def load(
        cls,
        name_or_path: str | Path,
        pooler: str | None = None,
        *,
        reading: Reading | None = None,
        dropout: float | None = None,
        attention: str | None = None,
        lora: Mapping[str, Any] | None = None,
        weights_dtype: torch.dtype = torch.float32,
    ) -> SentenceEncoder:
        """Load a csekit or sentence-transformers directory, a transformers checkpoint or a hub name.

        `pooler` overrides the pooler recorded with the model; None or `auto` read the model's own representation
        (csekit.json's, or a sentence-transformers folder's Pooling and Normalize: `csekit.encoding.folder_pooling`),
        and a plain checkpoint reads `cls` (None) or is refused (`auto`).
        `reading`: the pooler's options, the sentence-end rule and the test template asked for (each None: the model's
        own; `csekit.encoding.representation.Reading`), resolved against what the model saved into the encoder's
        `representation`.
        `dropout` overrides the backbone's hidden and attention dropout (SimCSE's views come from it).
        `attention`: a decoder LLM's causal or bidirectional attention (None: as saved; `csekit.encoding.decoder`).
        `lora`: LoRA adapters on the backbone, which then trains only them (`csekit.encoding.lora`).
        `weights_dtype`: the backbone's stored weights (bf16: a LoRA run's frozen base, `model.weights_dtype`).
        A training `max_length` that older csekit versions saved is ignored: inference never truncates below
        the backbone's limit (`max_seq_length`). The folder's checks and reading: `model_folder.load_model`.
        """
        overrides = _dropout_overrides(dropout)
        check_auto_location(pooler, resolve_model_path(name_or_path))  # before a hub name is downloaded
        loaded = load_model(name_or_path, AutoModel, config_overrides=overrides, weights_dtype=weights_dtype)
        set_attention(loaded.model, attention)
        location, missing, saved = loaded.location, loaded.missing_weights, loaded.layout
        own = choose_pooling(pooler, location, saved)
        check_folder_pooling(own, int(loaded.model.config.hidden_size), loaded.tokenizer)
        apply_folder_length(own, loaded.tokenizer)
        chosen = own.pooler
        if chosen == PoolerOutputPooler.name and any(key.startswith("pooler.") for key in missing):
            raise CsekitError(
                f'model "{location}": its checkpoint has no weights for the pooler layer '
                f"({', '.join(sorted(key for key in missing if key.startswith('pooler.')))} were initialised at "
                "random), so the pooler_output pooler would read noise; choose another pooler"
            )
        backbone = add_lora(loaded.model, lora) if lora is not None else loaded.model
        pooling, representation = (reading or Reading()).read(chosen, saved.representation, own.normalize)
        encoder = cls(backbone, loaded.tokenizer, pooling, loaded.head, representation=representation)
        if saved.csekit_trained:
            encoder.trained_pooler = saved.representation.pooler
        return encoder

    @classmethod
    def from_config(cls, config: Any, tokenizer: Tokenizer, pooler: str = "cls") -> SentenceEncoder:
        """A randomly initialised encoder (tests and from-scratch experiments)."""
        backbone = AutoModel.from_config(config)
        freeze_unused_pooler(backbone)
        return cls(backbone, tokenizer, make_pooler(pooler))

    # ----------------------------------------------------------------- forward
    @property
    def dim(self) -> int:
        return int(self.backbone.config.hidden_size)

    @property
    def device(self) -> torch.device:
        return next(self.backbone.parameters()).device

    def tokenize(self, sentences: Sequence[str], view: int = 0, max_length: int | None = None) -> dict[str, Tensor]:
        """Padded token ids through the pooler (which may wrap sentences in a prompt template).

        `max_length` is a training bound on each sentence (the recipe's `model.max_length`); without it
        only the backbone's limit applies, as in `encode`.
        """
        return self.pooler.tokenize(self.tokenizer, sentences, max_length, view, self.max_seq_length)

    @property
    def max_seq_length(self) -> int:
        """The one inference length: the longest input the backbone accepts.

        `encode` (so `csekit evaluate`, `encode`, probes and the Python API) and the exported
        `sentence_bert_config.json` all read it here. SentEval never truncates; this only guards
        against overflowing the position table. A recipe's `model.max_length` bounds training inputs only.
        """
        positions = int(getattr(self.backbone.config, "max_position_embeddings", 512))
        if getattr(self.backbone.config, "model_type", "") in ("roberta", "xlm-roberta", "camembert"):
            positions -= 2  # RoBERTa's position ids start after the padding index
        model_max = getattr(self.tokenizer, "model_max_length", None)
        if isinstance(model_max, int) and model_max < positions:
            return model_max
        return positions

    def forward(
        self, inputs: dict[str, Tensor], *, token_states: bool = True, plan: PassPlan = ONE_PADDED_PASS
    ) -> EncoderOutput:
        """Run the backbone and the pooler on tokenised inputs (any extra keys go to the backbone).

        An optional `embedding_mask` key (see `EMBEDDING_MASK`) is not passed to the backbone: it is
        multiplied into the output of the backbone's embedding layer for this call only, which is how
        embedding-level augmentations (ConSERT's cutoffs) reach the model without editing it.

        `plan` says how the pass is executed (`csekit.encoding.passes`): one padded pass (the default), in
        groups of `plan.length_group_size` rows of similar length, each group cut to its own longest row (a
        row's states do not depend on the other rows, so this only saves the work spent on padding: a random
        batch of 64 STS sentences, two views, max length 32, computes 2.2 positions per real token in one
        pass, 1.2 in groups of 32), or padding-free. Inputs must be right-padded, as `pad_ids` pads them.
        `token_states` come back in the input's order and width; as always, values at padding mean nothing.

        `token_states=False` is for callers that read only `pooled`: when the pooler reads one position
        a row (cls, mask) and the backbone has BERT-style layers, the last layer's position-wise part runs
        at those positions only (the same vectors and gradients, about 1/8 fewer matrix-product FLOPs
        for a 6-layer model), and the output's `last_layer_states` is None.
        """
        inputs, layout = split_layout(inputs)  # the training collator's; only a packed pass reads it
        if plan.packs(inputs):
            return self._forward_masked(inputs, token_states, packed=plan, layout=layout)
        rows = inputs["attention_mask"].shape[0]
        if not plan.groups(rows) or self.pooler.reads_row_width:  # mean_padded: the batch's width (pooler_base)
            return self._forward_masked(inputs, token_states)
        lengths = inputs["attention_mask"].sum(dim=1)
        order = torch.argsort(lengths, stable=True)
        width = inputs["attention_mask"].shape[1]
        inputs = dict(inputs)
        embedding = self.backbone.get_input_embeddings()
        if INPUT_EMBEDDINGS not in inputs and isinstance(embedding, nn.Embedding):
            # One lookup for the whole batch: each lookup's backward writes a dense gradient the size of
            # the vocabulary (47 MB for BERT's), which cost more than the lookups once per group.
            inputs[INPUT_EMBEDDINGS] = embedding(inputs["input_ids"])
        pooled, states = [], []
        for group in order.split(plan.length_group_size):
            longest = int(lengths[group].max())
            part = {
                key: value[group][:, :longest] if value.dim() > 1 else value[group] for key, value in inputs.items()
            }
            output = self._forward_masked(part, token_states)
            pooled.append(output.pooled)
            if output.last_layer_states is not None:
                states.append(nn.functional.pad(output.last_layer_states, (0, 0, 0, width - longest)))
        restore = torch.argsort(order)
        return EncoderOutput(
            torch.cat(pooled)[restore],
            torch.cat(states)[restore] if states else None,
            inputs["attention_mask"],
            inputs["input_ids"],
        )

    def _forward_masked(
        self,
        inputs: dict[str, Tensor],
        token_states: bool,
        packed: PassPlan | None = None,
        layout: PackingLayout | None = None,
    ) -> EncoderOutput:
        """One backbone pass, with the optional embedding mask applied through a forward hook.

        `packed`: padding-free as that plan says, with the batch's `layout` where it has one.
        """
        inputs = dict(inputs)
        mask = inputs.pop(EMBEDDING_MASK, None)
        forward = functools.partial(self._forward_packed, plan=packed, layout=layout) if packed else self._forward
        if mask is None:
            return self._normalized(forward(inputs, token_states))
        embeddings = getattr(self.backbone, "embeddings", None)
        if not isinstance(embeddings, nn.Module):
            raise CsekitError(
                f"{type(self.backbone).__name__} has no `embeddings` module, so embedding-level views "
                "(ConSERT's cutoffs) cannot be applied to it"
            )

        def apply_mask(module: nn.Module, args: Any, output: Tensor) -> Tensor:
            return output * mask.to(device=output.device, dtype=output.dtype)

        handle = embeddings.register_forward_hook(apply_mask)
        try:
            return self._normalized(forward(inputs, token_states))
        finally:
            handle.remove()

    def _normalized(self, output: EncoderOutput) -> EncoderOutput:
        """`output` with unit-length vectors where the pooler is followed by normalisation (a sentence-transformers
        Normalize module): training, evaluation and the saved model all see the vectors the folder gives."""
        if self.representation.normalize:
            output.pooled = nn.functional.normalize(output.pooled, p=2, dim=-1)
        return output

    def _forward_packed(
        self, inputs: dict[str, Tensor], token_states: bool, plan: PassPlan, layout: PackingLayout | None = None
    ) -> EncoderOutput:
        """One padding-free backbone pass (on fixed shapes where the plan has a token bucket); the pooler sees
        padded states, or the read positions' only."""
        mask, ids = inputs["attention_mask"], inputs["input_ids"]
        all_layers = self.pooler.needs_all_layers
        if self.decoder_only:  # the family's own forward on the packed row; every state, as its padded pass reads
            if not rows_fit_window(self.backbone, mask.shape[1]):
                return self._forward(inputs, token_states)
            output = packed_decoder_pass(self.backbone, inputs, all_layers, plan.length_group_size, layout)
            states = output.hidden_states
            return EncoderOutput(self.pooler(states, mask, ids), states[-1], mask, ids)
        positions = None if token_states else self.pooler.read_positions(mask, ids)
        if plan.token_bucket:
            output = fixed_packed_pass(
                self.backbone, inputs, plan.token_bucket, plan.width_bound, all_layers, positions, layout,
                plan.fused_qkv, plan.layer_stack,
            )  # fmt: skip
        else:
            group_rows = plan.length_group_size
            output = packed_pass(self.backbone, inputs, all_layers, positions, group_rows, layout, plan.fused_qkv)
        if output.read_states is not None:
            return EncoderOutput(self.pooler.pool_read_states(output.read_states), None, mask, ids)
        states = output.hidden_states
        return EncoderOutput(self.pooler(states, mask, ids), states[-1], mask, ids)

    def _forward(self, inputs: dict[str, Tensor], token_states: bool) -> EncoderOutput:
        backbone_inputs = dict(inputs)
        if INPUT_EMBEDDINGS in backbone_inputs:  # the backbone takes ids or embeddings, not both
            del backbone_inputs["input_ids"]
        mask, ids = inputs["attention_mask"], inputs["input_ids"]
        pooled_mask = backbone_inputs.pop(POOLING_MASK, mask)  # the tokens pooled, where fewer than those attended
        if self.training:  # the host is not asked whether the batch has padding (see `ready_attention_mask`)
            backbone_inputs["attention_mask"] = ready_attention_mask(self.backbone, mask)
        if self.decoder_only:  # no key/value cache: nothing is generated
            backbone_inputs.setdefault("position_ids", real_token_positions(mask))
            backbone_inputs["use_cache"] = False
        tail = None if token_states else _position_wise_tail(self.backbone)
        positions = self.pooler.read_positions(pooled_mask, ids) if tail is not None else None
        if tail is not None and positions is not None:
            rows = torch.arange(positions.shape[0], device=positions.device)

            def keep_read_positions(module: nn.Module, args: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
                return tuple(tensor[rows, positions].unsqueeze(1) for tensor in args)

            handle = tail.register_forward_pre_hook(keep_read_positions)
            try:
                outputs = self.backbone(**backbone_inputs, return_dict=True)
            finally:
                handle.remove()
            states = outputs.last_hidden_state
            # One column left: the hook ran. A layer that called its tail otherwise kept every position.
            pooled = (
                self.pooler.pool_read_states(states[:, 0])
                if states.shape[1] == 1
                else self.pooler((states,), pooled_mask, ids)
            )
            return EncoderOutput(pooled, None, mask, ids)
        outputs = self.backbone(**backbone_inputs, output_hidden_states=self.pooler.needs_all_layers, return_dict=True)
        states = outputs.hidden_states if self.pooler.needs_all_layers else (outputs.last_hidden_state,)
        pooled = self.pooler(states, pooled_mask, ids)
        return EncoderOutput(pooled, outputs.last_hidden_state, mask, ids)

    # ----------------------------------------------------------------- inference
    def encode(
        self,
        sentences: Sequence[str],
        batch_size: int = 128,
        precision: str = "fp32",
        show_progress_bar: bool | None = None,
        progress_label: str = "encoding",
        instruction: str | None = None,
    ) -> np.ndarray:
        """Embed sentences as float32 numpy rows, in input order (the progress bar, if shown, says `progress_label`).

        Duplicates are encoded once, and sentences are sorted by length so batches carry little
        padding; the test-time representation is the pooled vector (through `head` if one is kept). Each
        sentence is first written as the representation's sentence-end rule says, and tokenised whole in its test
        template if it has one.
        `precision` is fp32 (SentEval-exact), bf16, fp16 or auto (bf16 where the device runs it natively).
        `instruction` (None: none): each text follows it, and only the text's tokens are pooled, as LLM2Vec's `encode`
        (`csekit.encoding.instruction`; "" pools the text's tokens without an instruction).
        """
        precision = resolve_precision(precision, self.device)[0]
        if batch_size < 1:
            raise CsekitError(f"batch size must be at least 1, got {batch_size}")
        if len(sentences) == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        unique = list(dict.fromkeys(sentences))
        texts = self.representation.write(unique)
        ids = (
            self.representation.evaluation_ids(self.pooler, self.tokenizer, texts, self.max_seq_length)
            if instruction is None
            else instruction_ids(self.pooler, self.tokenizer, texts, instruction, self.max_seq_length)
        )
        # Sorting by token count (not characters) leaves almost no padding in a batch.
        order = sorted(range(len(unique)), key=lambda i: -len(ids["input_ids"][i]))
        if show_progress_bar is None:
            show_progress_bar = len(unique) >= 2048
        rows = np.zeros((len(unique), self.dim), dtype=np.float32)
        was_training = self.training
        self.eval()
        device = self.device
        pad_id = self.tokenizer.pad_token_id or 0
        autocast = torch.autocast(device.type, dtype=DTYPES[precision], enabled=precision != "fp32")
        try:
            with torch.inference_mode(), autocast:
                for start in progress(range(0, len(order), batch_size), progress_label, "batches", show_progress_bar):
                    index = order[start : start + batch_size]
                    batch = pad_ids({key: [values[i] for i in index] for key, values in ids.items()}, pad_id)
                    inputs = {key: value.to(device) for key, value in batch.items()}
                    pooled = self(inputs, token_states=False).pooled
                    if self.head is not None:
                        pooled = self.head(pooled)
                    rows[index] = pooled.float().cpu().numpy()
        finally:
            self.train(was_training)
        position = {sentence: i for i, sentence in enumerate(unique)}
        return rows[[position[s] for s in sentences]] if len(sentences) else rows

    # ----------------------------------------------------------------- saving
    def save(self, path: str | Path, card_facts: Mapping[str, Any] | None = None) -> None:
        """Write a sentence-transformers model directory (atomically) that csekit also reloads (`export.save_model`);
        `card_facts`: what a training run tells the model card."""
        save_model(self, path, card_facts)

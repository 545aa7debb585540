"""The padding-free encoder pass (`run.packed`): every row's real tokens concatenated, no padding computed.

A padded batch of B rows of width L runs every linear and feed-forward product on B*L positions; in a
random batch of STS sentences (two views, max length 32) about half of them are padding. Here the
backbone's embedding layer runs on the padded inputs (so position ids restart in every row, RoBERTa's
padding offset included, and embedding-level views such as ConSERT's cutoffs apply unchanged), then its
real positions are gathered into one [T, d] sequence, and each transformer layer is driven module by
module on it: the query, key and value projections, the attention output, the feed-forward and their
LayerNorms see real tokens only. Attention stays within each row:

* on CUDA in fp16/bf16, through the flash kernel's variable-length form (`aten::_flash_attention_forward`
  with cumulative row lengths; `torch.nn.attention.varlen.varlen_attn` fixes its dropout at 0, and SimCSE's
  views need attention-probability dropout);
* elsewhere (a CPU, fp32), exactly as in the padded pass, in length groups: queries, keys and values are
  gathered into groups of rows of similar length (`run.length_group_size` rows, each group as wide as its
  longest row: `AttentionGroups`) and the backbone's own attention function runs with the key-padding mask
  (csekit's CPU attention with its cheap dropout masks where `run.fast_dropout` set it), then the result
  is scattered back. Attention is a small part of a short sentence's arithmetic; the products around it
  are not, but over the whole batch padded to its longest row it cost a tenth of a CPU step.

The last layer's states come back in the padded layout for poolers and parts that read token states;
when only one position a row is read (cls, mask, pooler_output), the last layer's position-wise part
runs at those positions only, as in the padded pass's shortcut.

Supported: BERT-architecture models (BERT, MiniLM, ...) and RoBERTa, as transformers builds them
(`encoder.layer[i].attention.self.query`, ...), and the decoder LLMs of `PACKED_DECODER_TYPES`, which run
their own forward on the packed row instead (`csekit.encoding.packed_decoder`); `packing_refusal` says why
another backbone is not.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from transformers.masking_utils import create_bidirectional_mask

from csekit.encoding.decoder import is_decoder_only
from csekit.encoding.fast_dropout import ATTENTION as FAST_DROPOUT_ATTENTION
from csekit.encoding.fused_qkv import project_qkv
from csekit.encoding.lora import plain_model

PACKED_MODEL_TYPES = ("bert", "roberta")
"""transformers model types whose layers `packed_pass` drives (their modules are checked too)."""

PACKED_DECODER_TYPES = ("llama", "mistral", "qwen2", "gemma")
"""Decoder LLM model types that run padding-free (`csekit.encoding.packed_decoder`): the families whose forward,
masks and attention modules the tests check against the padded pass (tests/unit/encoding/test_packed_decoders.py)."""

PACKED_DECODER_ATTENTION = ("eager", "sdpa", FAST_DROPOUT_ATTENTION)
"""A decoder's attention implementations the packed pass runs in length groups where the flash kernel does not
(their masks are the 4-D tensors `create_bidirectional_mask` builds)."""

BACKBONE_INPUTS = frozenset({"input_ids", "attention_mask", "token_type_ids", "position_ids", "inputs_embeds"})
"""The inputs a packed pass knows what to do with; a view adding another backbone input runs padded."""


def packing_refusal(backbone: nn.Module) -> str | None:
    """Why `backbone` cannot run padding-free, or None when it can."""
    config = getattr(backbone, "config", None)
    model_type = getattr(config, "model_type", None)
    if config is not None and is_decoder_only(config):
        return _decoder_refusal(plain_model(backbone), model_type)
    if model_type not in PACKED_MODEL_TYPES:
        return f"the padding-free pass supports {' and '.join(PACKED_MODEL_TYPES)} backbones, not {model_type}"
    if getattr(config, "is_decoder", False) or getattr(config, "add_cross_attention", False):
        return "the padding-free pass runs bidirectional encoders only (this config is a decoder)"
    if getattr(config, "chunk_size_feed_forward", 0):
        return "the padding-free pass does not run chunked feed-forward layers (chunk_size_feed_forward)"
    if not isinstance(getattr(backbone, "embeddings", None), nn.Module):
        return f"{type(backbone).__name__} has no `embeddings` module"
    layers = getattr(getattr(backbone, "encoder", None), "layer", None)
    if not isinstance(layers, nn.ModuleList) or len(layers) == 0:
        return f"{type(backbone).__name__} has no `encoder.layer` list"
    for layer in layers:
        attention = getattr(getattr(layer, "attention", None), "self", None)
        parts = [getattr(attention, name, None) for name in ("query", "key", "value")]
        if not all(isinstance(part, nn.Linear) for part in parts) or not all(
            isinstance(getattr(module, name, None), nn.Module)
            for module, name in ((layer.attention, "output"), (layer, "intermediate"), (layer, "output"))
        ):
            return f"{type(layer).__name__} is not laid out as BERT's layers are"
        if getattr(layer, "gradient_checkpointing", False):
            return "the padding-free pass does not run with gradient checkpointing"
    return None


def _decoder_refusal(model: nn.Module, model_type: str | None) -> str | None:
    """Why the decoder LLM `model` (LoRA's adapters unwrapped) cannot run padding-free, or None when it can."""
    if model_type not in PACKED_DECODER_TYPES:
        names = f"{', '.join(PACKED_DECODER_TYPES[:-1])} and {PACKED_DECODER_TYPES[-1]}"
        return f"the padding-free pass runs {names} decoders, not {model_type}"
    implementation = getattr(model.config, "_attn_implementation", None)
    if implementation not in PACKED_DECODER_ATTENTION:
        return f"the padding-free pass runs a decoder's eager or sdpa attention, not {implementation}"
    layers = getattr(model, "layers", None)
    if not isinstance(layers, nn.ModuleList) or len(layers) == 0:
        return f"{type(model).__name__} has no `layers` list"
    return checkpointing_refusal(layers)


def checkpointing_refusal(layers: Iterable[nn.Module]) -> str | None:
    """Why a decoder's checkpointed `layers` cannot run padding-free, or None: the packed pass hands each layer's
    checkpoint call the recomputation's attention as a `context_fn` (`csekit.encoding.packed_decoder`), which only
    torch's non-reentrant checkpoint takes (`run.gradient_checkpointing` enables that one), and one that has its own
    `context_fn` already would lose it."""
    for layer in layers:
        if not getattr(layer, "gradient_checkpointing", False):
            continue
        options = getattr(getattr(layer, "_gradient_checkpointing_func", None), "keywords", None) or {}
        if options.get("use_reentrant") is not False or "context_fn" in options:
            return (
                "the padding-free pass runs with non-reentrant gradient checkpointing only "
                "(run.gradient_checkpointing's: use_reentrant False, no context_fn of its own)"
            )
    return None


PACKING_LAYOUT = "packing_layout"
"""The inputs key of a batch's `PackingLayout` (the training collator adds it); never passed to the backbone."""


@dataclass
class PackingLayout:
    """Where a right-padded batch's real tokens are, made on the CPU with the batch (`TrainCollator`).

    On a GPU, finding them from the device's mask (`nonzero`) waits for the device in every packed pass:
    its result's size is read on the host. Made where the rows are made, the layout travels with the batch
    (pinned and copied with it) and the packed pass reads nothing back. A pass on rows taken out of the batch
    (chunks, groups) drops it: it describes the whole batch's mask only.
    """

    index: Tensor  # [T] positions of the real tokens in the flattened [B * L] batch, row by row
    cumulative_lengths: Tensor  # [B + 1] int32: row r's tokens are index[cum[r] : cum[r + 1]]

    @classmethod
    def of(cls, attention_mask: Tensor) -> PackingLayout:
        """The layout of `attention_mask` found where it is (on a GPU, `nonzero` waits for the device)."""
        mask = attention_mask.bool()
        return cls(mask.flatten().nonzero().squeeze(1), _cumulative_lengths(mask))

    @classmethod
    def of_host_mask(cls, attention_mask: Tensor) -> PackingLayout:
        """The layout of a mask on the CPU, as the collator has it: the same tensors as `of`, by boolean indexing
        (no result is read back from a device, and tests count the device-side `nonzero` calls)."""
        mask = attention_mask.bool()
        positions = torch.arange(mask.numel(), device=mask.device).view(mask.shape)
        return cls(positions[mask], _cumulative_lengths(mask))

    def fits(self, attention_mask: Tensor) -> bool:
        """Whether this layout can describe `attention_mask` (its shape and device; the values are trusted)."""
        rows, width = attention_mask.shape
        return (
            self.cumulative_lengths.shape == (rows + 1,)
            and self.index.shape[0] <= rows * width
            and self.index.device == attention_mask.device
        )

    def to(self, device: torch.device | str, non_blocking: bool = False) -> PackingLayout:
        """On `device` (how accelerate moves a batch: an object's own `to`)."""
        return PackingLayout(
            self.index.to(device, non_blocking=non_blocking),
            self.cumulative_lengths.to(device, non_blocking=non_blocking),
        )

    def pin_memory(self) -> PackingLayout:
        """In pinned memory (how the DataLoader pins a batch: an object's own `pin_memory`)."""
        return PackingLayout(self.index.pin_memory(), self.cumulative_lengths.pin_memory())


def _cumulative_lengths(mask: Tensor) -> Tensor:
    """[B + 1] int32: 0, then each row's end in the packed sequence."""
    return nn.functional.pad(mask.sum(dim=1, dtype=torch.int32).cumsum(0, dtype=torch.int32), (1, 0))


def split_layout(inputs: dict[str, Any]) -> tuple[dict[str, Tensor], PackingLayout | None]:
    """`inputs` without the `PACKING_LAYOUT` key, and that layout (None when there is none)."""
    if PACKING_LAYOUT not in inputs:
        return inputs, None
    rest = {key: value for key, value in inputs.items() if key != PACKING_LAYOUT}
    return rest, inputs[PACKING_LAYOUT]


@dataclass
class PackedRows:
    """Where a padded batch's real tokens are: the layout shared by every layer of one pass."""

    index: Tensor  # [T] positions of the real tokens in the flattened [B * L] batch, row by row
    cumulative_lengths: Tensor  # [B + 1] int32: row r's tokens are index[cum[r] : cum[r + 1]]
    batch: int
    width: int
    key_mask: Tensor  # [B, L] bool, True at real tokens

    @classmethod
    def of(cls, attention_mask: Tensor, layout: PackingLayout | None = None) -> PackedRows:
        """The rows of `attention_mask`, from the batch's `layout` where it has one that fits (no device read)."""
        mask = attention_mask.bool()
        if layout is None or not layout.fits(mask):
            layout = PackingLayout.of(mask)
        return cls(layout.index, layout.cumulative_lengths, mask.shape[0], mask.shape[1], mask)

    def pack(self, padded: Tensor) -> Tensor:
        """[B, L, ...] -> [T, ...]."""
        return padded.flatten(0, 1)[self.index]

    def unpack(self, packed: Tensor) -> Tensor:
        """[T, ...] -> [B, L, ...], zeros at padding (values at padding mean nothing)."""
        flat = packed.new_zeros((self.batch * self.width, *packed.shape[1:]))
        return flat.index_copy(0, self.index, packed).view(self.batch, self.width, *packed.shape[1:])

    def attention_groups(self, group_rows: int) -> AttentionGroups:
        """Rows sorted by length in groups of `group_rows` (0: one group), each as wide as its longest row."""
        lengths = (self.cumulative_lengths[1:] - self.cumulative_lengths[:-1]).tolist()  # host values: CPU only
        order = sorted(range(self.batch), key=lengths.__getitem__)
        size = group_rows if 0 < group_rows < self.batch else self.batch
        total = int(self.cumulative_lengths[-1])
        starts = self.cumulative_lengths.tolist()
        groups, real_indices = [], []
        for first in range(0, self.batch, size):
            members = order[first : first + size]
            width = max(lengths[r] for r in members)
            # Each member's packed indices, then `total` (a zero row appended to the packed states) as padding.
            index = [[*range(starts[r], starts[r + 1]), *[total] * (width - lengths[r])] for r in members]
            index_tensor = torch.tensor(index, dtype=torch.long, device=self.index.device)
            mask = index_tensor < total
            groups.append((index_tensor, mask))
            real_indices.append(index_tensor[mask])
        restore = torch.argsort(torch.cat(real_indices))
        return AttentionGroups(groups, restore, total)

    def packed_positions(self, positions: Tensor) -> Tensor:
        """Each row's real position `positions[r]` (padded coordinates, [B]) as an index into the packed sequence."""
        rank = self.key_mask.flatten().cumsum(0).view(self.batch, self.width) - 1
        return rank[torch.arange(self.batch, device=positions.device), positions]


@dataclass
class AttentionGroups:
    """Where attention runs on a CPU: rows of similar length in groups, each padded to its own longest row.

    A batch padded to its longest row computes attention over about 2 positions per real token (squared in
    the score matrix); groups of 32 rows sorted by length, about 1.2 (as `run.length_group_size` does for
    the padded pass). Only attention is grouped: everything else runs on the packed tokens.
    """

    groups: list[tuple[Tensor, Tensor]]  # per group: [g, w] indices into the packed states (T = padding), [g, w] mask
    restore: Tensor  # [T]: the groups' real positions, concatenated, back in packed order
    total: int  # T, the number of real tokens

    def gather(self, packed: Tensor) -> list[Tensor]:
        """[T, ...] -> per group [g, w, ...], zeros at padding."""
        padded = torch.cat([packed, packed.new_zeros((1, *packed.shape[1:]))])
        return [padded[index] for index, _ in self.groups]

    def scatter(self, grouped: list[Tensor]) -> Tensor:
        """Per group [g, w, ...] -> [T, ...] (values at padding dropped)."""
        real = [tensor[mask] for tensor, (_, mask) in zip(grouped, self.groups, strict=True)]
        return torch.cat(real)[self.restore]


FLASH_CAPABILITY = (8, 0)
"""The least CUDA compute capability that PyTorch's flash kernels run on (Ampere)."""


def flash_packing_runs(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the packed pass's attention runs as the flash kernel's variable-length form on `device` in `dtype`.

    Elsewhere (a CPU, fp32, a GPU older than Ampere) it runs in length groups, which on a GPU cost a pass
    per group; `run.packed: auto` packs on CUDA only where this holds (csekit.training.execution).
    """
    if device.type != "cuda" or dtype not in (torch.float16, torch.bfloat16):
        return False
    if not (torch.cuda.is_available() and torch.backends.cuda.is_flash_attention_available()):
        return False
    return torch.cuda.get_device_capability(device) >= FLASH_CAPABILITY


def flash_attention_runs(head_size: int, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether attention of heads of `head_size` runs the flash kernel (which takes head sizes in multiples of 8)."""
    return head_size % 8 == 0 and flash_packing_runs(device, dtype)


def _uses_flash(query: Tensor) -> bool:
    return flash_attention_runs(query.shape[-1], query.device, query.dtype)


def attention_function(attention: nn.Module) -> Callable[..., tuple[Tensor, Any]]:
    """The backbone's own attention function (`config._attn_implementation`), as its layers call it."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    from transformers.models.bert.modeling_bert import eager_attention_forward

    return ALL_ATTENTION_FUNCTIONS.get_interface(attention.config._attn_implementation, eager_attention_forward)


def _attend(
    attention: nn.Module,
    hidden: Tensor,
    rows: PackedRows,
    grouped: Callable[[], tuple[AttentionGroups, list[Any]]],
    fused_qkv: bool = False,
) -> Tensor:
    """One self-attention block on packed states [T, d]: the context [T, H * d_h], attending within rows.

    `grouped()` gives, where attention runs on a padded layout (not the flash kernel), the length groups and
    each group's attention mask as transformers builds it for the backbone's attention function.
    `fused_qkv`: the query, key and value as one product (`csekit.encoding.fused_qkv`).
    """
    query, key, value = project_qkv(attention, hidden, fused_qkv)
    dropout = attention.dropout.p if attention.training else 0.0
    if _uses_flash(query):
        # The padded width bounds every row's length without reading the lengths on the host.
        context = torch.ops.aten._flash_attention_forward(
            query,
            key,
            value,
            rows.cumulative_lengths,
            rows.cumulative_lengths,
            rows.width,
            rows.width,
            dropout,
            False,
            False,
            scale=attention.scaling,
        )[0]
        return context.flatten(1)
    attend = attention_function(attention)
    groups, masks = grouped()
    per_group = zip(*(groups.gather(tensor) for tensor in (query, key, value)), masks, strict=True)
    contexts = [
        attend(
            attention,
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            mask,
            dropout=dropout,
            scaling=attention.scaling,
        )[0]
        for q, k, v, mask in per_group
    ]  # each [g, w, H, d_h]
    return groups.scatter(contexts).flatten(1)


@dataclass
class PackedOutput:
    """What a packed pass gives the encoder: padded states for the pooler, or the read positions' states."""

    hidden_states: tuple[Tensor, ...]  # padded [B, L, d]: every layer's (embeddings first) or the last one only
    read_states: Tensor | None  # [B, d], the last layer at `read_positions` when the pass ran the shortcut


def packed_start(
    backbone: nn.Module, inputs: dict[str, Tensor], layout: PackingLayout | None
) -> tuple[PackedRows, Tensor]:
    """Where `inputs`' real tokens are, and the backbone's embedding layer's output on the padded inputs [B, L, d]
    (position ids restart in every row; its forward hooks, ConSERT's cutoffs, apply here)."""
    rows = PackedRows.of(inputs["attention_mask"], layout)
    embedding_inputs = {key: inputs[key] for key in ("token_type_ids", "position_ids") if key in inputs}
    if "inputs_embeds" in inputs:
        embedding_inputs["inputs_embeds"] = inputs["inputs_embeds"]
    else:
        embedding_inputs["input_ids"] = inputs["input_ids"]
    return rows, backbone.embeddings(**embedding_inputs)


def packed_pass(
    backbone: nn.Module,
    inputs: dict[str, Tensor],
    all_layers: bool = False,
    read_positions: Tensor | None = None,
    attention_group_rows: int = 0,
    layout: PackingLayout | None = None,
    fused_qkv: bool = False,
) -> PackedOutput:
    """Run a BERT-layout `backbone` padding-free on padded `inputs` (see the module's docstring).

    `all_layers`: return every layer's states (a pooler that reads more than the last layer).
    `read_positions` [B]: run the last layer's position-wise part at those positions only, returning
    their states as `read_states` (and no token states).
    `attention_group_rows`: where attention runs on a padded layout (not the flash kernel), in length groups
    of that many rows (`AttentionGroups`); 0: one group, the batch padded to its longest row.
    `layout`: where the real tokens are, made with the batch (`PackingLayout`); else found on the device.
    `fused_qkv`: each layer's query, key and value as one product (`csekit.encoding.fused_qkv`).
    """
    rows, embedded = packed_start(backbone, inputs, layout)
    hidden = rows.pack(embedded)
    layers = backbone.encoder.layer
    states: list[Tensor] = [embedded] if all_layers else []
    read = rows.packed_positions(read_positions) if read_positions is not None else None

    @functools.cache
    def grouped() -> tuple[AttentionGroups, list[Any]]:
        groups = rows.attention_groups(attention_group_rows)
        masks = [
            create_bidirectional_mask(backbone.config, embedded.new_empty((*mask.shape, 1)), mask.long())
            for _, mask in groups.groups
        ]
        return groups, masks

    for number, layer in enumerate(layers):
        context = _attend(layer.attention.self, hidden, rows, grouped, fused_qkv)
        if read is not None and number == len(layers) - 1:
            context, hidden = context[read], hidden[read]  # only these positions are read
        hidden = layer.attention.output(context, hidden)
        hidden = layer.output(layer.intermediate(hidden), hidden)
        if all_layers and number < len(layers) - 1:
            states.append(rows.unpack(hidden))
    if read is not None:
        return PackedOutput((), hidden)
    states.append(rows.unpack(hidden))
    return PackedOutput(tuple(states), None)

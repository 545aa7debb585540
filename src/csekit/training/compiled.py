"""The compiled encoder pass (`run.compile`): the backbone's training forward through `torch.compile`.

At batch 64 a GPU step is paced by the host: about 1,000 kernel launches (docs/performance.md). The
compiler fuses each layer's element-wise chains (bias and GELU, dropout, residual and LayerNorm, the
attention's scaling and mask) into few kernels, and `reduce-overhead` replays the whole pass as one CUDA
graph. It is compiled once a run, for each shape it meets: CUDA graphs need fixed shapes, so every
training pass is padded to a length bucket (`bucket_width`: at most `MAX_BUCKETS` widths up to
`model.max_length`) and cut back afterwards; padded positions are masked out, so the real positions'
states are those of the unpadded pass up to float rounding (tests/runs/test_compiled.py). Evaluation and
passes without gradients run the eager forward (they would only add shapes to compile).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from csekit.encoding.packed_fixed import LayerStack, run_layer_stack

AUTO_MODE = "reduce-overhead"
"""What `run.compile: auto` compiles when it pays: CUDA graphs over the bucketed packed pass."""

BREAK_EVEN_STEPS = {64: 5_800, 512: 11_700}
"""Steps after which CUDA graphs over the bucketed packed pass repay their compile, by batch size (docs/
performance.md, "On a GPU III, second run", an H200 in bf16: a 55-77 s compile against 13.1 ms saved a step at
batch 64 and 4.7 ms at 512, each against `auto`'s eager fused step)."""


def break_even_steps(batch_size: int) -> int:
    """`BREAK_EVEN_STEPS` for any batch: interpolated in log2(batch) between the measured sizes, the nearer
    measured one outside them (a longer compile, shapes beyond those measured, is not guessed cheaper)."""
    sizes = sorted(BREAK_EVEN_STEPS)
    low, high = sizes[0], sizes[-1]
    if batch_size <= low or batch_size >= high:
        return BREAK_EVEN_STEPS[low if batch_size <= low else high]
    share = (math.log2(batch_size) - math.log2(low)) / (math.log2(high) - math.log2(low))
    return round(BREAK_EVEN_STEPS[low] + share * (BREAK_EVEN_STEPS[high] - BREAK_EVEN_STEPS[low]))


def graphs_repay(planned_steps: int | None, batch_size: int) -> bool:
    """Whether a run of `planned_steps` steps of `batch_size` sentences (per process) is long enough for CUDA
    graphs to repay their compile (None: the length is not known yet, so no)."""
    return planned_steps is not None and planned_steps >= break_even_steps(batch_size)


def auto_bucket(batch_size: int, max_length: int) -> int:
    """`run.packed_bucket` when `run.compile: auto` compiles: 256 tokens for each 128 sentences of a batch at max
    length 32 (benchmarks/gpu_throughput.py's, measured at batch 64 and 512: a few buckets cover a random batch's
    token count), scaled with the max length and a multiple of 8."""
    tokens = 256 * max(1, batch_size // 128) * max(1, math.ceil(max_length / 32))
    return 8 * math.ceil(tokens / 8)


COMPILE_BACKEND = "inductor"
"""torch.compile's backend for `run.compile` (tests use a cheaper one where inductor's C++ builds take minutes)."""

MAX_BUCKETS = 8
"""Training passes come in at most this many widths (torch.compile's default recompile limit is 8)."""

SEQUENCE_INPUTS = ("input_ids", "attention_mask", "token_type_ids", "position_ids", "inputs_embeds")
"""The backbone inputs that have one entry per position (dimension 1), padded to the bucket."""


def bucket_width(max_length: int) -> int:
    """The bucket step: a multiple of 8 that splits `max_length` into at most `MAX_BUCKETS` widths."""
    return 8 * math.ceil(max_length / (8 * MAX_BUCKETS))


def pad_to_bucket(inputs: dict[str, Any], bucket: int, pad_token_id: int) -> tuple[dict[str, Any], int]:
    """`inputs` right-padded along the positions to the next multiple of `bucket`, and the original width."""
    reference = _width_reference(inputs)
    if reference is None:
        return inputs, -1
    width = reference.shape[1]
    extra = -width % bucket
    if extra == 0:
        return inputs, width
    padded = dict(inputs)
    for key in SEQUENCE_INPUTS:
        value = padded.get(key)
        if key == "attention_mask" and isinstance(value, Tensor) and value.dim() == 4:
            padded[key] = _pad_ready_mask(value, extra)
        elif isinstance(value, Tensor) and value.dim() >= 2 and value.shape[1] == width:
            fill = pad_token_id if key == "input_ids" else 0
            # (0, 0) per trailing dimension, then the positions' (0, extra)
            padded[key] = nn.functional.pad(value, (0, 0) * (value.dim() - 2) + (0, extra), value=fill)
    return padded, width


def _width_reference(inputs: dict[str, Any]) -> Tensor | None:
    """An input whose dimension 1 is the positions: the ids or embeddings, else a 2-D mask (a ready 4-D mask's
    dimension 1 is its heads)."""
    for key in ("input_ids", "inputs_embeds", "attention_mask"):
        value = inputs.get(key)
        if isinstance(value, Tensor) and value.dim() >= 2 and not (key == "attention_mask" and value.dim() == 4):
            return value
    return None


def _pad_ready_mask(mask: Tensor, extra: int) -> Tensor:
    """A ready 4-D mask [B, 1, L, L] (`encoding/ready_mask.py`) padded by `extra` positions: the new keys masked
    for every query, the new queries (whose outputs are cut) attending to every key, so none is all masked."""
    if mask.dtype == torch.bool:
        keys_masked, rows_open = False, True
    else:  # additive: 0 attends, the dtype's minimum masks
        keys_masked, rows_open = torch.finfo(mask.dtype).min, 0.0
    keys = nn.functional.pad(mask, (0, extra), value=keys_masked)
    return nn.functional.pad(keys, (0, 0, 0, extra), value=rows_open)


def _cut(value: Any, width: int, padded_width: int) -> Any:
    """A backbone output's tensors cut back from `padded_width` positions to `width` (others unchanged)."""
    if isinstance(value, Tensor):
        return value[:, :width] if value.dim() >= 2 and value.shape[1] == padded_width else value
    if isinstance(value, tuple):
        return tuple(_cut(item, width, padded_width) for item in value)
    return value


class CompiledTrainingForward:
    """Stands in for a backbone's `forward`: in training with gradients, the compiled forward on inputs padded
    to a length bucket (outputs cut back); otherwise the eager forward."""

    def __init__(self, backbone: nn.Module, mode: str, bucket: int, backend: str | Callable[..., Any]) -> None:
        self.backbone = backbone
        self.eager = backbone.forward
        self.bucket = bucket
        self.pad_token_id = int(getattr(backbone.config, "pad_token_id", None) or 0)
        options = {"mode": mode} if backend == "inductor" else {}
        self.compiled = torch.compile(self.eager, backend=backend, dynamic=False, **options)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if args or not (self.backbone.training and torch.is_grad_enabled()):
            return self.eager(*args, **kwargs)
        padded, width = pad_to_bucket(kwargs, self.bucket, self.pad_token_id)
        outputs = self.compiled(**padded)
        padded_width = _width_reference(padded).shape[1]  # type: ignore[union-attr]
        if width == padded_width or width < 0:
            return outputs
        for key, value in list(outputs.items()):
            outputs[key] = _cut(value, width, padded_width)
        return outputs


def compile_layer_stack(mode: str, backend: str | Callable[..., Any] | None = None) -> LayerStack:
    """The fixed-shape packed pass's layer stack (`run.packed_bucket`) through `torch.compile` (`run.compile`):
    its shapes repeat across steps, so it is compiled (and its CUDA graphs recorded) once a token bucket."""
    backend = backend or COMPILE_BACKEND
    options = {"mode": mode} if backend == "inductor" else {}
    return torch.compile(run_layer_stack, backend=backend, dynamic=False, **options)  # type: ignore[return-value]


def compile_backbone(
    backbone: nn.Module, mode: str, max_length: int, backend: str | Callable[..., Any] | None = None
) -> None:
    """Compile `backbone`'s training forward (`run.compile`: `mode`); parameters and saved weights unchanged."""
    compiled = CompiledTrainingForward(backbone, mode, bucket_width(max_length), backend or COMPILE_BACKEND)
    backbone.forward = compiled  # type: ignore[method-assign]

"""One encoder pass measured for comparison: its pooled vectors, real tokens' states and every gradient.

tests/unit/encoding/test_packed_fixed.py compares the packed pass's forms with this on a CPU, and the prepared
GPU command's checks stage (benchmarks/gpu_paths.py) compares every path `run: auto` takes or may take on CUDA
against an fp32 padded reference with it, so that a CPU test and a GPU check measure the same thing the same way. The
loss weights are drawn on the CPU and moved, so every device sees the same loss.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from csekit.encoding.encoder import SentenceEncoder
from csekit.encoding.passes import PassPlan

PassResults = tuple[Tensor, Tensor | None, dict[str, Tensor], list[tuple[int, ...]]]
"""Pooled vectors (fp32), real tokens' states (or None), each parameter's gradient (fp32), and the shapes the
first layer's feed-forward saw (BERT-like backbones; empty for others)."""


def loss_weights(shape: torch.Size | tuple[int, ...], device: torch.device) -> Tensor:
    """The fixed random weights of the pooled vectors' loss, drawn on the CPU (the same on every device)."""
    return torch.randn(tuple(shape), generator=torch.Generator().manual_seed(1)).to(device)


def first_feed_forward(encoder: SentenceEncoder) -> nn.Module | None:
    """The first layer's feed-forward module of a BERT-like backbone, or None (a decoder, a LoRA-wrapped one)."""
    layers = getattr(getattr(encoder.backbone, "encoder", None), "layer", None)
    module = getattr(layers[0], "intermediate", None) if isinstance(layers, nn.ModuleList) and layers else None
    return module if isinstance(module, nn.Module) else None


def pass_results(
    encoder: SentenceEncoder, inputs: dict[str, Tensor], plan: PassPlan | None = None, token_states: bool = False
) -> PassResults:
    """One pass of `encoder` on `inputs` as `plan` says (None: padded) and the backward of a fixed loss on the
    pooled vectors (and the real tokens' states): what it computed, every gradient, the feed-forward's shapes."""
    encoder.zero_grad(set_to_none=True)
    shapes: list[tuple[int, ...]] = []
    feed_forward = first_feed_forward(encoder)
    handle = (
        feed_forward.register_forward_pre_hook(lambda module, args: shapes.append(tuple(args[0].shape)))
        if feed_forward is not None
        else None
    )
    try:
        output = encoder(inputs, token_states=token_states, plan=plan or PassPlan())
    finally:
        if handle is not None:
            handle.remove()
    pooled = output.pooled.float()
    loss = (pooled * loss_weights(pooled.shape, pooled.device)).sum()
    states = None
    if token_states:
        states = output.token_states.float() * inputs["attention_mask"][..., None]
        loss = loss + states.pow(2).sum()
        states = states.detach()
    loss.backward()
    grads = {name: p.grad.float().clone() for name, p in encoder.named_parameters() if p.grad is not None}
    return pooled.detach(), states, grads, shapes


def drift(expected: PassResults, actual: PassResults) -> dict[str, float]:
    """How far `actual` is from `expected`: the pooled vectors' largest difference over the reference's largest
    entry, and the gradients' relative L2 distance over every parameter (their names must match)."""
    (pooled, _, grads, _), (other_pooled, _, other_grads, _) = expected, actual
    if grads.keys() != other_grads.keys():
        missing = sorted(grads.keys() ^ other_grads.keys())
        raise ValueError(f"the passes have gradients for different parameters, e.g. {missing[:3]}")
    reference = torch.cat([grads[name].flatten().cpu() for name in sorted(grads)])
    other = torch.cat([other_grads[name].flatten().cpu() for name in sorted(grads)])
    scale = pooled.abs().max().item()
    return {
        "pooled_max_relative": (other_pooled - pooled).abs().max().item() / scale,
        "pooled_scale": scale,
        "grad_relative": ((other - reference).norm() / reference.norm()).item(),
    }

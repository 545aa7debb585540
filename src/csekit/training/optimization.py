"""One optimisation step: AdamW's parameter groups and the forward/backward pass the loop and the benchmarks time."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType

from csekit.parts.hooks import own_learning_rate
from csekit.training.chunked import average_gradients, chunked_forward_backward
from csekit.training.compute_copies import ComputeCopies
from csekit.training.model import ContrastiveModel
from csekit.training.recipe import Recipe


def _param_groups(model: ContrastiveModel, recipe: Recipe) -> list[dict[str, Any]]:
    """AdamW groups: parts may set their own `learning_rate`; biases and norms get no weight decay."""
    groups: dict[tuple[float, float], list[torch.nn.Parameter]] = {}
    seen: set[int] = set()
    for module_name, module in model.named_modules():
        owner_lr = _inherited_lr(model, module_name, recipe.train.lr)
        for name, param in module.named_parameters(recurse=False):
            if not param.requires_grad or id(param) in seen:
                continue
            seen.add(id(param))
            decay = 0.0 if (name.endswith("bias") or "norm" in module_name.lower()) else recipe.train.weight_decay
            groups.setdefault((owner_lr, decay), []).append(param)
    return [{"params": params, "lr": lr, "weight_decay": decay} for (lr, decay), params in groups.items()]


class UncorrectedAdamW(torch.optim.Optimizer):
    """AdamW without bias correction, eps 1e-6: transformers 3.x's `AdamW(correct_bias=False)`.

    sentence-transformers 0.3.x (ConSERT's and SLT-FAI's code: `optimizer_params={'lr': ..., 'eps':
    1e-6, 'correct_bias': False}`) trains with it; torch's AdamW always corrects the bias. Per step t:
    m = b1 m + (1 - b1) g, v = b2 v + (1 - b2) g^2, p -= lr m / (sqrt(v) + eps), then (decoupled
    decay, after the update as transformers does) p -= lr wd p. Without the correction the first
    steps are about (1 - b1) / sqrt(1 - b2) = 3.2 times smaller than torch's.
    """

    def __init__(
        self,
        params: Any,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
    ) -> None:
        if lr < 0 or eps < 0 or weight_decay < 0 or not all(0 <= beta < 1 for beta in betas):
            raise ValueError(f"UncorrectedAdamW: invalid lr {lr}, betas {betas}, eps {eps} or decay {weight_decay}")
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self.state[param]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
                state["step"] += 1
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                exp_avg.mul_(beta1).add_(param.grad, alpha=1.0 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(param.grad, param.grad, value=1.0 - beta2)
                param.addcdiv_(exp_avg, exp_avg_sq.sqrt().add_(group["eps"]), value=-group["lr"])
                if group["weight_decay"] > 0:
                    param.add_(param, alpha=-group["lr"] * group["weight_decay"])
        return loss


def make_optimizer(model: ContrastiveModel, recipe: Recipe) -> torch.optim.Optimizer:
    """The recipe's optimizer over its parameter groups: torch's fused AdamW unless it names another.

    The default (for-loop) AdamW took 73 ms a step for MiniLM's 22.7M parameters on the 2-core
    development machine, the fused one 15 ms; the transformers Trainer uses the fused one too.
    """
    groups = _param_groups(model, recipe)
    if recipe.train.optimizer == "adamw_uncorrected":
        return UncorrectedAdamW(groups, lr=recipe.train.lr)
    return torch.optim.AdamW(groups, lr=recipe.train.lr, fused=True)


def forward_backward(
    accelerator: Accelerator,
    model: torch.nn.Module,
    batch: dict[str, Any],
    max_grad_norm: float | None,
    step: int = 0,
    steps_per_epoch: int | None = None,
    chunk_size: int | None = None,
    copies: ComputeCopies | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
    """A step's loss and parts, back-propagated, and the gradient norm before clipping.

    `batch` is what `TrainCollator` makes. The loop decides what to do with the results (skip a
    non-finite step, or step AdamW); the benchmarks call this too, so they time the loop's own step.
    With `chunk_size` (`run.chunk_size`) the encoder holds that many rows' activations at a time
    (`csekit.training.chunked`); the loss, parts and gradients are the same. With `copies` (`run.compute_copies`)
    the forward and backward run on half-precision copies of the linear weights and the gradients reach the fp32
    masters, which are clipped and stepped as always (`csekit.training.compute_copies`).
    """
    if chunk_size is not None:
        loss, parts = chunked_forward_backward(accelerator, model, batch, chunk_size, step, steps_per_epoch, copies)
    elif copies is None:
        loss, parts = model(
            batch["inputs"], batch["sentences"], batch["fields"], step=step, steps_per_epoch=steps_per_epoch
        )
        accelerator.backward(loss)
    else:
        # DDP's gradient hooks are on the masters, which the backward does not reach: one average after it instead.
        several = accelerator.num_processes > 1
        with accelerator.no_sync(model) if several else contextlib.nullcontext(), copies.in_use():
            loss, parts = model(
                batch["inputs"], batch["sentences"], batch["fields"], step=step, steps_per_epoch=steps_per_epoch
            )
            accelerator.backward(loss)
        if several:
            average_gradients(list(model.parameters()), accelerator.num_processes)
    return loss, parts, gradient_norm(accelerator, model.parameters(), max_grad_norm)


NORM_ONLY_DISTRIBUTIONS = (DistributedType.NO, DistributedType.MULTI_CPU, DistributedType.MULTI_GPU)
"""Where a gradient's norm is its local gradients' norm (not sharded: FSDP, DeepSpeed and XLA clip their own way)."""


def gradient_norm(
    accelerator: Accelerator, parameters: Iterable[torch.nn.Parameter], max_grad_norm: float | None
) -> torch.Tensor:
    """The gradients' norm before clipping, the gradients clipped to `max_grad_norm` where it is set.

    With clipping off (`train.max_grad_norm: null`) only the norm is computed: clipping at infinity multiplies
    every gradient by 1.0, a pass over all of them for nothing (the same gradients and norm, bit for bit).
    """
    total_norm = getattr(torch.nn.utils, "get_total_norm", None)  # torch >= 2.6
    if max_grad_norm is not None or total_norm is None or accelerator.distributed_type not in NORM_ONLY_DISTRIBUTIONS:
        norm = accelerator.clip_grad_norm_(parameters, max_grad_norm or float("inf"))
        # FSDP2: the norm over every process's shards, as a replicated DTensor; its value, the same everywhere
        full_tensor = getattr(norm, "full_tensor", None)
        return full_tensor() if callable(full_tensor) else norm
    accelerator.unscale_gradients()  # fp16: the scaler's factor out first, as clip_grad_norm_ does
    return total_norm([p.grad for p in parameters if p.grad is not None], 2.0)


def _inherited_lr(model: torch.nn.Module, module_name: str, default: float) -> float:
    """The `learning_rate` of the module or its nearest enclosing module that sets one, else the recipe's lr."""
    parts = module_name.split(".") if module_name else []
    for depth in range(len(parts), 0, -1):
        owner = model.get_submodule(".".join(parts[:depth]))
        own = own_learning_rate(owner)
        if own is not None:
            return own
    return default

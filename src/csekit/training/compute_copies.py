"""Half-precision compute copies of the trained weights (`run.compute_copies`): a step's forward casts no weight.

Under autocast every linear layer casts its fp32 weight and bias to the run's half precision in each forward
(`aten::to`, `aten::_to_copy`: autocast keeps a cast for one autocast region only) and casts their gradients
back to fp32 in the backward (`ToCopyBackward0`). On an H200 at batch 64 those casts were the largest share of
the operator calls the host dispatches a step (docs/performance.md, "On a GPU III"). With compute copies:

* every trainable fp32 weight held by linear layers only (the products autocast runs in half precision;
  embeddings and LayerNorm compute in fp32 under autocast and keep their weights) has a copy in the run's half
  precision, a leaf that takes gradients;
* during a step's forward and backward (`ComputeCopies.in_use`) the linear layers hold the copies: autocast
  finds their weights in half precision and casts none, and their gradients, in half precision as autocast's
  cast received them, land on the copies;
* after the backward (after each one, in a chunked step) the copies' gradients reach the fp32 masters' `.grad`
  in one multi-tensor copy (`torch._foreach_copy_`), into a flat fp32 buffer kept across steps;
* after each optimizer step (a step hook on the optimizer) the copies are refreshed from the masters in one
  multi-tensor copy.

Outside a step every module holds its fp32 master: gradient clipping reads fp32 gradients, AdamW and its state
are unchanged, a checkpoint holds the masters only (a resume rebuilds the copies from them), and dev scoring,
best/ and last/ see the fp32 weights. A copy is the cast autocast makes (round to nearest), and a master's
gradient is the half-precision gradient in fp32, as autocast's backward makes it: a step is autocast's step
(tests/runs/test_compute_copies.py). Frozen weights (LoRA's base) get no copy: `model.weights_dtype` stores them.
peft casts a LoRA layer's input to its adapter weight's dtype before the adapter's dropout; during a step it casts
to the master's (fp32), as without copies: on a half-precision input the dropout would otherwise scale in half
precision (1/0.9 rounded to bf16 is 1.109), and LoRA's products would not be autocast's.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn

from csekit.core.errors import CsekitError

HALF_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
"""The precisions compute copies are made in (the run's autocast dtype)."""

READS_TRAINED_WEIGHTS = {
    "recall": "its pull towards the pre-trained weights reads the weights inside the step, where the linear "
    "layers hold the half-precision copies",
    "momentum_queue": "its momentum encoder's update reads the weights inside the step, where the linear layers "
    "hold the half-precision copies",
}
"""Parts that read the trained weights themselves during a step (not through a layer's forward): refused."""


def check_parts_for_copies(part_names: list[tuple[str, object]]) -> None:
    """Refuse, in one line naming the recipe key, a part that reads the trained weights during the step."""
    for label, _ in part_names:
        name = label.rsplit("(", 1)[-1].rstrip(")")
        if name in READS_TRAINED_WEIGHTS:
            raise CsekitError(
                f"recipe key run.compute_copies: true cannot run {label}: {READS_TRAINED_WEIGHTS[name]}; use auto or "
                "false"
            )


def _linear_held(model: nn.Module) -> dict[int, tuple[nn.Parameter, list[tuple[nn.Module, str]]]]:
    """Each trainable fp32 parameter held by linear layers only, with every (module, name) that holds it."""
    holders: dict[int, tuple[nn.Parameter, list[tuple[nn.Module, str]]]] = {}
    elsewhere: set[int] = set()
    for module in model.modules():
        for name, parameter in module._parameters.items():
            if parameter is None:
                continue
            if not isinstance(module, nn.Linear):
                elsewhere.add(id(parameter))  # tied to an embedding, say: autocast leaves that use in fp32
                continue
            holders.setdefault(id(parameter), (parameter, []))[1].append((module, name))
    return {
        key: held
        for key, held in holders.items()
        if key not in elsewhere and held[0].requires_grad and held[0].dtype == torch.float32
    }


class ComputeCopies:
    """The half-precision copies of a model's linear weights, their fp32 masters and the masters' gradient buffer.

    `optimizer` (torch's, or accelerate's wrapper of it) steps the masters; after each of its steps the copies are
    refreshed. Only parameters it holds get copies.
    """

    def __init__(self, model: nn.Module, optimizer: Any, precision: str) -> None:
        torch_optimizer = getattr(optimizer, "optimizer", optimizer)
        stepped = {id(p) for group in torch_optimizer.param_groups for p in group["params"]}
        held = [held for key, held in _linear_held(model).items() if key in stepped]
        self.masters: list[nn.Parameter] = [parameter for parameter, _ in held]
        self.holders: list[list[tuple[nn.Module, str]]] = [places for _, places in held]
        dtype = HALF_DTYPES[precision]
        self.copies: list[nn.Parameter] = [
            nn.Parameter(master.detach().to(dtype), requires_grad=True) for master in self.masters
        ]
        sizes = [master.numel() for master in self.masters]
        device = self.masters[0].device if self.masters else torch.device("cpu")
        flat = torch.zeros(sum(sizes), dtype=torch.float32, device=device)
        self.gradients = [part.view_as(m) for part, m in zip(flat.split(sizes), self.masters, strict=True)]
        self._fresh: list[bool] = []
        self._tuner_layers = [module for module in model.modules() if hasattr(module, "_cast_input_dtype")]
        self._versions = self._master_versions()
        torch_optimizer.register_step_post_hook(lambda *args: self.refresh())

    def _master_versions(self) -> list[int]:
        return [master._version for master in self.masters]

    @torch.no_grad()
    def refresh(self) -> None:
        """The copies from the masters, in one multi-tensor copy (after an optimizer step)."""
        if self.masters:
            torch._foreach_copy_(self.copies, self.masters)
        self._versions = self._master_versions()

    @contextlib.contextmanager
    def in_use(self) -> Iterator[None]:
        """During the block the linear layers hold the copies; afterwards the masters, with the copies' gradients.

        The masters changed elsewhere since the last refresh (a checkpoint read, a test) refresh the copies first.
        """
        if self._master_versions() != self._versions:
            self.refresh()
        self._fresh = [master.grad is None for master in self.masters]  # the first gradient is copied, later added
        self._hold(self.copies)
        try:
            yield
        except BaseException:
            self._hold(self.masters)
            for copy in self.copies:
                copy.grad = None  # a failed step's gradients must not reach the next one
            raise
        self._hold(self.masters)
        self.fold()

    def _hold(self, parameters: list[nn.Parameter]) -> None:
        """The linear layers hold `parameters` (the copies or the masters); peft's input cast is off on the copies."""
        for parameter, places in zip(parameters, self.holders, strict=True):
            for module, name in places:
                module._parameters[name] = parameter
        for layer in self._tuner_layers:
            if parameters is self.copies:
                layer._cast_input_dtype = functools.partial(_cast_as_masters, layer)
            else:
                layer.__dict__.pop("_cast_input_dtype", None)

    def fold(self) -> None:
        """The copies' gradients so far into the masters' fp32 `.grad` (copied at a master's first, added later)."""
        copy_to: list[Tensor] = []
        copied: list[Tensor] = []
        add_to: list[Tensor] = []
        added: list[Tensor] = []
        for index, (master, copy) in enumerate(zip(self.masters, self.copies, strict=True)):
            gradient = copy.grad
            if gradient is None:
                continue
            if self._fresh[index]:
                master.grad = self.gradients[index]
                copy_to.append(self.gradients[index])
                copied.append(gradient)
                self._fresh[index] = False
            else:
                add_to.append(master.grad)  # type: ignore[arg-type]  # set by an earlier fold
                added.append(gradient)
            copy.grad = None  # the next backward's gradient is then stolen, not added in half precision
        if copy_to:
            torch._foreach_copy_(copy_to, copied)
        if add_to:
            torch._foreach_add_(add_to, added)


def _cast_as_masters(layer: nn.Module, x: Any, dtype: torch.dtype) -> Any:
    """peft's cast of a LoRA layer's input, to fp32 where the adapter's weight is a half-precision copy."""
    return type(layer)._cast_input_dtype(layer, x, torch.float32 if dtype in HALF_DTYPES.values() else dtype)


def use_compute_copies(setting: bool | str, precision: str, compile_mode: str, auto: bool) -> bool:
    """Whether the run keeps compute copies (`run.compute_copies`; `auto`: what auto means on this device, decided
    in `csekit.training.execution`). `true` is refused in one line where it cannot run."""
    if setting == "auto":
        return auto and precision in HALF_DTYPES
    if setting is False:
        return False
    if precision not in HALF_DTYPES:
        raise CsekitError(
            f"recipe key run.compute_copies: true needs train.precision bf16 or fp16 (this run's is {precision}: "
            "nothing is cast); set it to auto or false"
        )
    if compile_mode not in ("none", "auto"):
        raise CsekitError(
            f"recipe key run.compute_copies: true does not run with run.compile {compile_mode} (its compiled graph "
            "casts the weights without a call each); choose one"
        )
    return True

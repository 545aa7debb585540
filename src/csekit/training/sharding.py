"""Sharded training: accelerate's FSDP2 (`fully_shard`) as an accelerate config file asks for it.

`accelerate launch --config_file configs/accelerate-fsdp.yaml` tells the processes through the environment
(ACCELERATE_USE_FSDP, FSDP_*); accelerate shards the model in `prepare`. What changes for csekit:

- accelerate 1.15 picks FSDP only for GPU-like devices (AcceleratorState: FSDP is considered for MULTI_GPU,
  MULTI_XPU, ... but never MULTI_CPU), so on CPU processes it would silently train with DDP instead. torch's
  `fully_shard` runs on CPU processes with gloo, so csekit selects accelerate's FSDP mode there itself
  (`shard_cpu_processes`): the sharded path is then the one a GPU run takes.
- The parameters are shards (DTensors): dev scoring, best/ and last/ and the checkpoint's weights use the full
  model, gathered from every process into a plain copy on the main process (`FullModel`).
- The packed pass drives each layer's parts itself (FSDP gathers a layer's weights in its forward): padded
  passes instead. Sync-free steps, chunked passes and compiled forwards are refused if asked for (not proven
  sharded), left off if `auto`: decided with every other execution setting, in
  `csekit.training.execution.decide_execution`, from the sharding the launch asks for (`requested_sharding`),
  before any process-group work; the launch's own settings are checked there too (`check_sharding_request`:
  FSDP1 refused with the reason, DeepSpeed's installation and settings), and the Accelerator built after it must
  run the sharding decided (`active_sharding`).
- DeepSpeed ZeRO (stages 1 to 3) is the other sharded mode: its settings and refusals in
  `csekit.training.zero`, its whole weights and optimizer state in `csekit.training.zero_state`.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Mapping
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState, PartialState
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

from csekit.core.errors import CsekitError
from csekit.training.model import ContrastiveModel
from csekit.training.optimization import make_optimizer
from csekit.training.processes import has_gpu, several_cpu_processes
from csekit.training.recipe import Recipe
from csekit.training.run_folder import TrainerState
from csekit.training.zero import check_deepspeed_request, deepspeed_accelerator_options

SHARDED = {DistributedType.FSDP: "fsdp", DistributedType.DEEPSPEED: "deepspeed"}
"""accelerate's sharded modes, by the name `requested_sharding` and `Execution.sharding` give them."""
SHARDED_NAMES = "FSDP or DeepSpeed"


def _flag(name: str, environ: Mapping[str, str]) -> bool:
    return environ.get(name, "false").lower() in ("1", "true", "yes")


def requested_sharding(environ: Mapping[str, str] | None = None) -> str | None:
    """What the accelerate config of this launch asks for: "fsdp", "deepspeed" or None (plain data parallel).
    `environ`: the launch's environment (by default this process's, where `accelerate launch` puts it)."""
    env = os.environ if environ is None else environ
    if _flag("ACCELERATE_USE_DEEPSPEED", env):
        return "deepspeed"
    if _flag("ACCELERATE_USE_FSDP", env):
        return "fsdp"
    return None


def check_sharding_request(
    max_grad_norm: float | None, precision: str, environ: Mapping[str, str] | None = None
) -> None:
    """Refuse, before any process group work, a sharding this csekit cannot run (one line, the reason and the fix).

    Called by `csekit.training.execution.decide_execution` only, with the recipe's refusals under sharding."""
    env = os.environ if environ is None else environ
    asked = requested_sharding(env)
    if asked == "deepspeed":
        check_deepspeed_request(max_grad_norm, precision, env)
    if asked == "fsdp" and env.get("FSDP_VERSION", "1") != "2":
        raise CsekitError(
            "the accelerate config asks for FSDP version 1; csekit trains with FSDP2: set fsdp_version: 2 in its "
            "fsdp_config (see configs/accelerate-fsdp.yaml)"
        )


def accelerator_options(max_grad_norm: float | None) -> dict[str, Any]:
    """This launch's `Accelerator` arguments: DeepSpeed's (`csekit.training.zero`), else accelerate's multi-CPU
    (gloo) mode where several processes run without a GPU (FSDP included: `shard_cpu_processes`)."""
    if requested_sharding() == "deepspeed":
        return deepspeed_accelerator_options(max_grad_norm, on_cpu=not has_gpu())
    return {"cpu": several_cpu_processes()}


def shard_cpu_processes(accelerator: Accelerator) -> None:
    """On CPU processes (gloo), put accelerate in the FSDP mode its config asked for, which it leaves for GPUs.

    accelerate 1.15 keeps MULTI_CPU there and would train every process with the whole model (DDP) without a
    word. Its FSDP2 preparation (`fsdp2_prepare_model`: `fully_shard` on the default device mesh) runs on CPUs.
    """
    if requested_sharding() != "fsdp" or accelerator.distributed_type != DistributedType.MULTI_CPU:
        return
    state = AcceleratorState()
    state.fsdp_plugin = FullyShardedDataParallelPlugin()  # its settings from the launch's FSDP_* variables
    state.distributed_type = DistributedType.FSDP
    # As AcceleratorState does for GPUs: every later AcceleratorState() copies the process state's type back in.
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP


def active_sharding(accelerator: Accelerator) -> str | None:
    """The sharding `accelerator` trains under ("fsdp", "deepspeed"), or None: the one `decide_execution` decided
    from the launch's request, as `csekit.training.execution.start_execution` checks."""
    return SHARDED.get(accelerator.distributed_type)


READS_SHARDED_WEIGHTS = {
    "recall": "it reads the backbone's weights outside their layers' forward, where FSDP holds only shards",
    "momentum_queue": "its momentum encoder's update reads the backbone's weights outside their layers' forward",
    "tsdae": "its decoder shares the encoder's weights across FSDP's shard units",
}
"""Parts that read the trained weights themselves (not through a layer's forward): not proven sharded."""


def ready_to_shard(model: ContrastiveModel) -> None:
    """Refuse the parts FSDP would break (one line naming the recipe key), then let accelerate's
    TRANSFORMER_BASED_WRAP find the backbone's layers (and a helper model's of the same kind): it reads
    `_no_split_modules` from the model it prepares."""
    for label, _ in model.part_names:
        name = label.rsplit("(", 1)[-1].rstrip(")")
        if name in READS_SHARDED_WEIGHTS:
            raise CsekitError(
                f"recipe key {label}: not supported under {SHARDED_NAMES} yet: {READS_SHARDED_WEIGHTS[name]}"
            )
    layers = getattr(model.encoder.backbone, "_no_split_modules", None)
    if layers and getattr(model, "_no_split_modules", None) is None:
        model._no_split_modules = list(layers)  # type: ignore[assignment]


class FullModel:
    """A plain (unsharded) copy of the trained model on the main process, refreshed from the shards on demand.

    Dev scoring, best/ and last/ and the checkpoint's weights read it; it lives on the CPU between uses, so the
    main process's accelerator holds only its shards while training.
    """

    def __init__(self, accelerator: Accelerator, model: torch.nn.Module) -> None:
        self.accelerator = accelerator
        self.copy = copy.deepcopy(model).to("cpu") if accelerator.is_main_process else None

        self.step: int | None = None  # the step its weights are from
        self.prepared: torch.nn.Module | None = None

    def at_step(self, prepared: torch.nn.Module, step: int) -> torch.nn.Module | None:
        """The main process's copy with the weights of `step`; gathered from every process (all must call it at
        the same step) the first time, else as it is. None on the other processes."""
        self.prepared = prepared
        if self.step != step:
            state = self._gathered(prepared)
            if self.copy is not None:
                self.copy.load_state_dict(state, strict=True)
            self.step = step
        return self.copy

    def _gathered(self, prepared: torch.nn.Module) -> Mapping[str, torch.Tensor]:
        """The whole model's weights (every process calls it), on the CPU of the main process."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        # Not accelerate's get_state_dict: in 1.15 it returns the shards (DTensors) under FSDP2.
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)  # the whole, on the main process
        return get_model_state_dict(prepared, options=options)

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> GatheredOptimizer:
        """The optimizer's whole state (every process must call it), keyed like a plain optimizer's own state_dict.

        torch gives it keyed by parameter names; renumbered in the order of the optimizer's groups, it is what
        the same optimizer over the unsharded model holds, so a checkpoint is one format sharded or not.
        """
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        assert self.prepared is not None
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        named = get_optimizer_state_dict(self.prepared, optimizer, options=options)
        return GatheredOptimizer(_numbered(named) if self.accelerator.is_main_process else {})

    def resume(
        self,
        read: Callable[[torch.nn.Module | None, torch.optim.Optimizer | None], TrainerState | None],
        prepared: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        recipe: Recipe,
    ) -> TrainerState | None:
        """Resume the shards from a checkpoint (every process calls it): the main process reads the weights and
        the optimizer state into its copy and a plain optimizer over it (checked as an unsharded run's are),
        then sends every process its shards. `read` is `read_checkpoint` for the given model and optimizer."""
        self.prepared = prepared
        plain = make_optimizer(self.copy, recipe) if self.copy is not None else None  # type: ignore[arg-type]
        for mine, sharded in zip(plain.param_groups if plain else [], optimizer.param_groups, strict=False):
            # the schedule's initial_lr, and the settings a plain optimizer has (DeepSpeed's groups hold more)
            mine.update({key: value for key, value in sharded.items() if key in mine and key != "params"})
            mine.setdefault("initial_lr", sharded.get("initial_lr", mine["lr"]))
        failure: CsekitError | None = None
        try:
            state = read(self.copy, plain)
        except CsekitError as error:
            failure = error
        if self._on_any_process(failure is not None):  # else the others would wait for weights never sent
            raise failure or CsekitError("the main process could not read the checkpoint (its error above)")
        if state is None:
            return None
        self._send(optimizer, plain)
        self.step = state.step
        return state

    def _send(self, optimizer: torch.optim.Optimizer, plain: torch.optim.Optimizer | None) -> None:
        """Every process's shards of the main process's copy and plain optimizer (every process calls it)."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        assert self.prepared is not None
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        model_state = self.copy.state_dict() if self.copy is not None else {}
        set_model_state_dict(self.prepared, model_state, options=options)
        named = _named(plain.state_dict(), self.prepared, optimizer) if plain is not None else {}
        set_optimizer_state_dict(self.prepared, optimizer, named, options=options)

    def _on_any_process(self, flag: bool) -> bool:
        total = self.accelerator.reduce(torch.tensor(float(flag), device=self.accelerator.device), "sum")
        return bool(total.item() > 0)


class GatheredOptimizer:
    """A gathered optimizer state where checkpoint writing expects an optimizer (it calls `state_dict()`)."""

    def __init__(self, state: dict[str, Any]) -> None:
        self.state = state

    def state_dict(self) -> dict[str, Any]:
        return self.state


def _named(numbered: Mapping[str, Any], prepared: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """A plain optimizer's state (parameters numbered in group order) keyed by the prepared model's parameter
    names, as torch's `set_optimizer_state_dict` takes it (the inverse of `_numbered`)."""
    name_of = {id(param): name for name, param in prepared.named_parameters()}
    names = [name_of[id(param)] for group in optimizer.param_groups for param in group["params"]]
    groups, start = [], 0
    for group in numbered["param_groups"]:
        groups.append({**group, "params": names[start : start + len(group["params"])]})
        start += len(group["params"])
    return {"state": {names[number]: value for number, value in numbered["state"].items()}, "param_groups": groups}


def _numbered(named: Mapping[str, Any]) -> dict[str, Any]:
    """torch's full optimizer state (parameters named) as a plain optimizer's (parameters numbered 0, 1, ...)."""
    index: dict[str, int] = {}
    groups = []
    for group in named["param_groups"]:
        numbers = [index.setdefault(name, len(index)) for name in group["params"]]
        groups.append({**group, "params": numbers})
    state = {index[name]: value for name, value in named["state"].items()}
    return {"state": state, "param_groups": groups}

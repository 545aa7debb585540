"""The whole model and AdamW state of a DeepSpeed ZeRO run (stages 1-3), in csekit's one checkpoint format.

DeepSpeed's own checkpoints (what accelerate's `save_state` writes under DeepSpeed) are pickles, which csekit
does not load (`csekit.training.checkpoint`). So, as under FSDP, a checkpoint holds the whole weights and the
whole AdamW state keyed as an unsharded optimizer's: DeepSpeed's `safe_get_full_fp32_param` and
`safe_get_full_optimizer_state` assemble each parameter's fp32 weights and moments from the processes'
partitions; a resume reads the checkpoint on the main process (checked as any resume is), sends every process
the whole state, and each keeps its partition (`safe_set_full_*`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import torch
from accelerate import Accelerator

from csekit.training.sharding import FullModel, GatheredOptimizer


def full_model_for(accelerator: Accelerator, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> FullModel:
    """The plain copy of a sharded run's model: DeepSpeed's (`optimizer` not yet prepared) or FSDP's."""
    from accelerate.utils import DistributedType

    if accelerator.distributed_type == DistributedType.DEEPSPEED:
        return ZeroFullModel(accelerator, model, optimizer)
    return FullModel(accelerator, model)


def _zero(optimizer: Any) -> Any:
    """DeepSpeed's ZeRO optimizer inside accelerate's wrapper."""
    return getattr(optimizer, "optimizer", optimizer)


class ZeroFullModel(FullModel):
    """`FullModel` for DeepSpeed ZeRO: the fp32 master weights and AdamW's moments are split over the processes
    (at stage 3 the weights too); all of it is assembled per parameter, in the same order on every process."""

    def __init__(self, accelerator: Accelerator, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        super().__init__(accelerator, model)
        # The optimizer's parameters in its groups' order (DeepSpeed's groups hold flat partitions instead).
        self.params = [param for group in optimizer.param_groups for param in group["params"]]
        self.names: dict[int, list[str]] = {}  # every name of a parameter (a tied one has several)
        for name, param in model.named_parameters(remove_duplicate=False):
            self.names.setdefault(id(param), []).append(name)
        # A plain AdamW's group settings and sizes; the schedule adds initial_lr to the prepared groups.
        groups = optimizer.param_groups
        self.groups = [([key for key in group if key != "params"], len(group["params"])) for group in groups]

    def _gathered(self, prepared: torch.nn.Module) -> Mapping[str, torch.Tensor]:
        from deepspeed.utils import safe_get_full_fp32_param

        module = getattr(prepared, "module", prepared)
        main = self.accelerator.is_main_process
        with _whole(module, modifier_rank=None):  # ZeRO-3: the weights gathered from their partitions
            own = module.state_dict() if main else {}
            state = {name: value.detach().to("cpu", copy=True) for name, value in own.items()}
        for param in self.params:  # the same order on every process: each is a collective
            full = safe_get_full_fp32_param(param)  # the fp32 master weights (bf16 runs train a bf16 copy)
            if main and full is not None:
                for name in self.names[id(param)]:
                    state[name] = full.detach().to("cpu", copy=True)
        return state

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> GatheredOptimizer:
        """AdamW's whole state as a plain AdamW over the whole model holds it (every process must call it)."""
        from deepspeed.utils import safe_get_full_optimizer_state

        zero = _zero(optimizer)
        partition_states = [zero.optimizer.state.get(flat) for flat in _partitions(zero)]
        main = self.accelerator.is_main_process
        state: dict[int, dict[str, torch.Tensor]] = {}
        if partition_states and partition_states[0]:  # stepped at least once
            keys = [key for key in partition_states[0] if key != "step"]
            step = partition_states[0]["step"]
            for number, param in enumerate(self.params):
                moments = {key: safe_get_full_optimizer_state(param, key) for key in keys}
                if main:
                    entry = {"step": step.detach().to("cpu", copy=True)}
                    entry |= {key: value.detach().to("cpu", copy=True) for key, value in moments.items()}
                    state[number] = entry
        if not main:
            return GatheredOptimizer({})
        groups, start = [], 0
        for group, (keys, count) in zip(optimizer.param_groups, self.groups, strict=True):
            settings = {key: group[key] for key in (*keys, "initial_lr") if key in group}
            groups.append({**settings, "params": list(range(start, start + count))})
            start += count
        return GatheredOptimizer({"state": state, "param_groups": groups})

    def _send(self, optimizer: torch.optim.Optimizer, plain: torch.optim.Optimizer | None) -> None:
        """Every process gets the main process's weights and AdamW state; DeepSpeed keeps its partitions."""
        from deepspeed.utils import safe_set_full_fp32_param, safe_set_full_optimizer_state

        assert self.prepared is not None
        module = getattr(self.prepared, "module", self.prepared)
        source = self.copy.state_dict() if self.copy is not None else {}
        with _whole(module, modifier_rank=0):  # ZeRO-3: gathered, then partitioned again from the main process's
            whole = {name: _broadcast(source.get(name), value) for name, value in module.state_dict().items()}
            module.load_state_dict(whole, strict=True)  # the whole weights, every process
        moments = plain.state_dict()["state"] if plain is not None else {}
        zero = _zero(optimizer)
        flats = _partitions(zero)
        _create_state(zero.optimizer, flats)
        getattr(zero, "_lazy_init_hp_params_optimizer_state", lambda: None)()  # ZeRO 1 and 2 link to the state
        keys = [key for key in zero.optimizer.state[flats[0]] if key != "step"]
        steps = [entry["step"] for entry in moments.values()]  # one count: every parameter steps together
        step = _broadcast(torch.as_tensor(steps[0], dtype=torch.float32) if steps else None, torch.zeros(()))
        for number, param in enumerate(self.params):
            like = whole[self.names[id(param)][0]]
            safe_set_full_fp32_param(param, like.to(torch.float32))
            entry = moments.get(number, {})
            for key in keys:
                safe_set_full_optimizer_state(param, _broadcast(entry.get(key), like), key)
        for flat in flats:
            counter = zero.optimizer.state[flat]["step"]
            zero.optimizer.state[flat]["step"] = step.to(counter.device, counter.dtype)
        for number, group in enumerate(zero.optimizer.param_groups):
            # The learning rate the checkpoint's schedule left (a plain optimizer's load_state_dict restores it).
            saved = plain.param_groups[number] if plain is not None else {}
            rates = torch.tensor([saved.get("lr", 0.0), saved.get("initial_lr", 0.0)], dtype=torch.float64)
            group["lr"], group["initial_lr"] = (float(rate) for rate in _broadcast(rates if saved else None, rates))


def _partitions(zero: Any) -> list[torch.Tensor]:
    """This process's flat fp32 partitions, which torch's AdamW inside DeepSpeed keys its state by (ZeRO-3 hands
    them to its groups only for the step)."""
    flats = getattr(zero, "fp32_partitioned_groups_flat", None)
    return list(flats if flats is not None else zero.single_partition_of_fp32_groups)


def _whole(module: torch.nn.Module, modifier_rank: int | None) -> contextlib.AbstractContextManager[Any]:
    """ZeRO-3's parameters gathered whole for the block (written back from `modifier_rank`); a no-op at stages 1
    and 2, where every process holds the whole weights."""
    params = [param for param in module.parameters() if hasattr(param, "ds_id")]
    if not params:
        return contextlib.nullcontext()
    from deepspeed.runtime.zero.partition_parameters import GatheredParameters

    return GatheredParameters(params, modifier_rank=modifier_rank)


def _broadcast(value: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """The main process's `value` on every process (the others pass None; `like` gives the shape), floating
    point as fp32 (the master weights' precision)."""
    dtype = torch.float32 if like.dtype in (torch.float16, torch.bfloat16) else like.dtype
    source = value if value is not None else torch.zeros_like(like)
    buffer = source.detach().to("cpu", dtype=dtype, copy=True).contiguous()
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.broadcast(buffer, src=0)
    return buffer


def _create_state(inner: torch.optim.Optimizer, flats: list[torch.Tensor]) -> None:
    """AdamW's state for DeepSpeed's partitions (torch makes it at the first step) as torch's `_init_group` makes
    it, zero; the resume then writes the checkpoint's values into it."""
    group = inner.param_groups[0]
    on_device = bool(group.get("fused") or group.get("capturable"))
    names = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq") if group.get("amsgrad") else ("exp_avg", "exp_avg_sq")
    for flat in flats:
        if inner.state.get(flat):
            continue
        step = torch.zeros((), dtype=torch.float32, device=flat.device if on_device else "cpu")
        inner.state[flat] = {"step": step, **{name: torch.zeros_like(flat) for name in names}}

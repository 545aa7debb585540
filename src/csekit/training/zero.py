"""DeepSpeed ZeRO under accelerate: what an accelerate config file asks for, and what csekit runs of it.

`accelerate launch --config_file configs/accelerate-deepspeed.yaml` tells the processes through the environment
(ACCELERATE_USE_DEEPSPEED, ACCELERATE_DEEPSPEED_*); accelerate builds DeepSpeed's engine in `prepare`. csekit
trains under ZeRO stages 1 and 2 (AdamW's state, and at stage 2 the gradients, split over the processes; every
process keeps the whole weights), without offload, in fp32 or bf16. The rest is refused at start, one line each:
ZeRO-3 and offloading are not proven here (their checkpoints would need the weights gathered, too), and fp16's
loss scaler skips steps inside DeepSpeed where csekit's step count would not see it.

Two settings come from the recipe, not the config: gradient clipping (`train.max_grad_norm`; DeepSpeed clips
inside its step) and the precision (`train.precision`). The checkpoint is csekit's own (whole weights and AdamW
state, no pickles): `csekit.training.zero_state`.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import Any

from csekit.core.errors import CsekitError

PROVEN_STAGES = (1, 2)


@dataclass(frozen=True)
class ZeroRequest:
    """The DeepSpeed settings of this launch, as accelerate's launcher passes them on."""

    stage: int
    offload_optimizer: str
    offload_param: str
    config_file: str | None
    gradient_clipping: float | None  # None: the config leaves it to the recipe
    gradient_accumulation: int

    @classmethod
    def from_environment(cls, environ: Any = None) -> ZeroRequest:
        env = os.environ if environ is None else environ
        clipping = env.get("ACCELERATE_GRADIENT_CLIPPING", "auto")
        accumulation = env.get("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "1")
        config_file = env.get("ACCELERATE_DEEPSPEED_CONFIG_FILE", "none")
        try:
            return cls(
                stage=int(env.get("ACCELERATE_DEEPSPEED_ZERO_STAGE", "2")),
                offload_optimizer=env.get("ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE", "none").lower(),
                offload_param=env.get("ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE", "none").lower(),
                config_file=None if config_file.lower() == "none" else config_file,
                gradient_clipping=None if clipping.lower() in ("auto", "none") else float(clipping),
                gradient_accumulation=int(accumulation) if accumulation.isdigit() else 1,
            )
        except ValueError as error:
            raise CsekitError(
                f"the accelerate config's deepspeed_config has a value that is not a number ({error})"
            ) from None


def check_deepspeed_request(max_grad_norm: float | None, precision: str, environ: Any = None) -> ZeroRequest:
    """Refuse, before any process group work, a DeepSpeed setting csekit does not run (one line: the fix)."""
    if importlib.util.find_spec("deepspeed") is None:
        raise CsekitError(
            "the accelerate config asks for DeepSpeed (distributed_type: DEEPSPEED), which is not installed: "
            "pip install deepspeed, or launch with configs/accelerate-fsdp.yaml (FSDP2, part of torch)"
        )
    request = ZeroRequest.from_environment(environ)
    if request.config_file is not None:
        raise CsekitError(
            f"the accelerate config names a DeepSpeed config file ({request.config_file}); csekit takes the "
            "optimizer, schedule and clipping from the recipe: set zero_stage in the accelerate config's "
            "deepspeed_config instead (see configs/accelerate-deepspeed.yaml)"
        )
    if request.stage not in PROVEN_STAGES:
        raise CsekitError(
            f"the accelerate config asks for DeepSpeed ZeRO stage {request.stage}; csekit trains under stages 1 and "
            "2 (set zero_stage: 2); to shard the weights too, launch with configs/accelerate-fsdp.yaml (FSDP2)"
        )
    if (request.offload_optimizer, request.offload_param) != ("none", "none"):
        raise CsekitError(
            "the accelerate config asks DeepSpeed to offload (offload_optimizer_device / offload_param_device), "
            "which csekit does not support yet: set both to none"
        )
    if request.gradient_accumulation != 1:
        raise CsekitError(
            "the accelerate config sets gradient_accumulation_steps; csekit's batch is train.batch_size (the "
            "negatives of one step): set it to 1"
        )
    if request.gradient_clipping is not None and request.gradient_clipping != (max_grad_norm or 0.0):
        raise CsekitError(
            f"the accelerate config sets gradient_clipping: {request.gradient_clipping:g}, the recipe "
            f"train.max_grad_norm: {max_grad_norm}; remove gradient_clipping from the config (the recipe sets it)"
        )
    if precision == "fp16":
        raise CsekitError(
            "train.precision fp16 is not supported under DeepSpeed (its loss scaler skips steps that csekit's step "
            "count would not see): set train.precision: bf16 or fp32"
        )
    return request


def deepspeed_accelerator_options(max_grad_norm: float | None, on_cpu: bool) -> dict[str, Any]:
    """What `Accelerator(...)` needs under DeepSpeed: the recipe's clipping in the plugin, and on CPU processes
    the gloo backend named (accelerate 1.15 gives DeepSpeed no backend without a GPU, and then counts one
    process while DeepSpeed counts them all)."""
    from accelerate.utils import DeepSpeedPlugin, InitProcessGroupKwargs

    plugin = DeepSpeedPlugin(gradient_clipping=max_grad_norm or 0.0)
    options: dict[str, Any] = {"cpu": False, "deepspeed_plugin": plugin}
    if on_cpu:
        options["kwargs_handlers"] = [InitProcessGroupKwargs(backend="gloo")]
    return options

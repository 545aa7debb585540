"""DeepSpeed ZeRO under accelerate: what an accelerate config file asks for, and what csekit runs of it.

`accelerate launch --config_file configs/accelerate-deepspeed.yaml` tells the processes through the environment
(ACCELERATE_USE_DEEPSPEED, ACCELERATE_DEEPSPEED_*); accelerate builds DeepSpeed's engine in `prepare`. csekit
trains under ZeRO stages 1, 2 and 3 (AdamW's state split over the processes; at stage 2 the gradients too, at
stage 3 the weights too), without offload, in fp32 or bf16. The rest is refused at start, one line each:
offloading (DeepSpeed's CPU Adam would replace the recipe's AdamW), building the model partitioned
(`zero3_init_flag`; csekit loads it whole and DeepSpeed partitions it in `prepare`), a DeepSpeed config file,
gradient accumulation, and fp16 (its loss scaler skips steps inside DeepSpeed where csekit's step count would
not see it).

Two settings come from the recipe, not the config: gradient clipping (`train.max_grad_norm`; DeepSpeed clips
inside its step) and the precision (`train.precision`). The checkpoint is csekit's own (whole weights and AdamW
state, no pickles): `csekit.training.zero_state`.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from csekit.core.errors import CsekitError

PROVEN_STAGES = (1, 2, 3)


@dataclass(frozen=True)
class ZeroRequest:
    """The DeepSpeed settings of this launch, as accelerate's launcher passes them on."""

    stage: int
    offload_optimizer: str
    offload_param: str
    config_file: str | None
    gradient_clipping: float | None  # None: the config leaves it to the recipe
    gradient_accumulation: int
    zero3_init: bool  # build the model already partitioned (transformers under deepspeed.zero.Init)

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
                zero3_init=env.get("ACCELERATE_DEEPSPEED_ZERO3_INIT", "false").lower() in ("1", "true", "yes"),
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
            f"the accelerate config asks for DeepSpeed ZeRO stage {request.stage}; csekit trains under stages 1, 2 "
            "and 3: set zero_stage to one of them"
        )
    if (request.offload_optimizer, request.offload_param) != ("none", "none"):
        raise CsekitError(
            "the accelerate config asks DeepSpeed to offload (offload_optimizer_device / offload_param_device), "
            "which csekit does not support yet: set both to none"
        )
    if request.zero3_init:
        raise CsekitError(
            "the accelerate config sets zero3_init_flag: true; csekit loads the model whole and DeepSpeed partitions "
            "it in prepare: set zero3_init_flag: false"
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

    plugin = DeepSpeedPlugin(gradient_clipping=max_grad_norm or 0.0, zero3_init_flag=False)
    options: dict[str, Any] = {"cpu": False, "deepspeed_plugin": plugin}
    if on_cpu:
        options["kwargs_handlers"] = [InitProcessGroupKwargs(backend="gloo")]
    return options


@contextlib.contextmanager
def whole_model_loading(accelerator: Any) -> Iterator[None]:
    """Load the model whole inside this block, also at ZeRO-3: accelerate registers its DeepSpeed config with
    transformers, whose `from_pretrained` would then build the model already partitioned (deepspeed.zero.Init),
    which csekit's loading does not handle; DeepSpeed partitions the whole model in `prepare` instead."""
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    if plugin is None:
        yield
        return
    from transformers.integrations import unset_hf_deepspeed_config

    unset_hf_deepspeed_config()
    try:
        yield
    finally:
        plugin.set_deepspeed_weakref()

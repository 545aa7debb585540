"""How this machine executes a recipe's steps: the one place where every `auto` of the `run:` section is decided.

A recipe says what is learned (model, data, train and the parts); its `run:` section says how a machine
executes a step, none of which changes what is learned beyond float rounding and the draw of dropout
masks. `Execution` is made once a run from that section, the training precision and the device kind,
and hands out what each layer needs: the encoder its pass plan (`csekit.encoding.passes`), the backbone
its fast dropout and compiled forward, the trainer its step, loader, trackers and evaluation batch.

Each `auto`, per device kind, and the measurement behind it (docs/performance.md, by section):

- `run.packed`: on for CPU training ("Padding-free pass": 0.83x the length groups' step on a 2-core Zen 3 in
  fp32) and on CUDA where the flash kernel runs it ("On a GPU III": on an H200 in bf16, 46.4 against 82.4 ms
  a step at batch 64, 106.4 against 121.8 ms at 512). Decoder LLMs: on CUDA by the same rule (the same
  kernel; with `run.gradient_checkpointing` too, whose recomputation re-enters the packed attention), not on a
  CPU, where their packed pass was not measured ("Padding-free decoders").
- `run.length_group_size`: groups on a CPU, one pass on CUDA ("Throughput against sentence-transformers": on
  an H100 at batch 512, 1,138 ms a step in groups, 122 ms in one pass).
- `run.sync_free`: on CUDA, off on a CPU ("On a GPU III": 51.3 against 82.4 ms at batch 64, 78.1 against
  121.8 ms at 512; "Sync-free and compiled steps": no faster on a CPU).
- `run.num_workers`: none on a CPU, up to 2 on CUDA ("Speed IV": batch 512 collates in 46-64 ms on one
  core, about a GPU step; "On a GPU III": 72.0 against 121.8 ms at 512).
- `run.keep_freed_memory`: CPU only ("Training throughput": 48,000 page faults a bf16 step without it).
- `run.fused_qkv`: on CUDA, off on a CPU ("On a GPU III, second run": on an H200 in bf16, all keys on, 32.5
  against 36.8 ms a step at batch 64, 43.7 against 47.1 ms at 512; not measured on a CPU).
- `run.compile`: CUDA graphs over the bucketed packed pass (`reduce-overhead`, with `run.packed_bucket` from
  `auto_bucket` when it is 0) on CUDA for a run long enough to repay the compile (`graphs_repay`: about 5,800 steps
  at batch 64 and 11,700 at 512, "On a GPU III, second run"), for BERT and RoBERTa backbones packed there; else none.
- `run.packed_bucket`: off unless `run.compile: auto` compiles (a fixed-shape packed pass pays only under a
  compile, which costs about a minute: see "On a GPU III, second run").
- `run.fast_dropout`: on (it changes CPU training only: "Training throughput", about 4x cheaper masks; "On a
  GPU III" measured no loss from it on CUDA).
- `train.precision: auto`: bf16 where the device runs it natively, else fp32 ("Precision that fits the
  hardware": emulated bf16 took 27x fp32's step on a Zen 3).
- `run.compute_copies`: off everywhere (not measured yet). It removes autocast's per-layer casts, which matter
  where the host's dispatch limits the step (CUDA at batch 64, "On a GPU III"), but no GPU step has been timed
  with it; a CPU trains in fp32 unless bf16 is native, and it adds half-precision copies and a kept fp32 gradient
  buffer to memory ("Compute copies (Speed V item 4)": the operator calls it removes on a CPU).
- `model.weights_dtype: auto`: a LoRA run's frozen base in bf16 where its precision is bf16, else fp32 weights
  (`csekit.training.backbone_options`: half the weights' memory; full fine-tuning keeps fp32).

The run's precision is decided once (`training_precision`), in `start_execution`, for the Accelerator and the
Execution both. Sharded (FSDP or DeepSpeed), everything is decided here too, before the Accelerator exists, from
the sharding the launch asks for (`decide_execution`'s `sharding` and `launch`): the launch config's own settings
refused where csekit cannot run them (`check_sharding_request`), then what is not proven sharded refused if asked for
and left off if `auto`; the Accelerator must then run the sharding decided. The trainer takes its steps through the
step runner `Execution.step_runner` chooses (`csekit.training.step_runner`: plain or sync-free).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration
from torch import nn

from csekit.core.errors import CsekitError
from csekit.encoding.decoder import is_decoder_only
from csekit.encoding.encoder import SentenceEncoder
from csekit.encoding.fast_dropout import enable_fast_dropout
from csekit.encoding.packed import flash_packing_runs, packing_refusal
from csekit.encoding.passes import PassPlan
from csekit.training.backbone_options import backbone_weights_dtype
from csekit.training.compiled import AUTO_MODE, auto_bucket, compile_backbone, compile_layer_stack, graphs_repay
from csekit.training.compute_copies import check_parts_for_copies, use_compute_copies
from csekit.training.loading import LoaderOptions, loader_options
from csekit.training.model import ContrastiveModel, build_model
from csekit.training.processes import MIXED_PRECISION, keep_freed_memory, training_device_type, training_precision
from csekit.training.recipe import Recipe, RunConfig, tracker_names
from csekit.training.sharding import (
    SHARDED,
    SHARDED_NAMES,
    accelerator_options,
    active_sharding,
    check_sharding_request,
    ready_to_shard,
    requested_sharding,
    shard_cpu_processes,
)
from csekit.training.step_runner import PlainSteps, StepLoop, StepRunner
from csekit.training.sync_free import SyncFreeSteps, use_sync_free

PACKED_AUTO_DEVICES = ("cpu", "cuda")
"""Device kinds where `run.packed: auto` packs training passes (measured faster there; see the table above);
on CUDA only where the flash kernel runs the packed attention (`flash_packing_runs`: bf16 or fp16, Ampere
on), since elsewhere it runs in length groups. Evaluation never packs: on a CPU it was measured slower
(`encode` sorts rows by length, so its batches carry about 2% padding, and the packed pass adds gathers
around attention)."""

PACKED_DECODER_AUTO_DEVICES = ("cuda",)
"""Device kinds where `run.packed: auto` packs a decoder LLM's training passes: CUDA where the flash kernel runs
(the encoders' measured rule: padding's share of every product is removed and attention is the same kernel).
Not a CPU: no decoder step was timed there (this project's shared 2-core machine times nothing reliably), and
a decoder's packed CPU pass adds gathers and per-group mask building around its attention; until measured,
`true` packs it."""

LENGTH_GROUP_DEVICES = ("cpu",)
"""Device kinds where training passes run in length groups (`run.length_group_size`). On a CPU the cost of a
pass is its arithmetic, so cutting padding pays; on a GPU many small passes cost their kernel launches and a
host sync each (a group's longest length is read on the host), which outweighs the padding saved."""


SYNC_FREE_AUTO_DEVICES = ("cuda",)
"""Device kinds where `run.sync_free: auto` turns it on: CUDA ("On a GPU III": 1.6x the plain step at batch 64
and 512 on an H200). Not a CPU: a read costs no wait there, and the rounds measured were dominated by the
shared machine's load."""

FUSED_QKV_AUTO_DEVICES = ("cuda",)
"""Device kinds where `run.fused_qkv: auto` fuses the packed pass's query, key and value products: CUDA (fewer
kernel launches and autocast casts, measured faster at batch 64 and 512 on an H200)."""

COMPUTE_COPIES_AUTO_DEVICES: tuple[str, ...] = ()
"""Device kinds where `run.compute_copies: auto` keeps half-precision copies of the weights: none until a GPU step is
timed with them (the table above); `true` keeps them wherever the run computes in bf16 or fp16."""

COMPILE_BLOCKING_VIEWS = {"consert": "ConSERT's views (per-token embedding masks)"}
"""Views whose batches cannot run through a compiled forward: `run.compile` refused, `auto` left eager."""

HALF_PRECISION = {"bf16": torch.bfloat16, "fp16": torch.float16}


def packs_when_auto(device_type: str, precision: str, decoder: bool = False) -> bool:
    """Whether `run.packed: auto` packs training passes on `device_type` at the run's `precision` (`decoder`: of
    a decoder LLM backbone)."""
    if device_type not in (PACKED_DECODER_AUTO_DEVICES if decoder else PACKED_AUTO_DEVICES):
        return False
    if device_type == "cuda":
        return precision in HALF_PRECISION and flash_packing_runs(torch.device("cuda"), HALF_PRECISION[precision])
    return True


def fuses_qkv(setting: bool | str, device_type: str) -> bool:
    """Whether packed passes fuse their query, key and value products (`run.fused_qkv`, `auto` resolved)."""
    return setting if isinstance(setting, bool) else device_type in FUSED_QKV_AUTO_DEVICES


@dataclass(frozen=True)
class Execution:
    """Every execution setting of a run, decided for its device kind (`auto` resolved)."""

    device_type: str
    precision: str
    precision_note: tuple[str, ...]
    run: RunConfig
    sync_free: bool
    loader: LoaderOptions
    trackers: tuple[str, ...] = field(default=())
    #: The backbone's stored weights (`model.weights_dtype`, `auto` resolved: `backbone_weights_dtype`).
    weights_dtype: torch.dtype = torch.float32
    #: The run's length in steps and each process's batch, once the corpus is read (`for_run_length`): what
    #: `run.compile: auto` weighs the compile against.
    planned_steps: int | None = None
    process_batch: int = 0
    #: Why the recipe cannot be compiled at all (ConSERT's views), or None: `auto` then stays eager.
    compile_blocked: str | None = None
    #: `run.compute_copies`, `auto` resolved (`csekit.training.compute_copies`).
    compute_copies: bool = False
    #: The sharding the run trains under ("fsdp", "deepspeed"), or None (`decide_execution`).
    sharding: str | None = None

    def for_run_length(self, planned_steps: int, process_batch: int) -> Execution:
        return dataclasses.replace(self, planned_steps=planned_steps, process_batch=process_batch)

    @property
    def chunk_size(self) -> int | None:
        return self.run.chunk_size

    @property
    def eval_batch_size(self) -> int:
        return self.run.eval_batch_size

    @property
    def compile(self) -> str:
        """`run.compile` as asked (auto before the backbone is known: `compile_for` resolves it)."""
        return self.run.compile

    def compile_for(self, backbone: nn.Module) -> str:
        """`run.compile`, `auto` resolved for `backbone`: CUDA graphs over the bucketed packed pass where it packs
        (BERT and RoBERTa in half precision on CUDA) and the run repays the compile, else none."""
        if self.run.compile != "auto":
            return self.run.compile
        config = getattr(backbone, "config", None)
        fixed_shapes = packing_refusal(backbone) is None and not (config is not None and is_decoder_only(config))
        packs = self.run.packed is not False and packs_when_auto(self.device_type, self.precision)
        repays = graphs_repay(self.planned_steps, self.process_batch)
        usable = fixed_shapes and packs and not self.run.gradient_checkpointing and self.compile_blocked is None
        usable = usable and not self.compute_copies  # asked for instead: the compiled graph casts without calls
        return AUTO_MODE if usable and repays and self.device_type == "cuda" else "none"

    def bucket_for(self, backbone: nn.Module, max_length: int) -> int:
        """`run.packed_bucket`, or `auto_bucket` where `run.compile: auto` compiles and it is 0."""
        if self.run.packed_bucket or self.run.compile != "auto" or self.compile_for(backbone) == "none":
            return self.run.packed_bucket
        return auto_bucket(self.process_batch, max_length)

    def pass_plan(self, backbone: nn.Module, max_length: int = 0) -> PassPlan:
        """How the run's training passes execute on this device for `backbone` (`csekit.encoding.passes`);
        `max_length`: the recipe's, every row's bound when the packed pass runs on fixed shapes."""
        packed, refusal = self.run.packed, packing_refusal(backbone)
        mode = self.compile_for(backbone)
        bucket, compiled = self.bucket_for(backbone, max_length), mode != "none"
        config = getattr(backbone, "config", None)
        decoder = config is not None and is_decoder_only(config)
        if refusal is None and self.run.gradient_checkpointing and not decoder:
            # BERT's packed pass drives the layers itself (no checkpoint); a decoder's re-enters its attention in
            # the checkpoint's recomputation (csekit.encoding.packed_decoder)
            refusal = "the padding-free pass does not run with gradient checkpointing (run.gradient_checkpointing)"
        if refusal is None and decoder and bucket:
            refusal = "the fixed-shape packed pass (run.packed_bucket) runs bert and roberta backbones only"
        if packed is True and refusal is not None:
            raise CsekitError(f"recipe key run.packed: true: {refusal}; use auto (runs it padded) or false")
        if packed == "auto":
            # An unbucketed packed pass drives the layers one by one and would never call the compiled (bucketed)
            # forward; a bucketed one compiles its own layer stack.
            runs_compiled_forward = compiled and not bucket
            fits = packs_when_auto(self.device_type, self.precision, decoder)
            packed = fits and refusal is None and not runs_compiled_forward
        groups = self.run.length_group_size if self.device_type in LENGTH_GROUP_DEVICES else 0
        return PassPlan(
            packed=bool(packed),
            packed_required=self.run.packed is True,
            length_group_size=groups,
            fused_qkv=bool(packed) and not decoder and fuses_qkv(self.run.fused_qkv, self.device_type),
            token_bucket=bucket,
            width_bound=max_length if bucket else 0,
            layer_stack=compile_layer_stack(mode) if packed and bucket and compiled else None,
        )

    def prepare_backbone(self, backbone: nn.Module, recipe: Recipe) -> None:
        """Fast dropout and the compiled training forward, applied once before the optimizer sees the model."""
        if self.run.fast_dropout:
            enable_fast_dropout(backbone)  # type: ignore[arg-type]
        if self.run.gradient_checkpointing:
            enable_gradient_checkpointing(backbone)
        mode = self.compile_for(backbone)
        if mode != "none":
            if self.compile_blocked is not None:
                raise CsekitError(f"recipe key run.compile: {self.compile_blocked} need none")
            compile_backbone(backbone, mode, recipe.model.max_length)

    def prepare_process(self) -> None:
        """Process-wide settings of a CPU run (glibc's freed-memory threshold)."""
        if self.device_type == "cpu" and self.run.keep_freed_memory:
            keep_freed_memory()

    def step_runner(self, loop: StepLoop) -> StepRunner:
        """How the loop takes its steps: sync-free (`run.sync_free`, decided here) or plain."""
        return SyncFreeSteps(loop) if self.sync_free else PlainSteps(loop)


def enable_gradient_checkpointing(backbone: nn.Module) -> None:
    """transformers' gradient checkpointing, non-reentrant (as LLM2Vec trains; it runs with frozen inputs, LoRA's)."""
    if not getattr(backbone, "supports_gradient_checkpointing", False):
        name = type(backbone).__name__
        raise CsekitError(f"recipe key run.gradient_checkpointing: {name} does not support gradient checkpointing")
    options = {"use_reentrant": False}
    enable = getattr(backbone, "activation_checkpointing_enable", None)  # transformers 5.24's name
    if enable is not None:
        enable(activation_checkpointing_kwargs=options)
    else:
        backbone.gradient_checkpointing_enable(gradient_checkpointing_kwargs=options)  # type: ignore[operator]


def decide_execution(
    recipe: Recipe,
    trackers: list[str] | None = None,
    device_type: str | None = None,
    sharding: str | None = None,
    precision: tuple[str, list[str]] | None = None,
    launch: Mapping[str, str] | None = None,
) -> Execution:
    """The run's execution on this machine (`device_type`: the one training runs on, by default this machine's), under
    `sharding` ("fsdp", "deepspeed" or None: what the run's Accelerator shards with), in `precision` (the run's and
    the line saying why, as `training_precision` decides it; by default decided here).

    `launch`: the environment of the accelerate launch `sharding` was read from (`requested_sharding`); its settings
    are checked first (`check_sharding_request`: FSDP1, DeepSpeed's installation and settings), before the recipe's.
    """
    device_type = device_type or training_device_type()
    precision, note = precision or training_precision(recipe.train.precision)
    if launch is not None:  # first: the launch's own settings, refused before any process group work
        if requested_sharding(launch) != sharding:
            raise ValueError(f"sharding {sharding!r} is not the one the launch asks for")
        check_sharding_request(recipe.train.max_grad_norm, precision, launch)
    device = torch.device(device_type)
    execution = Execution(
        device_type=device_type,
        precision=precision,
        precision_note=tuple(note),
        run=recipe.run,
        sync_free=use_sync_free(
            recipe.run.sync_free, precision, recipe.train.optimizer, auto=device_type in SYNC_FREE_AUTO_DEVICES
        ),
        loader=loader_options(recipe.run.num_workers, device),
        trackers=tuple(trackers if trackers is not None else tracker_names(recipe.run.report_to)),
        weights_dtype=backbone_weights_dtype(recipe.model.weights_dtype, precision, recipe.model.lora),
        compile_blocked=COMPILE_BLOCKING_VIEWS.get(str(recipe.data.views.get("name"))),
        compute_copies=use_compute_copies(
            recipe.run.compute_copies, precision, recipe.run.compile, auto=device_type in COMPUTE_COPIES_AUTO_DEVICES
        ),
    )
    return execution if sharding is None else _sharded(execution, sharding)


def _sharded(execution: Execution, sharding: str) -> Execution:
    """`execution` under `sharding` (FSDP or DeepSpeed): what is not proven sharded is refused if asked for, left off
    if `auto`: padded passes (through each layer's forward, where FSDP gathers its weights), eager, plain steps and
    no compute copies."""
    if sharding not in SHARDED.values():
        raise ValueError(f"sharding must be one of {', '.join(SHARDED.values())} or None, not {sharding!r}")
    if str(execution.run.sync_free).lower() == "true":
        raise CsekitError(f"recipe key run.sync_free: true is not supported under {SHARDED_NAMES}; use auto or false")
    if execution.chunk_size is not None:
        raise CsekitError(
            f"recipe key run.chunk_size is not supported under {SHARDED_NAMES} (the shards hold the memory)"
        )
    if execution.run.compute_copies is True:
        raise CsekitError(
            f"recipe key run.compute_copies: true is not supported under {SHARDED_NAMES} (they hold and gather the "
            "weights themselves); use auto or false"
        )
    if execution.compile not in ("none", "auto"):
        raise CsekitError(f"recipe key run.compile is not supported under {SHARDED_NAMES} yet; use none or auto")
    if execution.run.packed is True:
        raise CsekitError(
            f"recipe key run.packed: true is not supported under {SHARDED_NAMES} (the packed pass calls the layers' "
            "parts, which FSDP does not gather); use auto or false"
        )
    if execution.weights_dtype != torch.float32:
        raise CsekitError(
            "recipe key model.weights_dtype: bf16 weights (a bf16 base beside fp32 adapters) are not supported under "
            f"{SHARDED_NAMES} yet; use fp32"
        )
    run = dataclasses.replace(execution.run, packed=False, compile="none")
    return dataclasses.replace(execution, sync_free=False, run=run, compute_copies=False, sharding=sharding)


def start_execution(recipe: Recipe, trackers: list[str], **options: Any) -> tuple[Accelerator, Execution]:
    """The run's Accelerator (`options`: its logging) and its Execution, in the one precision decided for both.

    Everything is decided before the Accelerator exists (`decide_execution`, with the sharding this launch asks for
    and its settings: refused before any process group work), then the Accelerator is built in the decided precision
    and must run the decided sharding.
    """
    precision = training_precision(recipe.train.precision)
    launch = os.environ
    device_type = training_device_type()
    execution = decide_execution(recipe, trackers, device_type, requested_sharding(launch), precision, launch)
    accelerator = Accelerator(
        **accelerator_options(recipe.train.max_grad_norm),
        mixed_precision=MIXED_PRECISION[execution.precision],
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True),
        **options,
    )
    shard_cpu_processes(accelerator)
    sharding = check_active_sharding(accelerator, execution.sharding)
    if accelerator.device.type != device_type or sharding != execution.sharding:  # decided again for what runs
        execution = decide_execution(recipe, trackers, accelerator.device.type, sharding, precision)
    # Read when the loader is prepared: on a GPU its copies are queued without a wait (csekit.training.loading).
    accelerator.dataloader_config.non_blocking = execution.loader.non_blocking
    execution.prepare_process()
    return accelerator, execution


def check_active_sharding(accelerator: Accelerator, decided: str | None) -> str | None:
    """The sharding `accelerator` runs: the one decided from the launch's request, or one line saying why not. One
    process that accelerate leaves unsharded (an FSDP config on one CPU process: DistributedType.NO) trains
    unsharded, as it did before the launch was read first: with one process there is nothing to shard."""
    active = active_sharding(accelerator)
    if active is None and accelerator.num_processes == 1:
        return None
    if active != decided:
        processes = f"{accelerator.num_processes} process{'es' if accelerator.num_processes > 1 else ''}"
        raise CsekitError(
            f"the accelerate launch asks for {decided or 'no sharding'} but accelerate runs {active or 'unsharded'} "
            f"(distributed_type {accelerator.distributed_type.value}, {processes}): launch sharded training on 2 or "
            "more processes (accelerate launch --config_file CONFIG --num_processes 2)"
        )
    return active


def planned_steps(recipe: Recipe, corpus_rows: int) -> int:
    """A run's length in steps as its corpus gives it: `train.max_steps`, else its epochs of full batches."""
    return recipe.train.max_steps or recipe.train.epochs * (corpus_rows // recipe.train.batch_size)


def build_run_model(
    recipe: Recipe, encoder: SentenceEncoder, execution: Execution | None = None
) -> tuple[ContrastiveModel, Callable[[list[str]], Any]]:
    """The recipe's model and views as a run executes them on `execution` (default: decided for the encoder's
    device): its passes with the run's plan, the backbone with fast dropout and the compiled forward, sharded
    where the run is."""
    execution = execution or decide_execution(recipe, device_type=encoder.device.type)
    model, views = build_model(recipe, encoder, execution.pass_plan(encoder.backbone, recipe.model.max_length))
    if execution.compute_copies:
        check_parts_for_copies(model.part_names)
    execution.prepare_backbone(encoder.backbone, recipe)
    if execution.sharding is not None:
        ready_to_shard(model)  # the parts FSDP would break refused (one line), the layers to wrap named
    return model, views

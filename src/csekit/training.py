"""The training loop: one code path for CPU, one GPU and several processes (through accelerate).

The loop knows nothing about any method. It asks the recipe's model for the step's total loss and
named parts, steps AdamW with linear decay, evaluates on the dev task every `eval_every` steps, keeps
the best model by the selection metric, and writes `metrics.jsonl`. Model directories and the
resumable training state are written atomically, so an interrupted run never leaves a half-written
checkpoint and `--resume` continues from the last saved state.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import itertools
import json
import math
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration, set_seed
from torch.utils.data import DataLoader
from tqdm.auto import tqdm
from transformers import get_linear_schedule_with_warmup

from csekit.atomic import atomic_write_text, recover_directory, remove_staging_leftovers, swap_in
from csekit.config import Recipe
from csekit.data import TrainCollator, open_corpus
from csekit.data_dir import resolve_data_dir
from csekit.encoder import SentenceEncoder
from csekit.errors import CsekitError
from csekit.evaluation.sts import DEV_TASKS, evaluate_dev
from csekit.lines import split_lines
from csekit.model import ContrastiveModel, build_model

MIXED_PRECISION = {"fp32": "no", "bf16": "bf16", "fp16": "fp16"}
STATE_FILE = "trainer_state.json"


@dataclass
class TrainerState:
    """What a resumed run needs beside the weights: where it was and what it had seen."""

    step: int = 0  # optimizer steps taken
    batches: int = 0  # batches consumed (the data position; differs from `step` when steps were skipped)
    best_score: float | None = None
    best_step: int | None = None
    skipped_steps: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class TrainResult:
    output_dir: Path
    steps: int
    best_score: float | None
    best_step: int | None
    skipped_steps: int


class MetricsLog:
    """`metrics.jsonl`: one JSON object per logging step or evaluation, flushed as it is written."""

    def __init__(self, path: Path, enabled: bool) -> None:
        self.path = path
        self.enabled = enabled

    def write(self, record: dict[str, Any]) -> None:
        if self.enabled:
            with open(self.path, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(record) + "\n")

    def truncate_after(self, step: int) -> None:
        """On resume, drop records written after the saved state (they will be written again).

        A run killed in the middle of a write leaves a last line cut off before its newline: it is
        dropped, with a note. Any other line that is not a JSON record (a complete line, or one before
        the last) means the file was edited or is not this run's log: an error naming the line.
        """
        if not (self.enabled and self.path.exists()):
            return
        try:
            text = self.path.read_bytes().decode("utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise CsekitError(f"{self.path}: cannot read it ({error})") from None
        lines = split_lines(text)
        cut_off = not text.endswith("\n")
        kept = []
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                record = None
            if not isinstance(record, dict):
                if number == len(lines) and cut_off:
                    print(
                        f"csekit: {self.path}:{number}: dropped a cut-off last line (a crash mid-write)",
                        file=sys.stderr,
                    )
                    continue
                raise CsekitError(f"{self.path}:{number}: not a metrics record; is this folder a csekit run?")
            if record.get("step", 0) <= step:
                kept.append(line)
        atomic_write_text(self.path, "".join(line + "\n" for line in kept))


def _check_output(output_dir: Path, resume: bool) -> None:
    """Refuse to overwrite a run (read-only: nothing is created before all inputs are checked)."""
    if output_dir.exists() and not output_dir.is_dir():
        raise CsekitError(f"output folder {output_dir} is a file")
    has_run = any((output_dir / name).exists() for name in ("metrics.jsonl", "checkpoint", "best", "last"))
    if has_run and not resume:
        raise CsekitError(
            f"output folder {output_dir} already holds a run; pass --resume to continue it or choose a new folder"
        )


def _create_output(output_dir: Path, process: int) -> None:
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        probe = output_dir / f".csekit-write-test-{process}"
        probe.write_text("", encoding="utf-8")
        probe.unlink()
    except OSError as error:
        raise CsekitError(f"output folder {output_dir} is not writable ({error.strerror})") from None


def _several_cpu_processes() -> bool:
    """Launched as several processes (torchrun, accelerate launch --multi_gpu) on a machine without a GPU.

    accelerate then needs `cpu=True` to use its multi-CPU (gloo) mode instead of running each process alone.
    """
    return not _has_gpu() and int(os.environ.get("WORLD_SIZE", "1")) > 1


def _has_gpu() -> bool:
    return torch.cuda.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available())


def _hint_if_accelerate_started_one_process() -> None:
    """`accelerate launch --num_processes N` with no config starts ONE process when there is no GPU: say so.

    Its simple launcher (the one used then) sets ACCELERATE_USE_CPU and no WORLD_SIZE; its torchrun
    launcher sets WORLD_SIZE. The requested N is not passed on, so this is a hint, not an error.
    """
    if "ACCELERATE_USE_CPU" in os.environ and "WORLD_SIZE" not in os.environ and not _has_gpu():
        print(
            "csekit: accelerate started a single process. For several processes on CPUs, launch with "
            "--config_file configs/accelerate-cpu.yaml (or --multi_gpu); see docs/performance.md",
            file=sys.stderr,
        )


GLIBC_M_TRIM_THRESHOLD, GLIBC_M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (malloc.h)


def keep_freed_memory(limit: int = 1 << 30) -> bool:
    """Ask glibc's malloc to keep freed blocks (up to `limit` bytes) for reuse, not return them to the OS.

    A training step allocates and frees the same large blocks every step (BERT's vocabulary gradient
    alone is 47 MB). glibc serves blocks above its mmap threshold (32 MB at most) with fresh mappings
    and unmaps them on free, so every step page-faults them in again: about 48,000 faults and 0.11
    CPU-seconds of kernel time a MiniLM bf16 step on this project's machine. PyTorch's CPU tuning guide
    gets the same by preloading jemalloc or tcmalloc. Process-wide; Linux with glibc only (False elsewhere).
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return False
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:
        return False
    return bool(mallopt(GLIBC_M_MMAP_THRESHOLD, limit)) and bool(mallopt(GLIBC_M_TRIM_THRESHOLD, limit))


def _optional_data_dir(data_dir: str | Path | None) -> Path | None:
    """The data folder if one is given (it may hold the corpus); without a dev task none is required."""
    try:
        return resolve_data_dir(data_dir)
    except CsekitError:
        if data_dir is not None:
            raise
        return None


def _check_precision(accelerator_device: torch.device, precision: str) -> None:
    if precision == "fp16" and accelerator_device.type == "cpu":
        raise CsekitError("recipe key train.precision: fp16 needs a GPU; use bf16 or fp32 on the CPU")


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


def make_optimizer(model: ContrastiveModel, recipe: Recipe) -> torch.optim.AdamW:
    """AdamW over the recipe's parameter groups, with PyTorch's fused kernel (CPU and GPU).

    The default (for-loop) AdamW took 73 ms a step for MiniLM's 22.7M parameters on the 2-core
    development machine, the fused one 15 ms; the transformers Trainer uses the fused one too.
    """
    return torch.optim.AdamW(_param_groups(model, recipe), lr=recipe.train.lr, fused=True)


def forward_backward(
    accelerator: Accelerator,
    model: torch.nn.Module,
    batch: dict[str, Any],
    max_grad_norm: float | None,
    step: int = 0,
    steps_per_epoch: int | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
    """A step's loss and parts, back-propagated, and the gradient norm before clipping.

    `batch` is what `TrainCollator` makes. The loop decides what to do with the results (skip a
    non-finite step, or step AdamW); the benchmarks call this too, so they time the loop's own step.
    """
    loss, parts = model(
        batch["inputs"], batch["sentences"], batch["fields"], step=step, steps_per_epoch=steps_per_epoch
    )
    accelerator.backward(loss)
    grad_norm = accelerator.clip_grad_norm_(model.parameters(), max_grad_norm or float("inf"))
    return loss, parts, grad_norm


def _inherited_lr(model: torch.nn.Module, module_name: str, default: float) -> float:
    """The `learning_rate` of the module or its nearest enclosing module that sets one, else the recipe's lr."""
    parts = module_name.split(".") if module_name else []
    for depth in range(len(parts), 0, -1):
        owner = model.get_submodule(".".join(parts[:depth]))
        if getattr(owner, "learning_rate", None) is not None:
            return float(owner.learning_rate)
    return default


def train(
    recipe: Recipe,
    output_dir: str | Path,
    data_dir: str | Path | None = None,
    resume: bool = False,
    show_progress: bool = True,
) -> TrainResult:
    """Train the recipe's model into `output_dir` (best/, last/, checkpoint/, metrics.jsonl, recipe.yaml)."""
    output = Path(output_dir)
    train_config = recipe.train
    _hint_if_accelerate_started_one_process()
    accelerator = Accelerator(
        cpu=_several_cpu_processes(),
        mixed_precision=MIXED_PRECISION[train_config.precision],
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True),
    )
    _check_precision(accelerator.device, train_config.precision)
    if accelerator.device.type == "cpu" and train_config.keep_freed_memory:
        keep_freed_memory()
    main = accelerator.is_main_process
    _check_output(output, resume)
    set_seed(train_config.seed)

    dev_task = train_config.dev_task
    data_path = resolve_data_dir(data_dir) if dev_task != "none" else _optional_data_dir(data_dir)
    if dev_task != "none" and dev_task not in DEV_TASKS:
        choices = ", ".join(DEV_TASKS)
        raise CsekitError(f'recipe key train.dev_task: unknown dev task "{dev_task}"; choose {choices} or none')

    if dev_task != "none" and train_config.select_metric != dev_task:
        raise CsekitError(
            f'recipe key train.select_metric: "{train_config.select_metric}" is not a dev score; '
            f'the dev task gives "{dev_task}"'
        )
    corpus = open_corpus(
        recipe.data.corpus, data_path, recipe.data.max_chars, recipe.data.bad_lines, recipe.data.text_column
    )
    encoder = SentenceEncoder.load(
        recipe.model.backbone, recipe.model.pooler, recipe.model.max_length, recipe.model.dropout
    )
    if recipe.model.max_length > encoder.inference_max_length():
        raise CsekitError(
            f"recipe key model.max_length: {recipe.model.max_length} is more tokens than {recipe.model.backbone} "
            f"accepts ({encoder.inference_max_length()})"
        )
    model, views = build_model(recipe, encoder)
    if recipe.model.head_at_test:
        encoder.head = model.head

    processes = accelerator.num_processes
    if train_config.batch_size % processes:
        raise CsekitError(
            f"recipe key train.batch_size: {train_config.batch_size} is not divisible by the {processes} processes"
        )
    local_batch = train_config.batch_size // processes
    if len(corpus) < train_config.batch_size:
        raise CsekitError(
            f"corpus {recipe.data.corpus} has {len(corpus)} sentences, fewer than train.batch_size "
            f"({train_config.batch_size})"
        )
    loader = DataLoader(
        corpus,
        batch_size=local_batch,
        shuffle=True,
        drop_last=True,
        collate_fn=TrainCollator(views, recipe.data.text_column),
        num_workers=recipe.data.num_workers,
        generator=torch.Generator().manual_seed(train_config.seed),
    )
    _create_output(output, accelerator.process_index)  # every input is valid: only now is anything written
    if main:  # staging folders and files of a run killed mid-write; they are never resumed from
        for name in remove_staging_leftovers(output):
            print(f"csekit: removed {output / name}, left by an interrupted run", file=sys.stderr)
    optimizer = make_optimizer(model, recipe)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    steps_per_epoch = len(loader)
    if steps_per_epoch == 0:
        raise CsekitError(f"corpus {recipe.data.corpus} gives no full batch of {train_config.batch_size}")
    # As in the transformers Trainer, max_steps (when set) replaces epochs as the length of the run.
    total_steps = train_config.max_steps or steps_per_epoch * train_config.epochs
    scheduler = get_linear_schedule_with_warmup(
        optimizer, math.ceil(train_config.warmup_ratio * total_steps), total_steps
    )
    accelerator.register_for_checkpointing(scheduler)

    state = TrainerState()
    metrics = MetricsLog(output / "metrics.jsonl", main)
    checkpoint_dir = output / "checkpoint"
    if resume:
        for folder in (checkpoint_dir, output / "best", output / "last"):
            recover_directory(folder)
        if (checkpoint_dir / STATE_FILE).exists():
            accelerator.load_state(str(checkpoint_dir))
            state = TrainerState(**json.loads((checkpoint_dir / STATE_FILE).read_text(encoding="utf-8")))
            metrics.truncate_after(state.step)
        else:  # stopped before its first checkpoint: start over, without the old run's records
            metrics.truncate_after(-1)
    if main:
        atomic_write_text(output / "recipe.yaml", recipe.to_yaml())
        if not resume or state.step == 0:
            metrics.write(
                {
                    "event": "start",
                    "step": 0,
                    "corpus": corpus.report.summary(),
                    "total_steps": total_steps,
                    "processes": processes,
                }
            )

    unwrapped: ContrastiveModel = accelerator.unwrap_model(model)

    def evaluate() -> dict[str, float]:
        if dev_task == "none":
            return {}
        scores = evaluate_dev(
            lambda sentences: unwrapped.encoder.encode(
                sentences, batch_size=train_config.eval_batch_size, precision=train_config.precision
            ),
            data_path,
            dev_task,
            align_uniform=True,
        )
        return scores

    def save_checkpoint() -> None:
        """The resumable state: weights, optimizer, scheduler, RNG states (every process's) and the step."""
        staging = output / ".checkpoint.tmp"
        if main:
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir()
        accelerator.wait_for_everyone()
        accelerator.save_state(str(staging))
        accelerator.wait_for_everyone()
        if main:
            atomic_write_text(staging / STATE_FILE, json.dumps(state.__dict__))
            swap_in(staging, checkpoint_dir)
        accelerator.wait_for_everyone()

    def on_evaluation() -> None:
        nonlocal last_score
        scores = evaluate() if main else {}
        if main:
            metrics.write({"step": state.step, **scores})
            score = scores.get(train_config.select_metric)
            improved = _improves(score, state.best_score)
            if improved:
                state.best_score, state.best_step = score, state.step
                unwrapped.encoder.save(output / "best")
            unwrapped.encoder.save(output / "last")
            last_score = score
            bar.set_postfix_str(_postfix(last_loss, last_score))
        save_checkpoint()

    bar = tqdm(
        total=total_steps,
        initial=state.step,
        desc="training",
        unit="step",
        disable=not (show_progress and main),
        dynamic_ncols=True,
    )
    last_loss: float | None = None
    last_score: float | None = None  # the latest dev score, shown in the progress bar
    window: dict[str, float] = {}
    window_steps, window_start, bad_in_a_row = 0, time.perf_counter(), 0
    model.train()
    for epoch in itertools.count(state.batches // steps_per_epoch):
        if state.step >= total_steps:
            break
        loader.set_epoch(epoch)
        skip = state.batches - epoch * steps_per_epoch
        batches = accelerator.skip_first_batches(loader, skip) if skip > 0 else loader
        for batch in batches:
            state.batches += 1
            # Always back-propagate (every process must join DDP's gradient all-reduce), then decide
            # together: a step is skipped everywhere when any process's loss or the gradient is not finite.
            loss, parts, grad_norm = forward_backward(
                accelerator, model, batch, train_config.max_grad_norm, state.step, steps_per_epoch
            )
            # One all-reduce gives the mean loss and parts over processes (for the log) and, since a NaN
            # anywhere makes the mean NaN, whether every process's loss is finite.
            names = ["loss", *parts]
            values = accelerator.reduce(torch.stack([loss.detach(), *parts.values()]).float(), "mean").tolist()
            loss_finite = math.isfinite(values[0])
            if not (loss_finite and bool(torch.isfinite(torch.as_tensor(grad_norm)))):
                optimizer.zero_grad(set_to_none=True)
                state.skipped_steps += 1
                bad_in_a_row += 1
                reason = "loss" if not loss_finite else "gradient"
                metrics.write(
                    {
                        "step": state.step,
                        "event": "non_finite_step",
                        "reason": reason,
                        "skipped_steps": state.skipped_steps,
                    }
                )
                if bad_in_a_row >= train_config.max_bad_steps:
                    raise CsekitError(
                        f"{bad_in_a_row} steps in a row had a non-finite {reason} (after step {state.step}); "
                        f"stopped. The best model in {output / 'best'} is intact; try a lower train.lr"
                    )
                continue
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            bad_in_a_row = 0
            state.step += 1
            bar.update(1)
            last_loss = values[0]
            for name, value in zip(names, values, strict=True):
                window[name] = window.get(name, 0.0) + value
            window_steps += 1
            if state.step % train_config.log_every == 0 or state.step == total_steps:
                elapsed = time.perf_counter() - window_start
                record = {
                    "step": state.step,
                    **{k: v / window_steps for k, v in window.items()},
                    "lr": scheduler.get_last_lr()[0],
                    "sentences_per_second": window_steps * train_config.batch_size / max(elapsed, 1e-9),
                }
                metrics.write(record)
                bar.set_postfix_str(_postfix(last_loss, last_score))
                window, window_steps = {}, 0
                window_start = time.perf_counter()
            eval_due = train_config.eval_every > 0 and state.step % train_config.eval_every == 0
            if eval_due or state.step == total_steps:
                on_evaluation()
                window_start = time.perf_counter()
            if state.step >= total_steps:
                break
    bar.close()
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return TrainResult(output, state.step, state.best_score, state.best_step, state.skipped_steps)


def _improves(score: float | None, best: float | None) -> bool:
    """Whether `score` beats `best`; a NaN score (e.g. constant embeddings) never does, a NaN best always loses."""
    if score is None:
        return True  # no dev task: the newest model is the best one
    if math.isnan(score):
        return best is None
    return best is None or math.isnan(best) or score > best


def _postfix(loss: float | None, score: float | None) -> str:
    text = f"loss={loss:.4f}" if loss is not None else ""
    if score is not None:
        text += f" dev={score * 100:.2f}"
    return text

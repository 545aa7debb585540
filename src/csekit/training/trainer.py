"""The training loop: one code path for CPU, one GPU and several processes (through accelerate).

The loop knows nothing about any method. It asks the recipe's model for the step's total loss and
named parts, steps AdamW with linear decay, evaluates on the dev task every `eval_every` steps, keeps
the best model by the selection metric, and writes `metrics.jsonl`. Model directories and the
resumable training state are written atomically, so an interrupted run never leaves a half-written
checkpoint and `--resume` continues from the last saved state.
"""

from __future__ import annotations

import contextlib
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

from csekit.core.atomic import atomic_write_text, recover_directory, remove_staging_leftovers, swap_in
from csekit.core.errors import CsekitError
from csekit.core.lines import split_lines
from csekit.core.precision import choose_precision
from csekit.core.run_lock import check_not_locked, hold_run_lock
from csekit.data.corpus import TrainCollator, open_corpus
from csekit.data.data_dir import resolve_data_dir
from csekit.encoding.encoder import SentenceEncoder
from csekit.evaluation.sts import evaluate_dev
from csekit.evaluation.tasks import TRAINING_DEV_TASKS
from csekit.parts.hooks import own_learning_rate
from csekit.training.checkpoint import load_rng_state, load_shared_state, save_rng_state, save_shared_state
from csekit.training.model import ContrastiveModel, build_model
from csekit.training.recipe import Recipe, load_recipe, recipe_changes

MIXED_PRECISION = {"fp32": "no", "bf16": "bf16", "fp16": "fp16"}
STATE_FILE = "trainer_state.json"
SAVED_RECIPE = "recipe.yaml"


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
            if not isinstance(record, dict) or not isinstance(record.get("step", 0), int):
                if number == len(lines) and cut_off:
                    print(
                        f"csekit: {self.path}:{number}: dropped a cut-off last line (a crash mid-write)",
                        file=sys.stderr,
                    )
                    continue
                raise CsekitError(f"{self.path}:{number}: not a metrics record (a JSON object with a step)")
            if record.get("step", 0) <= step:
                kept.append(line)
        atomic_write_text(self.path, "".join(line + "\n" for line in kept))


def _read_trainer_state(path: Path) -> TrainerState:
    """The checkpoint's position (JSON); anything but what csekit wrote is a CsekitError naming the file."""
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
        state = TrainerState(**values)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, TypeError) as error:
        raise CsekitError(f"checkpoint file {path} is damaged ({str(error)[:200]})") from None
    counts = (state.step, state.batches, state.skipped_steps)
    if not all(isinstance(n, int) and n >= 0 for n in counts) or not isinstance(state.history, list):
        raise CsekitError(f"checkpoint file {path} is damaged (step, batches or skipped_steps is not a count)")
    return state


def _check_output(output_dir: Path, resume: bool) -> None:
    """Refuse to overwrite a run (read-only: nothing is created before all inputs are checked)."""
    if output_dir.exists() and not output_dir.is_dir():
        raise CsekitError(f"output folder {output_dir} is a file")
    check_not_locked(output_dir)
    has_run = any((output_dir / name).exists() for name in ("metrics.jsonl", "checkpoint", "best", "last"))
    if has_run and not resume:
        raise CsekitError(
            f"output folder {output_dir} already holds a run; pass --resume to continue it or choose a new folder"
        )
    if resume and not (has_run or (output_dir / SAVED_RECIPE).exists()):
        raise CsekitError(f"nothing to resume in {output_dir}: it holds no run; start one without --resume")


def _recipe_changes_on_resume(output_dir: Path, recipe: Recipe, allow_changes: bool) -> dict[str, list[Any]]:
    """Keys whose value differs from the run's saved recipe; refused unless `allow_changes`.

    A resumed run must continue the run that is in the folder: the same length, batch, precision
    and parts. The saved recipe is read like any recipe (yaml.safe_load, then validated).
    """
    saved_path = output_dir / SAVED_RECIPE
    if not saved_path.exists():
        return {}
    changes = recipe_changes(load_recipe(saved_path), recipe)
    if changes and not allow_changes:
        key, (old, new) = next(iter(changes.items()))
        others = f" (and {', '.join(list(changes)[1:])})" if len(changes) > 1 else ""
        raise CsekitError(
            f"recipe key {key} is {new!r} but the run in {output_dir} was saved with {old!r}{others}; resume "
            f"without a recipe and --set to continue it as saved ({saved_path}), or pass --allow-changes"
        )
    return {key: [old, new] for key, (old, new) in changes.items()}


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


def _training_device_type() -> str:
    """The kind of device accelerate will train on; needed before the Accelerator, whose precision depends on it."""
    if os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true", "yes") or _several_cpu_processes():
        return "cpu"
    if torch.cuda.is_available():
        return "cuda"
    return "xpu" if _has_gpu() else "cpu"


def training_precision(requested: str) -> tuple[str, list[str]]:
    """The recipe's precision for this machine (auto: bf16 where native, else fp32) and the line that says so.

    The line is printed once every input has been checked, so that an input error stays one line.
    """
    device = _training_device_type()
    if requested == "fp16" and device == "cpu":
        raise CsekitError("recipe key train.precision: fp16 needs a GPU; use auto, bf16 or fp32 on the CPU")
    said: list[str] = []
    return choose_precision(requested, device, "train.precision", say=said.append), said


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
        own = own_learning_rate(owner)
        if own is not None:
            return own
    return default


def train(
    recipe: Recipe,
    output_dir: str | Path,
    data_dir: str | Path | None = None,
    resume: bool = False,
    show_progress: bool = True,
    allow_changes: bool = False,
) -> TrainResult:
    """Train the recipe's model into `output_dir` (best/, last/, checkpoint/, metrics.jsonl, recipe.yaml).

    With `resume`, `recipe` must equal the run's saved recipe key for key, unless `allow_changes`
    (then the changed keys are recorded in metrics.jsonl). The folder is locked for the run.
    """
    with contextlib.ExitStack() as held_until_the_end:
        return _train(recipe, Path(output_dir), data_dir, resume, show_progress, allow_changes, held_until_the_end)


def _train(
    recipe: Recipe,
    output: Path,
    data_dir: str | Path | None,
    resume: bool,
    show_progress: bool,
    allow_changes: bool,
    held_until_the_end: contextlib.ExitStack,
) -> TrainResult:
    train_config = recipe.train
    _hint_if_accelerate_started_one_process()
    precision, precision_note = training_precision(train_config.precision)
    accelerator = Accelerator(
        cpu=_several_cpu_processes(),
        mixed_precision=MIXED_PRECISION[precision],
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True),
    )
    if accelerator.device.type == "cpu" and train_config.keep_freed_memory:
        keep_freed_memory()
    main = accelerator.is_main_process
    _check_output(output, resume)
    changes = _recipe_changes_on_resume(output, recipe, allow_changes) if resume else {}
    set_seed(train_config.seed)

    dev_tasks = TRAINING_DEV_TASKS.get(train_config.dev_task, ())  # checked with the recipe
    data_path = resolve_data_dir(data_dir) if dev_tasks else _optional_data_dir(data_dir)
    corpus = open_corpus(
        recipe.data.corpus, data_path, recipe.data.max_chars, recipe.data.bad_lines, recipe.data.text_column
    )
    encoder = SentenceEncoder.load(recipe.model.backbone, recipe.model.pooler, dropout=recipe.model.dropout)
    if recipe.model.max_length > encoder.max_seq_length:
        raise CsekitError(
            f"recipe key model.max_length: {recipe.model.max_length} is more tokens than {recipe.model.backbone} "
            f"accepts ({encoder.max_seq_length})"
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
    if main:
        held_until_the_end.enter_context(hold_run_lock(output))
        # Staging folders and files of a run killed mid-write (never resumed from); removed under the lock.
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

    state = TrainerState()
    metrics = MetricsLog(output / "metrics.jsonl", main)
    checkpoint_dir = output / "checkpoint"
    unwrapped: ContrastiveModel = accelerator.unwrap_model(model)
    if resume:
        for folder in (checkpoint_dir, output / "best", output / "last"):
            recover_directory(folder)
        if (checkpoint_dir / STATE_FILE).exists():
            state = _read_trainer_state(checkpoint_dir / STATE_FILE)
            load_shared_state(checkpoint_dir, unwrapped, optimizer, scheduler, accelerator.scaler, accelerator.device)
            load_rng_state(checkpoint_dir, accelerator.process_index)
            metrics.truncate_after(state.step)
        else:  # stopped before its first checkpoint: start over, without the old run's records
            metrics.truncate_after(-1)
        if changes:
            metrics.write({"event": "recipe_changed", "step": state.step, "changes": changes})
    if main:
        for line in precision_note:  # every input, the checkpoint included, has been read: the run begins
            print(line, file=sys.stderr)
        atomic_write_text(output / SAVED_RECIPE, recipe.to_yaml())
        if not resume or state.step == 0:
            metrics.write(
                {
                    "event": "start",
                    "step": 0,
                    "corpus": corpus.report.summary(),
                    "total_steps": total_steps,
                    "processes": processes,
                    "precision": precision,
                }
            )

    def evaluate() -> dict[str, float]:
        if not dev_tasks:
            return {}
        return evaluate_dev(
            lambda sentences: unwrapped.encoder.encode(
                sentences, batch_size=train_config.eval_batch_size, precision=precision, show_progress_bar=False
            ),
            data_path,
            dev_tasks,
            align_uniform=True,
        )

    def save_checkpoint() -> None:
        """The resumable state: weights, optimizer, scheduler, RNG states (every process's) and the step."""
        staging = output / ".checkpoint.tmp"
        if main:
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir()
        accelerator.wait_for_everyone()
        if main:
            save_shared_state(staging, unwrapped, optimizer, scheduler, accelerator.scaler)
        save_rng_state(staging, accelerator.process_index)
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

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
import shlex
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.tracking import get_available_trackers
from accelerate.utils import DataLoaderConfiguration, ProjectConfiguration, set_seed
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
from csekit.training.card_facts import training_card_facts
from csekit.training.checkpoint import load_rng_state, load_shared_state, save_rng_state, save_shared_state
from csekit.training.model import ContrastiveModel, build_model
from csekit.training.recipe import Recipe, load_recipe, recipe_changes, tracker_names

MIXED_PRECISION = {"fp32": "no", "bf16": "bf16", "fp16": "fp16"}
STATE_FILE = "trainer_state.json"
SAVED_RECIPE = "recipe.yaml"
TRACKER_LOGS = "logs"
"""The run folder's subfolder where file-based trackers (TensorBoard) write, one folder per recipe name."""


@dataclass
class TrainerState:
    """What a resumed run needs beside the weights: where it was and what it had seen."""

    step: int = 0  # optimizer steps taken
    batches: int = 0  # batches consumed (the data position; differs from `step` when steps were skipped)
    best_score: float | None = None
    best_step: int | None = None
    skipped_steps: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    evaluations_without_improvement: int = 0  # counted against train.patience


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped the run after a step; the checkpoint holds that step, so `--resume` continues from it.

    A KeyboardInterrupt, so that code which catches `Exception` does not swallow the user's Ctrl-C.
    """

    def __init__(self, step: int, output_dir: Path) -> None:
        super().__init__(f"interrupted at step {step}; the checkpoint in {output_dir} holds it")
        self.step = step
        self.output_dir = output_dir

    def resume_command(self, data_dir: str | Path | None = None) -> str:
        """The command that continues the run (from its saved recipe)."""
        command = ["csekit", "train", "--output", str(self.output_dir), "--resume"]
        if data_dir is not None:
            command += ["--data-dir", str(data_dir)]
        return shlex.join(command)


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
    counts = (state.step, state.batches, state.skipped_steps, state.evaluations_without_improvement)
    if not all(isinstance(n, int) and n >= 0 for n in counts) or not isinstance(state.history, list):
        raise CsekitError(
            f"checkpoint file {path} is damaged (step, batches, skipped_steps or evaluations_without_improvement "
            "is not a count)"
        )
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
        trainer = Trainer(recipe, Path(output_dir), data_dir, resume, show_progress, allow_changes, held_until_the_end)
        return trainer.run()


class Trainer:
    """One training run, in the order of the algorithm: set up, then step, evaluate and checkpoint until done.

    Setting up checks every input (output folder, recipe changes, corpus, model, batch sizes) before it
    writes anything; then it takes the run folder's lock, builds the optimizer and schedule, and on
    resume reads the checkpoint. `run()` is the loop.
    """

    def __init__(
        self,
        recipe: Recipe,
        output: Path,
        data_dir: str | Path | None,
        resume: bool,
        show_progress: bool,
        allow_changes: bool,
        held_until_the_end: contextlib.ExitStack,
    ) -> None:
        self.recipe = recipe
        self.config = recipe.train
        self.output = output
        self.checkpoint_dir = output / "checkpoint"
        self.resume = resume
        self.show_progress = show_progress
        self._start_accelerator()
        self._check_output_and_recipe(allow_changes)
        set_seed(self.config.seed)
        self._load_data(data_dir)
        self._build_model()
        self._make_loader()
        self._open_output(held_until_the_end)  # every input is valid: only now is anything written
        self._set_up_optimization()
        self.state = TrainerState()
        self.metrics = MetricsLog(output / "metrics.jsonl", self.main)
        self.unwrapped: ContrastiveModel = self.accelerator.unwrap_model(self.model)
        if resume:
            self._resume_from_checkpoint()
        self._announce_start()

    # -- setting up ------------------------------------------------------------------------------

    def _start_accelerator(self) -> None:
        """The precision for this machine, then the Accelerator (one process or several)."""
        _hint_if_accelerate_started_one_process()
        self.precision, self.precision_note = training_precision(self.config.precision)
        self.trackers = _available_trackers(self.config.report_to)
        logs = ProjectConfiguration(project_dir=str(self.output), logging_dir=str(self.output / TRACKER_LOGS))
        self.accelerator = Accelerator(
            cpu=_several_cpu_processes(),
            mixed_precision=MIXED_PRECISION[self.precision],
            dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True),
            log_with=self.trackers or None,
            project_config=logs if self.trackers else None,
        )
        if self.accelerator.device.type == "cpu" and self.config.keep_freed_memory:
            keep_freed_memory()
        self.main = self.accelerator.is_main_process

    def _check_output_and_recipe(self, allow_changes: bool) -> None:
        _check_output(self.output, self.resume)
        self.changes = _recipe_changes_on_resume(self.output, self.recipe, allow_changes) if self.resume else {}

    def _load_data(self, data_dir: str | Path | None) -> None:
        """The data folder (required by a dev task) and the corpus, checked line by line."""
        self.dev_tasks = TRAINING_DEV_TASKS.get(self.config.dev_task, ())  # checked with the recipe
        self.data_path = resolve_data_dir(data_dir) if self.dev_tasks else _optional_data_dir(data_dir)
        data = self.recipe.data
        self.corpus = open_corpus(data.corpus, self.data_path, data.max_chars, data.bad_lines, data.text_column)

    def _build_model(self) -> None:
        """The encoder from the backbone, wrapped in the recipe's parts (views, heads, objectives)."""
        model_config = self.recipe.model
        encoder = SentenceEncoder.load(model_config.backbone, model_config.pooler, dropout=model_config.dropout)
        if model_config.max_length > encoder.max_seq_length:
            raise CsekitError(
                f"recipe key model.max_length: {model_config.max_length} is more tokens than "
                f"{model_config.backbone} accepts ({encoder.max_seq_length})"
            )
        self.model, self.views = build_model(self.recipe, encoder)
        if model_config.head_at_test:
            encoder.head = self.model.head

    def _make_loader(self) -> None:
        """Shuffled batches of `batch_size` sentences in all, split evenly over the processes."""
        batch_size, processes = self.config.batch_size, self.accelerator.num_processes
        if batch_size % processes:
            raise CsekitError(
                f"recipe key train.batch_size: {batch_size} is not divisible by the {processes} processes"
            )
        if len(self.corpus) < batch_size:
            raise CsekitError(
                f"corpus {self.recipe.data.corpus} has {len(self.corpus)} sentences, fewer than train.batch_size "
                f"({batch_size})"
            )
        self.loader = DataLoader(
            self.corpus,
            batch_size=batch_size // processes,
            shuffle=True,
            drop_last=True,
            collate_fn=TrainCollator(self.views, self.recipe.data.text_column),
            num_workers=self.recipe.data.num_workers,
            generator=torch.Generator().manual_seed(self.config.seed),
        )

    def _open_output(self, held_until_the_end: contextlib.ExitStack) -> None:
        """Create the folder and lock it for the run (the lock is released when `held_until_the_end` closes)."""
        _create_output(self.output, self.accelerator.process_index)
        if self.main:
            held_until_the_end.enter_context(hold_run_lock(self.output))
            # Staging folders and files of a run killed mid-write (never resumed from); removed under the lock.
            for name in remove_staging_leftovers(self.output):
                print(f"csekit: removed {self.output / name}, left by an interrupted run", file=sys.stderr)

    def _set_up_optimization(self) -> None:
        """AdamW and the linear schedule over the run's length; model, optimizer and loader prepared."""
        optimizer = make_optimizer(self.model, self.recipe)
        self.model, self.optimizer, self.loader = self.accelerator.prepare(self.model, optimizer, self.loader)
        self.steps_per_epoch = len(self.loader)
        if self.steps_per_epoch == 0:
            raise CsekitError(f"corpus {self.recipe.data.corpus} gives no full batch of {self.config.batch_size}")
        # As in the transformers Trainer, max_steps (when set) replaces epochs as the length of the run.
        self.total_steps = self.config.max_steps or self.steps_per_epoch * self.config.epochs
        warmup_steps = math.ceil(self.config.warmup_ratio * self.total_steps)
        self.scheduler = get_linear_schedule_with_warmup(self.optimizer, warmup_steps, self.total_steps)

    def _resume_from_checkpoint(self) -> None:
        """Weights, optimizer, schedule, RNG states and position from checkpoint/; the log cut back to it."""
        for folder in (self.checkpoint_dir, self.output / "best", self.output / "last"):
            recover_directory(folder)
        if (self.checkpoint_dir / STATE_FILE).exists():
            self.state = _read_trainer_state(self.checkpoint_dir / STATE_FILE)
            load_shared_state(
                self.checkpoint_dir,
                self.unwrapped,
                self.optimizer,
                self.scheduler,
                self.accelerator.scaler,
                self.accelerator.device,
            )
            load_rng_state(self.checkpoint_dir, self.accelerator.process_index)
            self.metrics.truncate_after(self.state.step)
        else:  # stopped before its first checkpoint: start over, without the old run's records
            self.metrics.truncate_after(-1)
        if self.changes:
            self.metrics.write({"event": "recipe_changed", "step": self.state.step, "changes": self.changes})

    def _announce_start(self) -> None:
        """Every input, the checkpoint included, has been read: say the precision, save the recipe, log the start."""
        if not self.main:
            return
        for line in self.precision_note:
            print(line, file=sys.stderr)
        atomic_write_text(self.output / SAVED_RECIPE, self.recipe.to_yaml())
        if not self.resume or self.state.step == 0:
            self.metrics.write(
                {
                    "event": "start",
                    "step": 0,
                    "corpus": self.corpus.report.summary(),
                    "total_steps": self.total_steps,
                    "processes": self.accelerator.num_processes,
                    "precision": self.precision,
                }
            )
        if self.trackers:
            self.accelerator.init_trackers(self.recipe.name, config=_flat_hyperparameters(self.recipe))

    # -- the loop --------------------------------------------------------------------------------

    def run(self) -> TrainResult:
        """Step through the batches until `total_steps` (or patience runs out), logging, evaluating and
        checkpointing on the way; Ctrl-C stops after the current step with a checkpoint of it."""
        self._start_progress()
        self.model.train()
        with self._ctrl_c_stops_after_the_step():
            for batch in self._batches():
                if self.step(batch) and self._after_step():
                    break
                if self._any_process(self.interrupt_requested):
                    self._stop_at_interrupt()
        return self.finish()

    def _start_progress(self) -> None:
        """On a terminal one progress bar; when stderr is a file, plain lines at each log record instead."""
        visible = self.show_progress and self.main
        self.plain_lines = visible and not sys.stderr.isatty()
        self.bar = tqdm(
            total=self.total_steps,
            initial=self.state.step,
            desc="training",
            unit="step",
            disable=not visible or self.plain_lines,
            dynamic_ncols=True,
        )
        self.last_loss: float | None = None
        self.last_score: float | None = None  # the latest dev score, shown in the progress bar
        self.checkpointed_batches: int | None = None  # the data position of the latest checkpoint this run wrote
        self.window: dict[str, float] = {}  # loss sums since the last log record
        self.window_steps, self.window_start, self.bad_in_a_row = 0, time.perf_counter(), 0

    def _after_step(self) -> bool:
        """Log and evaluate when due; True when the run is over (its last step, or patience ran out)."""
        if self.state.step % self.config.log_every == 0 or self.state.step == self.total_steps:
            self._log_window()
        eval_due = self.config.eval_every > 0 and self.state.step % self.config.eval_every == 0
        if eval_due or self.state.step == self.total_steps:
            self.evaluate()
            self.window_start = time.perf_counter()
            patience_on = self.config.patience is not None
            if patience_on and self._any_process(self.main and self._patience_ran_out()):
                self._stop_early()
                return True
        return self.state.step >= self.total_steps

    def _batches(self) -> Iterator[dict[str, Any]]:
        """The batches from the data position on, epoch after epoch (each epoch shuffled by its seed)."""
        for epoch in itertools.count(self.state.batches // self.steps_per_epoch):
            if self.state.step >= self.total_steps or self._patience_ran_out():  # done, or stopped early before
                return
            self.loader.set_epoch(epoch)
            skip = self.state.batches - epoch * self.steps_per_epoch
            yield from (self.accelerator.skip_first_batches(self.loader, skip) if skip > 0 else self.loader)

    def step(self, batch: dict[str, Any]) -> bool:
        """One optimizer step on `batch`; False when it was skipped for a non-finite loss or gradient."""
        self.state.batches += 1
        # Always back-propagate (every process must join DDP's gradient all-reduce), then decide
        # together: a step is skipped everywhere when any process's loss or the gradient is not finite.
        loss, parts, grad_norm = forward_backward(
            self.accelerator, self.model, batch, self.config.max_grad_norm, self.state.step, self.steps_per_epoch
        )
        # One all-reduce gives the mean loss and parts over processes (for the log) and, since a NaN
        # anywhere makes the mean NaN, whether every process's loss is finite.
        names = ["loss", *parts]
        values = self.accelerator.reduce(torch.stack([loss.detach(), *parts.values()]).float(), "mean").tolist()
        loss_finite = math.isfinite(values[0])
        if not (loss_finite and bool(torch.isfinite(torch.as_tensor(grad_norm)))):
            self._skip_step("loss" if not loss_finite else "gradient")
            return False
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.bad_in_a_row = 0
        self.state.step += 1
        self.bar.update(1)
        self.last_loss = values[0]
        for name, value in zip(names, values, strict=True):
            self.window[name] = self.window.get(name, 0.0) + value
        self.window_steps += 1
        return True

    def _skip_step(self, reason: str) -> None:
        """Drop the step's gradients and record it; too many in a row stop the run."""
        self.optimizer.zero_grad(set_to_none=True)
        self.state.skipped_steps += 1
        self.bad_in_a_row += 1
        self.metrics.write(
            {
                "step": self.state.step,
                "event": "non_finite_step",
                "reason": reason,
                "skipped_steps": self.state.skipped_steps,
            }
        )
        if self.bad_in_a_row >= self.config.max_bad_steps:
            raise CsekitError(
                f"{self.bad_in_a_row} steps in a row had a non-finite {reason} (after step {self.state.step}); "
                f"stopped. The best model in {self.output / 'best'} is intact; try a lower train.lr"
            )

    def _log_window(self) -> None:
        """A metrics record with the mean loss and parts since the last one, the lr and the throughput."""
        elapsed = time.perf_counter() - self.window_start
        record = {
            "step": self.state.step,
            **{name: total / self.window_steps for name, total in self.window.items()},
            "lr": self.scheduler.get_last_lr()[0],
            "sentences_per_second": self.window_steps * self.config.batch_size / max(elapsed, 1e-9),
        }
        self.metrics.write(record)
        self._report("train", record)
        self.bar.set_postfix_str(_postfix(self.last_loss, self.last_score))
        if self.plain_lines:
            print(_progress_line(record, self.total_steps, self.last_score), file=sys.stderr, flush=True)
        self.window, self.window_steps = {}, 0
        self.window_start = time.perf_counter()

    def dev_scores(self) -> dict[str, float]:
        """The dev task's scores of the model as it is now (none without a dev task)."""
        if not self.dev_tasks:
            return {}
        return evaluate_dev(
            lambda sentences: self.unwrapped.encoder.encode(
                sentences, batch_size=self.config.eval_batch_size, precision=self.precision, show_progress_bar=False
            ),
            self.data_path,
            self.dev_tasks,
            align_uniform=True,
        )

    def evaluate(self) -> None:
        """Score on the dev task, keep the best model by the selection metric, save last/, then checkpoint."""
        scores = self.dev_scores() if self.main else {}
        if self.main:
            self.metrics.write({"step": self.state.step, **scores})
            self._report("dev", {"step": self.state.step, **scores})
            score = scores.get(self.config.select_metric)
            self.unwrapped.encoder.card_facts = training_card_facts(
                self.recipe,
                corpus_sentences=len(self.corpus),
                step=self.state.step,
                total_steps=self.total_steps,
                precision=self.precision,
                scores=scores,
            )
            if _improves(score, self.state.best_score):
                self.state.best_score, self.state.best_step = score, self.state.step
                self.state.evaluations_without_improvement = 0
                self.unwrapped.encoder.save(self.output / "best")
            else:
                self.state.evaluations_without_improvement += 1
            self.unwrapped.encoder.save(self.output / "last")
            self.last_score = score
            self.bar.set_postfix_str(_postfix(self.last_loss, self.last_score))
        self.save_checkpoint()

    def save_checkpoint(self) -> None:
        """The resumable state: weights, optimizer, scheduler, RNG states (every process's) and the step."""
        staging = self.output / ".checkpoint.tmp"
        if self.main:
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir()
        self.accelerator.wait_for_everyone()
        if self.main:
            save_shared_state(staging, self.unwrapped, self.optimizer, self.scheduler, self.accelerator.scaler)
        save_rng_state(staging, self.accelerator.process_index)
        self.accelerator.wait_for_everyone()
        if self.main:
            atomic_write_text(staging / STATE_FILE, json.dumps(self.state.__dict__))
            swap_in(staging, self.checkpoint_dir)
        self.accelerator.wait_for_everyone()
        self.checkpointed_batches = self.state.batches

    def _patience_ran_out(self) -> bool:
        patience = self.config.patience
        return patience is not None and self.state.evaluations_without_improvement >= patience

    def _stop_early(self) -> None:
        """Patience ran out: say so (one line) and record it; best/ holds the model of the best step."""
        if not self.main:
            return
        state, patience = self.state, self.config.patience
        best = "n/a" if state.best_score is None else f"{100 * state.best_score:.2f}"
        record = {"event": "early_stop", "step": state.step, "best_step": state.best_step}
        self.metrics.write({**record, "best_score": state.best_score, "patience": patience})
        self.bar.close()
        print(
            f"csekit: early stop at step {state.step}: {self.config.select_metric} did not improve in {patience} "
            f"evaluations; best {best} at step {state.best_step}, kept in {self.output / 'best'}",
            file=sys.stderr,
        )

    @contextlib.contextmanager
    def _ctrl_c_stops_after_the_step(self) -> Iterator[None]:
        """While the loop runs, Ctrl-C (SIGINT) asks it to stop after the current step; a second one stops at once.

        Stopping between steps keeps the checkpoint consistent (weights, optimizer, RNG and data position of
        one step). Signal handlers can only be set in the main thread; elsewhere Ctrl-C acts as before.
        """
        self.interrupt_requested = False

        def request_stop(signum: int, frame: Any) -> None:
            self.interrupt_requested = True
            signal.signal(signal.SIGINT, previous)

        try:
            previous = signal.signal(signal.SIGINT, request_stop)
        except ValueError:  # not the main thread
            yield
            return
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)

    def _any_process(self, flag: bool) -> bool:
        """Whether `flag` holds on any process: every process then takes the same branch (one all-reduce)."""
        if self.accelerator.num_processes == 1:
            return flag
        total = self.accelerator.reduce(torch.tensor(float(flag), device=self.accelerator.device), "sum")
        return bool(total.item() > 0)

    def _stop_at_interrupt(self) -> None:
        """Checkpoint the step just taken (unless its evaluation did), end the trackers, raise TrainingInterrupted."""
        if self.checkpointed_batches != self.state.batches:
            self.save_checkpoint()
        self.bar.close()
        self.accelerator.end_training()
        raise TrainingInterrupted(self.state.step, self.output)

    def _report(self, section: str, record: dict[str, Any]) -> None:
        """Send a record's numbers to the recipe's trackers (train.report_to), as section/name at its step."""
        values = {f"{section}/{name}": value for name, value in record.items() if name != "step"}
        if self.trackers and values:
            self.accelerator.log(values, step=record["step"])

    def finish(self) -> TrainResult:
        """Close the bar, wait for every process and end accelerate's run."""
        self.bar.close()
        self.accelerator.wait_for_everyone()
        self.accelerator.end_training()
        state = self.state
        return TrainResult(self.output, state.step, state.best_score, state.best_step, state.skipped_steps)


def _available_trackers(report_to: str) -> list[str]:
    """The trackers train.report_to names, each checked to be installed (accelerate would silently drop it)."""
    available = {str(getattr(tracker, "value", tracker)) for tracker in get_available_trackers()}
    names = tracker_names(report_to)
    for name in names:
        if name not in available:
            extra = " (pip install 'csekit[tensorboard]')" if name == "tensorboard" else ""
            raise CsekitError(f"recipe key train.report_to: {name} is not installed{extra}")
    return names


def _flat_hyperparameters(recipe: Recipe) -> dict[str, str | int | float | bool]:
    """The recipe as dotted keys with scalar values (what trackers take as a run's configuration)."""
    flat: dict[str, str | int | float | bool] = {}

    def add(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                add(f"{prefix}.{key}" if prefix else str(key), inner)
        elif isinstance(value, str | int | float | bool):
            flat[prefix] = value
        else:  # lists (objectives, negatives) and None
            flat[prefix] = json.dumps(value)

    add("", asdict(recipe))
    return flat


def _progress_line(record: dict[str, Any], total_steps: int, score: float | None) -> str:
    """A plain progress line for logs written to a file: step, loss, last dev score, throughput."""
    dev = f" dev {100 * score:.2f}" if score is not None else ""
    return (
        f"step {record['step']}/{total_steps} loss {record['loss']:.4f}{dev} "
        f"{record['sentences_per_second']:.1f} sent/s"
    )


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

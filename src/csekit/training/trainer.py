"""The training loop: one code path for CPU, one GPU and several processes (through accelerate).

The loop knows nothing about any method. It asks the recipe's model for the step's total loss and
named parts, steps AdamW on the recipe's schedule (`schedule.py`), evaluates on the dev task every `eval_every`
steps, keeps the best model by the selection metric or the last one (`best_model.py`), and writes `metrics.jsonl`.
Model directories and the resumable training state are written atomically, so an interrupted run never leaves a
half-written checkpoint and `--resume` continues from the last saved state.

Its rooms: the corpus and the batches (`train_data.py`), what a run shows (`progress_log.py`), Ctrl-C and
SIGTERM (`interrupt.py`), checkpoint/ written and read (`checkpoint.py`), how a step runs (`execution.py`: the
precision, the sharding and the step runner, `step_runner.py`, that applies every step the same way).
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import ProjectConfiguration, set_seed

from csekit.core.atomic import atomic_write_text, remove_staging_leftovers
from csekit.core.errors import CsekitError
from csekit.core.run_lock import hold_run_lock
from csekit.core.save_guard import guarded_save, saves_keep
from csekit.encoding.model_folder import non_finite_parameters
from csekit.evaluation.result import EvalResult
from csekit.training.best_model import (
    START_STEP,
    TrainResult,
    early_stop_line,
    keep_if_best,
    resume_selection,
    unscored_best,
)
from csekit.training.card_facts import training_card_facts
from csekit.training.checkpoint import read_checkpoint, write_checkpoint
from csekit.training.compute_copies import ComputeCopies
from csekit.training.dev_scoring import check_dev_representation, dev_precision, score_dev
from csekit.training.execution import build_run_model, planned_steps, start_execution
from csekit.training.interrupt import TrainingInterrupted, ctrl_c_stops_after_the_step
from csekit.training.long_sentences import announce_long_sentences
from csekit.training.model import ContrastiveModel, load_encoder, start_representation_warning
from csekit.training.optimization import forward_backward, make_optimizer
from csekit.training.processes import hint_if_accelerate_started_one_process, own_accelerator_state
from csekit.training.progress_log import ProgressLog, never_active_warnings
from csekit.training.recipe import Recipe
from csekit.training.run_folder import (
    METRICS_FILE,
    SAVED_RECIPE,
    MetricsLog,
    TrainerState,
    check_output,
    check_run_in_folder,
    create_output,
    recipe_changes_on_resume,
    resolve_run_paths,
)
from csekit.training.schedule import Schedule, check_schedule_length
from csekit.training.sharding import FullModel
from csekit.training.step_runner import StepLoop
from csekit.training.trackers import TRACKER_LOGS, available_trackers, hold_tracker_logs, result_values, start_trackers
from csekit.training.train_data import TrainData, epoch_batches
from csekit.training.zero import whole_model_loading
from csekit.training.zero_state import full_model_for

__all__ = ["TrainResult", "Trainer", "TrainingInterrupted", "train"]


def train(
    recipe: Recipe,
    output_dir: str | Path,
    data_dir: str | Path | None = None,
    resume: bool = False,
    show_progress: bool = True,
    allow_changes: bool = False,
) -> TrainResult:
    """Train the recipe's model into `output_dir` (best/, last/, checkpoint/, metrics.jsonl, recipe.yaml).

    With dev tasks, the starting model is scored first (step 0) and is `best/` until a step beats it
    (csekit.training.best_model).

    With `resume`, `recipe` must equal the run's saved recipe key for key, unless `allow_changes`
    (then the changed keys are recorded in metrics.jsonl). The folder is locked for the run.
    """
    with contextlib.ExitStack() as held_until_the_end:
        held_until_the_end.enter_context(own_accelerator_state())
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
        recipe = resolve_run_paths(recipe, output, data_dir, resume)  # recorded absolute (csekit.training.recipe_paths)
        self.recipe = recipe
        self.config = recipe.train
        self.output = output
        self.checkpoint_dir = output / "checkpoint"
        self.resume = resume
        self.show_progress = show_progress
        self._start_accelerator()
        self._check_output_and_recipe(allow_changes)
        set_seed(self.config.seed)
        self.data = TrainData.load(recipe, data_dir)
        process_batch = self.config.batch_size // self.accelerator.num_processes
        planned = check_schedule_length(self.config, planned_steps(recipe, len(self.data.corpus)))  # before any write
        self.execution = self.execution.for_run_length(planned, process_batch)
        self._build_model()
        processes, execution = self.accelerator.num_processes, self.execution
        self.loader = self.data.loader(self.views, processes, execution.chunk_size, self.loader_options)
        self._open_output(held_until_the_end)  # every input is valid: only now is anything written
        self._set_up_optimization()
        self.state = TrainerState()
        self.checkpointed_step: int | None = None  # the step of the last good checkpoint in checkpoint/
        self.metrics = MetricsLog(output / METRICS_FILE, self.main)
        self.unwrapped: ContrastiveModel = self.accelerator.unwrap_model(self.model)
        if resume:
            self._resume_from_checkpoint()
        self.copies: ComputeCopies | None = None  # run.compute_copies (csekit.training.compute_copies)
        if execution.compute_copies:  # from the masters as read (on resume, the checkpoint's)
            self.copies = ComputeCopies(self.unwrapped, self.optimizer, execution.precision)
        self._announce_start()

    # -- setting up ------------------------------------------------------------------------------

    def _start_accelerator(self) -> None:
        """The Accelerator (one process or several) and how it executes the run (`start_execution`)."""
        hint_if_accelerate_started_one_process()
        self.trackers = available_trackers(self.recipe)
        logs = ProjectConfiguration(project_dir=str(self.output), logging_dir=str(self.output / TRACKER_LOGS))
        tracking = {"log_with": self.trackers or None, "project_config": logs if self.trackers else None}
        self.accelerator, self.execution = start_execution(self.recipe, self.trackers, **tracking)
        self.loader_options = self.execution.loader
        self.main = self.accelerator.is_main_process

    def _check_output_and_recipe(self, allow_changes: bool) -> None:
        check_output(self.output, self.resume)
        self.changes = recipe_changes_on_resume(self.output, self.recipe, allow_changes) if self.resume else {}

    def _build_model(self) -> None:
        """The encoder from the backbone, wrapped in the recipe's parts (views, heads, objectives)."""
        with whole_model_loading(self.accelerator):  # ZeRO-3 partitions the whole model in prepare
            encoder = load_encoder(self.recipe, self.execution.weights_dtype)
            check_dev_representation(encoder, self.config)
            self.model, self.views = build_run_model(self.recipe, encoder, self.execution)  # sharded: checked here

    def _open_output(self, held_until_the_end: contextlib.ExitStack) -> None:
        """Create the folder and lock it for the run (the lock is released when `held_until_the_end` closes)."""
        create_output(self.output, self.accelerator.process_index)
        if self.main:
            held_until_the_end.enter_context(hold_run_lock(self.output))
            check_run_in_folder(self.output, self.resume)  # again under the lock: another run may have finished here
            # Staging folders and files of a run killed mid-write (never resumed from); removed under the lock.
            for name in remove_staging_leftovers(self.output, (METRICS_FILE, SAVED_RECIPE)):
                print(f"csekit: removed {self.output / name}, left by an interrupted run", file=sys.stderr)
            if self.trackers:  # where they write over the run: held open, no link at any level
                self.tracker_logs = hold_tracker_logs(self.output, self.recipe, held_until_the_end)

    def _set_up_optimization(self) -> None:
        """AdamW and the recipe's schedule (`csekit.training.schedule`); model, optimizer and loader prepared."""
        optimizer = make_optimizer(self.model, self.recipe)
        self.full_model: FullModel | None = None
        if self.execution.sharding is not None:  # a plain copy on the main process for dev scores and saves
            self.full_model = full_model_for(self.accelerator, self.model, optimizer)
        self.model, self.optimizer, self.loader = self.accelerator.prepare(self.model, optimizer, self.loader)
        self.steps_per_epoch = len(self.loader)
        if self.steps_per_epoch == 0:
            raise CsekitError(f"corpus {self.recipe.data.corpus} gives no full batch of {self.config.batch_size}")
        # As in the transformers Trainer, max_steps (when set) replaces epochs as the length of the run.
        self.schedule = Schedule.of(self.config, self.config.max_steps or self.steps_per_epoch * self.config.epochs)
        self.total_steps, self.scheduler = self.schedule.run_steps, self.schedule.scheduler(self.optimizer)

    def _resume_from_checkpoint(self) -> None:
        """Weights, optimizer, schedule, RNG states and position from checkpoint/; the log cut back to it."""
        total_steps, scheduler = self.total_steps, self.scheduler
        read = functools.partial(
            read_checkpoint, self.accelerator, self.output, scheduler=scheduler, total_steps=total_steps
        )
        if self.full_model is None:
            state = read(self.unwrapped, self.optimizer)
        else:  # the main process reads the whole model and sends every process its shards
            state = self.full_model.resume(read, self.model, self.optimizer, self.recipe)
        if state is not None:
            self.state, self.checkpointed_step = state, state.step
            missing = resume_selection(state, self.config.select_metric, self.output / "best")
            if missing and self.main:
                print(missing, file=sys.stderr)
            self.metrics.truncate_after(state.step)
        else:  # stopped before its first checkpoint: start over, without the old run's records
            self.metrics.truncate_after(-1)
        if self.changes:
            self.metrics.write({"event": "recipe_changed", "step": self.state.step, "changes": self.changes})

    def _announce_start(self) -> None:
        """Every input, the checkpoint included, has been read: say the precision, save the recipe, log the start."""
        if not self.main:
            return
        for line in self.execution.precision_note:
            print(line, file=sys.stderr)
        if self.data.duplicates.distinct < self.data.duplicates.sentences:  # always in metrics.jsonl's start event
            print(f"csekit: {self.data.duplicates.summary()}", file=sys.stderr)
        for line in never_active_warnings(self.unwrapped.part_names, self.steps_per_epoch, self.total_steps):
            print(line, file=sys.stderr)
        if not self._has_dev_tasks():  # the end's last line says it again (`TrainResult.summary`)
            print(f"csekit: warning: {unscored_best()}", file=sys.stderr)
        elif self.state.step == START_STEP and (other := start_representation_warning(self.recipe)) is not None:
            print(other, file=sys.stderr)
        long_sentences = announce_long_sentences(self.data, self.unwrapped.encoder)
        # An accepted change (--allow-changes) reaches the checkpoint's own copy of the recipe with the next
        # checkpoint, which is written as a whole: until then checkpoint/ stays exactly the last good one.
        with self._saving(SAVED_RECIPE):
            atomic_write_text(self.output / SAVED_RECIPE, self.recipe.to_yaml())
        if not self.resume or self.state.step == 0:
            self.metrics.write(
                {
                    "event": "start",
                    "step": 0,
                    "corpus": self.data.corpus.report.summary(),
                    "total_steps": self.total_steps,
                    "processes": self.accelerator.num_processes,
                    "precision": self.execution.precision,
                    "duplicates": self.data.duplicates.record(),
                    **long_sentences,
                }
            )
        if self.trackers:
            start_trackers(self.accelerator, self.tracker_logs, self.recipe)

    # -- the loop --------------------------------------------------------------------------------

    def run(self) -> TrainResult:
        """Step through the batches until `total_steps` (or patience runs out), logging, evaluating and
        checkpointing on the way; Ctrl-C stops after the current step with a checkpoint of it."""
        self._start_progress()
        if self.state.step == START_STEP and self._has_dev_tasks():
            self.evaluate()  # the starting model: best/ until a step beats it
        self.model.train()
        with saves_keep(self._what_is_intact), ctrl_c_stops_after_the_step() as stop:
            for batch in self._batches():
                if self.step(batch) and self._after_step():
                    break
                if self.steps.interrupt_check_due() and self._any_process(stop.requested):
                    self._stop_at_interrupt(stop.signal_number)
        return self.finish()

    def _start_progress(self) -> None:
        """On a terminal one progress bar, when stderr is a file plain lines at each log record instead; and the
        run's step runner (`Execution.step_runner`), from the run's step (on resume, the checkpoint's)."""
        visible = self.show_progress and self.main
        self.progress = ProgressLog(self.total_steps, self.state.step, visible, self.config.select_metric)
        self.checkpointed_batches: int | None = None  # the data position of the latest checkpoint this run wrote
        loop = StepLoop(
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            schedule=self.schedule,
            state=self.state,
            progress=self.progress,
            metrics=self.metrics,
            config=self.config,
            total_steps=self.total_steps,
            processes=self.accelerator.num_processes,
            device=self.accelerator.device,
            best_dir=self.output / "best",
        )
        self.steps = self.execution.step_runner(loop)

    def _after_step(self) -> bool:
        """Log and evaluate when due; True when the run is over (its last step, or patience ran out). The step
        runner says first whether the step count is known now and anything can be due (`StepRunner.settle`)."""
        if not self.steps.settle():
            return False
        if self.state.step % self.config.log_every == 0 or self.state.step == self.total_steps:
            self._log_window()
        eval_due = self.config.eval_every > 0 and self.state.step % self.config.eval_every == 0
        if eval_due or self.state.step == self.total_steps:
            self.evaluate()
            self.progress.restart_window()
            patience_on = self.config.patience is not None
            if patience_on and self._any_process(self.main and self._patience_ran_out()):
                self._stop_early()
                return True
        return self.state.step >= self.total_steps

    def _batches(self) -> Iterator[dict[str, Any]]:
        """The batches from the data position on, until the run is done or stopped early (see `epoch_batches`)."""

        def finished() -> bool:
            return self.state.step >= self.total_steps or self._patience_ran_out()

        return epoch_batches(self.accelerator, self.loader, self.state, self.loader_options, finished)

    def step(self, batch: dict[str, Any]) -> bool:
        """One optimizer step on `batch`, applied by the run's step runner (`csekit.training.step_runner`); False when
        it is known to be skipped for a non-finite loss or gradient."""
        self.state.batches += 1
        # Always back-propagate (every process must join DDP's gradient all-reduce), then decide
        # together: a step is skipped everywhere when any process's loss or the gradient is not finite.
        loss, parts, grad_norm = forward_backward(
            self.accelerator,
            self.model,
            batch,
            self.config.max_grad_norm,
            self.state.step,
            self.steps_per_epoch,
            self.execution.chunk_size,
            self.copies,
        )
        # One all-reduce gives the mean loss and parts over processes (for the log) and, since a NaN
        # anywhere makes the mean NaN, whether every process's loss is finite.
        reduced = self.accelerator.reduce(torch.stack([loss.detach(), *parts.values()]).float(), "mean")
        return self.steps.apply(["loss", *parts], reduced, grad_norm)

    def _log_window(self) -> None:
        """A metrics record with the mean loss and parts since the last one, the lr and the throughput."""
        record = self.progress.record(self.state.step, self.scheduler.get_last_lr()[0], self.config.batch_size)
        self.metrics.write(record)
        self._report("train", record)
        self.progress.show(record)

    def _has_dev_tasks(self) -> bool:
        return bool(self.data.dev)

    def dev_scores(self) -> dict[str, float]:
        """The dev task's scores of the model as it is now (none without a dev task); see `dev_scoring`."""
        if not self._has_dev_tasks():
            return {}
        precision, batch_size = dev_precision(self.config, self.execution.precision), self.execution.eval_batch_size
        plain = self._plain()
        assert plain is not None  # on the main process
        return score_dev(plain.saved_encoder(), plain.head, self.config, precision, batch_size, self.data.dev)

    def evaluate(self) -> None:
        """Score on the dev task, keep the best model by the selection metric, save last/, then checkpoint; at
        step 0 (the starting model) only score it and keep it in best/: a resume from there starts over."""
        self._check_weights_finite()
        with self._saving("best/ and last/"):
            self._score_and_keep()
        if self.state.step > START_STEP:
            self.save_checkpoint()

    def _score_and_keep(self) -> None:
        scores = self.dev_scores() if self.main else {}
        if self.main:
            self.metrics.write({"step": self.state.step, **scores})
            if self.trackers:  # the dev scores in the one result shape (dev/tasks/stsb-dev, dev/averages/avg_sts)
                self.accelerator.log(result_values("dev", EvalResult.from_dev_scores(scores)), step=self.state.step)
            best = keep_if_best(self.state, scores, self.config.select_metric, self.config.keep)
            saved = self._plain().saved_encoder()  # type: ignore[union-attr]  # the main process has it
            facts = training_card_facts(
                self.recipe,
                corpus_sentences=len(self.data.corpus),
                step=self.state.step,
                total_steps=self.total_steps,
                precision=self.execution.precision,
                scores=scores,
                start_scores=self.state.start_scores,
            )
            if best:
                saved.save(self.output / "best", facts)
            if self.state.step > START_STEP:
                saved.save(self.output / "last", facts)
            self.progress.show_score(scores.get(self.config.select_metric), self.state.step)

    def save_checkpoint(self) -> None:
        """The resumable state: weights, optimizer, scheduler, RNG states (every process's) and the step."""
        self._check_weights_finite()
        with self._saving("checkpoint/"):
            write_checkpoint(
                self.accelerator,
                self.output,
                self.unwrapped if self.full_model is None else self.full_model.copy,  # the main process writes it
                self.optimizer if self.full_model is None else self.full_model.optimizer_state(self.optimizer),
                self.scheduler,
                self.state,
                self.recipe.to_yaml(),
            )
        self.checkpointed_batches, self.checkpointed_step = self.state.batches, self.state.step

    def _check_weights_finite(self) -> None:
        """Stop before saving weights that are NaN or infinite: the last good checkpoint stays as it is."""
        plain = self._plain()
        bad = non_finite_parameters(plain) if plain is not None else []
        if self.full_model is not None and self._any_process(bool(bad)) and not bad:
            bad = ["a tensor the main process found"]  # its copy of the sharded model is the whole model
        if bad:
            raise CsekitError(
                f"the weights are no longer finite after step {self.state.step} ({len(bad)} tensors hold NaN or "
                f"infinity, e.g. {bad[0]}); stopped without saving them. The last good checkpoint in "
                f"{self.checkpoint_dir} is kept; try a lower train.lr (it is {self.config.lr:g})"
            )

    def _plain(self) -> ContrastiveModel | None:
        """The whole model as trained so far: under FSDP a plain copy gathered from the shards at the first call
        of each step (every process calls then), held by the main process (None elsewhere)."""
        if self.full_model is None:
            return self.unwrapped
        return self.full_model.at_step(self.model, self.state.step)  # type: ignore[return-value]

    def _saving(self, what: str) -> contextlib.AbstractContextManager[None]:
        """A failed write of `what` (a full disk, a file-size limit) is one line saying the last good checkpoint is
        intact: every write is atomic (core/atomic.py), so the previous checkpoint, best/ and last/ stay whole."""
        return guarded_save(what, self.output, self._what_is_intact)

    def _what_is_intact(self) -> str:
        if self.checkpointed_step is None:
            kept = f"no checkpoint had been written yet in {self.checkpoint_dir}"
        else:
            kept = f"the last good checkpoint ({self.checkpoint_dir}, step {self.checkpointed_step}) is intact"
        return f"{kept}. Free the space, then: csekit train --output {self.output} --resume"

    def _patience_ran_out(self) -> bool:
        patience = self.config.patience
        return patience is not None and self.state.evaluations_without_improvement >= patience

    def _stop_early(self) -> None:
        """Patience ran out: say so (one line) and record it; best/ holds the model of the best step."""
        if not self.main:
            return
        state, patience = self.state, self.config.patience
        record = {"event": "early_stop", "step": state.step, "best_step": state.best_step}
        self.metrics.write({**record, "best_score": state.best_score, "patience": patience})
        self.progress.bar.close()
        print(early_stop_line(state, self.config.select_metric, patience, self.output / "best"), file=sys.stderr)

    def _any_process(self, flag: bool) -> bool:
        """Whether `flag` holds on any process: every process then takes the same branch (one all-reduce)."""
        if self.accelerator.num_processes == 1:
            return flag
        total = self.accelerator.reduce(torch.tensor(float(flag), device=self.accelerator.device), "sum")
        return bool(total.item() > 0)

    def _stop_at_interrupt(self, signal_number: int) -> None:
        """Checkpoint the step just taken (unless its evaluation did), end the trackers, raise TrainingInterrupted."""
        self.steps.catch_up()
        if self.checkpointed_batches != self.state.batches:
            self.save_checkpoint()
        self.progress.bar.close()
        self.accelerator.end_training()
        raise TrainingInterrupted(self.state.step, self.output, signal_number)

    def _report(self, section: str, record: dict[str, Any]) -> None:
        """Send a record's numbers to the recipe's trackers (run.report_to), as section/name at its step."""
        values = {f"{section}/{name}": value for name, value in record.items() if name != "step"}
        if self.trackers and values:
            self.accelerator.log(values, step=record["step"])

    def finish(self) -> TrainResult:
        """Read what is left unread, close the bar, wait for every process and end accelerate's run."""
        self.steps.catch_up()
        self.progress.bar.close()
        self.accelerator.wait_for_everyone()
        self.accelerator.end_training()
        state = self.state
        return TrainResult(
            self.output,
            state.step,
            state.best_score,
            state.best_step,
            state.skipped_steps,
            start_scores=state.start_scores,
            best_scores=state.best_scores,
            select_metric=self.config.select_metric,
            keep=self.config.keep,
            dev_tasks=self._has_dev_tasks(),
            reports=self.main,
        )

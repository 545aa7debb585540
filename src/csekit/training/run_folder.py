"""A run folder: the saved recipe, metrics.jsonl and the resumable state, and the checks made before writing one.

Nothing is created before every input is checked; a folder that holds a run is only continued with
--resume, and only with the recipe it was saved with (unless --allow-changes).
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from csekit.core.atomic import (
    STAGING_MARKER,
    append_text,
    check_writable,
    is_staging_folder,
    refuse_unsafe_file,
    refuse_unsafe_folder,
    write_file,
)
from csekit.core.bounded_read import bounded_lines, open_regular, read_json_file
from csekit.core.errors import CsekitError
from csekit.core.json_lines import RowProblem, json_row
from csekit.core.json_text import json_text
from csekit.core.run_lock import check_not_locked
from csekit.core.save_guard import guarded_save
from csekit.data.data_dir import optional_data_dir
from csekit.training.recipe import RUN_SECTION, SAVED_RECIPE, Recipe, load_recipe, recipe_changes
from csekit.training.recipe_paths import as_recorded, older_run_hint, resolve_recipe_paths
from csekit.training.state_checks import LARGEST_COUNT

STATE_FILE = "trainer_state.json"
CHECKPOINT_STAGING = ".checkpoint.tmp"
"""Where a checkpoint is written before it is swapped in as checkpoint/ (a fixed name: every process finds it)."""

CHECKPOINT_RECIPE = f"checkpoint/{SAVED_RECIPE}"
"""The recipe the checkpoint was written with, saved inside it: the reference a --resume is compared with."""

METRICS_FILE = "metrics.jsonl"

METRICS_LINE_LIMIT = 2**20
"""The longest line of metrics.jsonl read on --resume (csekit's records are a few hundred bytes)."""

FIXED_BY_CHECKPOINT = {"train.lr", "train.weight_decay", "train.optimizer"}
"""Recipe keys whose value a resumed run takes from the checkpoint's optimizer and schedule state, not the recipe:
a change to them cannot take effect on --resume, so even --allow-changes refuses it rather than ignore it."""


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
    start_scores: dict[str, float] | None = None  # the starting model's dev scores (step 0)
    best_scores: dict[str, float] | None = None  # the dev scores of the model in best/
    selected_on: str | None = None  # the train.select_metric best_score and the count of evaluations are on


class MetricsLog:
    """`metrics.jsonl`: one JSON object per logging step or evaluation, flushed as it is written."""

    def __init__(self, path: Path, enabled: bool) -> None:
        self.path = path
        self.enabled = enabled

    def write(self, record: dict[str, Any]) -> None:
        if self.enabled:
            with self._saving():
                append_text(self.path, json_text(record) + "\n")

    def _saving(self) -> contextlib.AbstractContextManager[None]:
        """A cut-off last line is dropped on --resume (`truncate_after`); the records before it are kept."""
        intact = f"the records before the failed one are kept in {self.path}"
        return guarded_save(self.path.name, self.path.parent, intact)

    def truncate_after(self, step: int) -> None:
        """On resume, drop records written after the saved state (they will be written again).

        The log is streamed line by line (each line bounded by METRICS_LINE_LIMIT) into its rewritten copy,
        so a log of any size costs one line of memory. A run killed in the middle of a write leaves a last
        line cut off before its newline: it is dropped, with a note. Any other line that is not a JSON
        record (a complete line, or one before the last) means the file was edited or is not this run's
        log: an error naming the line.
        """
        if not self.enabled:
            return
        refuse_unsafe_file(self.path)  # a link there (even a dangling one) is neither read nor written through
        if not self.path.exists():
            return
        try:
            source = open_regular(self.path)
        except OSError as error:
            raise CsekitError(f"{self.path}: cannot read it ({error.strerror or error})") from None
        with source, self._saving():
            write_file(self.path, lambda handle: self._copy_records(source, handle, step))

    def _copy_records(self, source: BinaryIO, target: BinaryIO, step: int) -> None:
        for number, (line, _) in enumerate(bounded_lines(source, METRICS_LINE_LIMIT), start=1):
            if line is None:
                raise CsekitError(
                    f"{self.path}:{number}: a line longer than {METRICS_LINE_LIMIT} bytes is not a metrics record"
                )
            content = line.rstrip(b"\r\n")
            if not content.strip():
                continue
            record = metrics_record(content)
            if record is None:
                if not line.endswith(b"\n"):  # only the last line can lack its newline
                    print(
                        f"csekit: {self.path}:{number}: dropped a cut-off last line (a crash mid-write)",
                        file=sys.stderr,
                    )
                    continue
                raise CsekitError(f"{self.path}:{number}: not a metrics record (a JSON object with a step)")
            if record.get("step", 0) <= step:
                target.write(content + b"\n")


def metrics_record(content: bytes) -> dict[str, Any] | None:
    """The JSON object of one metrics.jsonl line (without its line end) whose step, if it has one, is a count (a
    step of 10^400 or -5 is no step a run logs), else None."""
    try:
        record = json_row(content, optional={"step": int})
    except RowProblem:
        return None
    return record if _is_count(record.get("step", 0)) else None


def read_trainer_state(path: Path) -> TrainerState:
    """The checkpoint's position (JSON); anything but what csekit wrote is a CsekitError naming the file."""
    values = read_json_file(path, "checkpoint file", limit=2**20)
    try:
        state = TrainerState(**values)
    except TypeError as error:
        raise CsekitError(f"checkpoint file {path} is damaged ({str(error)[:200]})") from None
    counts = (state.step, state.batches, state.skipped_steps, state.evaluations_without_improvement)
    if not all(_is_count(n) for n in counts) or not isinstance(state.history, list):
        raise CsekitError(
            f"checkpoint file {path} is damaged (step, batches, skipped_steps or evaluations_without_improvement "
            "is not a count)"
        )
    if state.step > state.batches:
        raise CsekitError(f"checkpoint file {path} is damaged (step {state.step} is more than the batches consumed)")
    if not (valid_scores(state.start_scores) and valid_scores(state.best_scores)):
        raise CsekitError(f"checkpoint file {path} is damaged (start_scores or best_scores is not a table of scores)")
    if not isinstance(state.selected_on, str | None):
        raise CsekitError(f"checkpoint file {path} is damaged (selected_on is not a metric name)")
    if not _is_score(state.best_score) or not (state.best_step is None or _is_count(state.best_step)):
        raise CsekitError(f"checkpoint file {path} is damaged (best_score is not a number or best_step not a step)")
    return state


def _is_count(value: Any) -> bool:
    """A whole number from 0 to LARGEST_COUNT (2^62: beyond it an epoch's seed overflows torch's generator)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= LARGEST_COUNT


def _is_score(value: Any) -> bool:
    """None or a number (NaN included: a dev score of constant embeddings), never text, a bool or infinity."""
    if value is None:
        return True
    return isinstance(value, int | float) and not isinstance(value, bool) and not math.isinf(value)


def check_output(output_dir: Path, resume: bool) -> None:
    """Refuse to overwrite a run (read-only: nothing is created before all inputs are checked)."""
    if output_dir.exists() and not output_dir.is_dir():
        raise CsekitError(f"output folder {output_dir} is a file")
    check_not_locked(output_dir)
    check_run_in_folder(output_dir, resume)


def check_run_in_folder(output_dir: Path, resume: bool) -> None:
    """A new run needs a folder without a run, --resume one with a run; checked again once the lock is held
    (two runs started together both saw an empty folder: the second overwrote the first's finished run)."""
    checkpoint = output_dir / "checkpoint"
    if checkpoint.is_symlink() or (checkpoint.exists() and not checkpoint.is_dir()):
        raise CsekitError(f"{checkpoint} is not a folder (csekit writes a folder there); move it away")
    for name in (METRICS_FILE, SAVED_RECIPE):  # a link (a dangling one too) would make csekit write elsewhere
        refuse_unsafe_file(output_dir / name)
    for name in ("best", "last", "logs"):  # logs/: where trackers write (a link there was followed on --resume)
        refuse_unsafe_folder(output_dir / name)
    staging = output_dir / CHECKPOINT_STAGING  # found at the first checkpoint, after the training steps
    if os.path.lexists(staging) and not is_staging_folder(staging):
        raise CsekitError(f"{staging} is in the way and csekit did not make it (no {STAGING_MARKER}): move it")
    has_run = any((output_dir / name).exists() for name in (METRICS_FILE, "checkpoint", "best", "last"))
    if has_run and not resume:
        raise CsekitError(
            f"output folder {output_dir} already holds a run; pass --resume to continue it or choose a new folder"
        )
    if resume and not (has_run or (output_dir / SAVED_RECIPE).exists()):
        raise CsekitError(f"nothing to resume in {output_dir}: it holds no run; start one without --resume")


def check_checkpoint(checkpoint: Path) -> bool:
    """Whether `checkpoint` holds a checkpoint to resume from; False when there is none (a run stopped before its
    first one). A folder without its trainer_state.json is refused: resuming would restart from step 0 and cut
    metrics.jsonl back to nothing."""
    if not checkpoint.exists():
        return False
    if not (checkpoint / STATE_FILE).is_file():
        contents = "is empty" if checkpoint.is_dir() and not any(checkpoint.iterdir()) else f"has no {STATE_FILE}"
        raise CsekitError(
            f"checkpoint {checkpoint} {contents}: the checkpoint is incomplete, and resuming would restart the run "
            "from step 0; restore it, or start a new run in another folder"
        )
    return True


def recipe_changes_on_resume(output_dir: Path, recipe: Recipe, allow_changes: bool) -> dict[str, list[Any]]:
    """Keys whose value differs from the recipe the run's checkpoint was written with; refused unless `allow_changes`.

    A resumed run must continue the run that is in the folder: the same length, batch, precision and parts; the
    execution settings (the recipe's `run:` section: how this machine runs a step) may change freely. The reference
    is the copy of the recipe saved inside `checkpoint/` (`CHECKPOINT_RECIPE`), so an edit to the run's
    `recipe.yaml` after the checkpoint is found too (it continued silently: a changed batch size, an lr written
    back but not used); runs older than that copy compare with `recipe.yaml`. Both are read like any recipe
    (bounded YAML, validated).
    """
    saved_path = output_dir / SAVED_RECIPE
    copy_path = output_dir / CHECKPOINT_RECIPE
    reference_path = _reference_path(output_dir)
    if not reference_path.exists():
        return {}
    reference = as_recorded(load_saved_recipe(reference_path), recipe)
    changes = recipe_changes(reference, recipe)
    refused = {key: change for key, change in changes.items() if not key.startswith(f"{RUN_SECTION}.")}
    fixed = {key: change for key, change in refused.items() if key in FIXED_BY_CHECKPOINT}
    if fixed and allow_changes:
        raise CsekitError(
            f"{_named(fixed)}: a resumed run takes this from its checkpoint's optimizer and schedule state in "
            f"{output_dir / 'checkpoint'}, so the change could not take effect; resume with the saved value, or "
            "start a new run with the new one"
        )
    if refused and not allow_changes:
        saved = as_recorded(load_saved_recipe(saved_path), recipe)
        edited = recipe_changes(reference, saved) if reference_path == copy_path else {}
        edited = {key: change for key, change in edited.items() if not key.startswith(f"{RUN_SECTION}.")}
        if edited:
            raise CsekitError(
                f"{saved_path} was edited after the run's checkpoint: {_named(edited)}; the checkpoint continues "
                f"the recipe in {copy_path}. Restore that recipe, or pass --allow-changes to continue with the edits"
            )
        key, (old, new) = next(iter(refused.items()))
        others = f" (and {', '.join(list(refused)[1:])})" if len(refused) > 1 else ""
        raise CsekitError(
            f"recipe key {key} is {new!r} but the run in {output_dir} was saved with {old!r}{others}; resume "
            f"without a recipe and --set to continue it as saved ({saved_path}), or pass --allow-changes"
        )
    return {key: [old, new] for key, (old, new) in changes.items()}


def _reference_path(output_dir: Path) -> Path:
    """The recipe a resumed run continues: the checkpoint's copy, else (a run older than that copy) recipe.yaml."""
    copy_path = output_dir / CHECKPOINT_RECIPE
    return copy_path if copy_path.is_file() else output_dir / SAVED_RECIPE


def load_saved_recipe(path: Path, overrides: Sequence[str] = (), note_legacy_keys: bool = False) -> Recipe:
    """A run folder's recipe, read like any recipe; when it fails on a relative path an older csekit recorded, the
    error says to resume from the folder that run started in (`older_run_hint`)."""
    try:
        return load_recipe(path, overrides, note_legacy_keys=note_legacy_keys)
    except CsekitError as error:
        raise CsekitError(f"{error}{older_run_hint(path, str(error))}") from None


def _recorded(output_dir: Path, resume: bool) -> Recipe | None:
    """The recipe a resumed run continues, read once the folder passed `check_output` (no link is read through);
    None for a new run, or a run folder without one."""
    if not resume:
        return None
    check_output(output_dir, resume)
    reference_path = _reference_path(output_dir)
    return load_saved_recipe(reference_path) if reference_path.is_file() else None


def load_run_recipe(path: Path, overrides: Sequence[str], output_dir: Path, resume: bool) -> Recipe:
    """The recipe file `path` (with `overrides`) for the run in `output_dir`: on `resume`, its relative paths that
    the run's recorded ones end with name those, before its checks read the files (`as_recorded`), so a run's own
    recipe continues it from any folder."""
    recorded = _recorded(output_dir, resume)
    paths = (lambda recipe: as_recorded(recipe, recorded)) if recorded is not None else None
    return load_recipe(path, overrides, paths=paths)


def resolve_run_paths(recipe: Recipe, output_dir: Path, data_dir: str | Path | None, resume: bool) -> Recipe:
    """The recipe a run starts with: every relative path absolute (`csekit.training.recipe_paths`), on `resume`
    the paths the run recorded where the recipe's relative ones name them, so a run continues from any folder."""
    return resolve_recipe_paths(recipe, optional_data_dir(data_dir), _recorded(output_dir, resume))


def _named(changes: dict[str, tuple[Any, Any]]) -> str:
    """`train.batch_size 8 -> 16, train.lr ...` for a message (the first few keys)."""
    named = [f"{key} {old!r} -> {new!r}" for key, (old, new) in list(changes.items())[:4]]
    return ", ".join(named) + (f" and {len(changes) - 4} more" if len(changes) > 4 else "")


def create_output(output_dir: Path, process: int) -> None:
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        check_writable(output_dir, process)
    except OSError as error:
        raise CsekitError(f"output folder {output_dir} is not writable ({error.strerror})") from None


def valid_scores(value: object) -> bool:
    """Whether `value` (a checkpoint's start or best scores) is None or at most 10,000 names mapped to numbers."""
    if value is None:
        return True
    if not isinstance(value, dict) or len(value) > 10_000:
        return False
    return all(
        isinstance(name, str)
        and len(name) <= 1000
        and isinstance(score, int | float)
        and not isinstance(score, bool)
        and not math.isinf(score)
        for name, score in value.items()
    )

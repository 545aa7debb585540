"""A run folder: the saved recipe, metrics.jsonl and the resumable state, and the checks made before writing one.

Nothing is created before every input is checked; a folder that holds a run is only continued with
--resume, and only with the recipe it was saved with (unless --allow-changes).
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from csekit.core.atomic import atomic_write_text
from csekit.core.bounded_read import read_json_file
from csekit.core.errors import CsekitError
from csekit.core.json_text import json_text
from csekit.core.lines import split_lines
from csekit.core.run_lock import check_not_locked
from csekit.training.recipe import Recipe, load_recipe, recipe_changes

STATE_FILE = "trainer_state.json"

SAVED_RECIPE = "recipe.yaml"

SAME_UPDATE_KEYS = {"train.chunk_size", "train.sync_free"}
"""Recipe keys that change how a step is computed (memory, time) but not the update: a resume may change
them without --allow-changes (the change is still recorded in metrics.jsonl)."""


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


class MetricsLog:
    """`metrics.jsonl`: one JSON object per logging step or evaluation, flushed as it is written."""

    def __init__(self, path: Path, enabled: bool) -> None:
        self.path = path
        self.enabled = enabled

    def write(self, record: dict[str, Any]) -> None:
        if self.enabled:
            with open(self.path, "a", encoding="utf-8") as handle:
                handle.write(json_text(record) + "\n")

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
    if not _is_score(state.best_score) or not (state.best_step is None or _is_count(state.best_step)):
        raise CsekitError(f"checkpoint file {path} is damaged (best_score is not a number or best_step not a step)")
    return state


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


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
    has_run = any((output_dir / name).exists() for name in ("metrics.jsonl", "checkpoint", "best", "last"))
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
    """Keys whose value differs from the run's saved recipe; refused unless `allow_changes`.

    A resumed run must continue the run that is in the folder: the same length, batch, precision
    and parts; only `SAME_UPDATE_KEYS` (the chunk size, sync-free steps) may change freely. The saved
    recipe is read like any recipe (yaml.safe_load, then validated).
    """
    saved_path = output_dir / SAVED_RECIPE
    if not saved_path.exists():
        return {}
    changes = recipe_changes(load_recipe(saved_path), recipe)
    refused = {key: change for key, change in changes.items() if key not in SAME_UPDATE_KEYS}
    if refused and not allow_changes:
        key, (old, new) = next(iter(refused.items()))
        others = f" (and {', '.join(list(refused)[1:])})" if len(refused) > 1 else ""
        raise CsekitError(
            f"recipe key {key} is {new!r} but the run in {output_dir} was saved with {old!r}{others}; resume "
            f"without a recipe and --set to continue it as saved ({saved_path}), or pass --allow-changes"
        )
    return {key: [old, new] for key, (old, new) in changes.items()}


def create_output(output_dir: Path, process: int) -> None:
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        probe = output_dir / f".csekit-write-test-{process}"
        probe.write_text("", encoding="utf-8")
        probe.unlink()
    except OSError as error:
        raise CsekitError(f"output folder {output_dir} is not writable ({error.strerror})") from None

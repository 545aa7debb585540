"""The run's trackers (`run.report_to`): which are installed, and the folder they write in.

accelerate's file-based trackers (TensorBoard) write by themselves, over the whole run, into
`logging_dir/<run name>`: event files, and `hparams.yml` in a subfolder. Those writes are inside csekit's
rules like its own: the run name (the recipe's `name`) must be one path component, checked before
anything is created, and `OUTPUT/logs` and `logs/<name>` are folders csekit holds open with no link at
any level (`core/atomic.hold_folder`): accelerate gets the held folder's descriptor path, so a `logs`
link in a run folder from someone else is refused, never followed.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from accelerate import Accelerator
from accelerate.tracking import get_available_trackers

from csekit.core.atomic import HeldFolder, hold_folder
from csekit.core.errors import CsekitError
from csekit.core.safe_names import check_name, child_path
from csekit.evaluation.result import EvalResult
from csekit.training.recipe import TRACKER_FOLDER_OPTIONS, Recipe, tracker_names

TRACKER_LOGS = "logs"
"""The run folder's subfolder where file-based trackers (TensorBoard) write, one folder per recipe name."""


def available_trackers(recipe: Recipe) -> list[str]:
    """The trackers run.report_to names, each checked to be installed (accelerate would silently drop it), and
    the recipe's name checked to be a folder name (a tracker writes in `logs/<name>`)."""
    available = {str(getattr(tracker, "value", tracker)) for tracker in get_available_trackers()}
    names = tracker_names(recipe.run.report_to)
    for name in names:
        if name not in available:
            extra = " (pip install 'csekit[tensorboard]')" if name == "tensorboard" else ""
            raise CsekitError(f"recipe key run.report_to: {name} is not installed{extra}")
    if names:
        check_name(recipe.name, "recipe key name (the trackers' run folder under logs/)", folder=TRACKER_LOGS)
    return names


def hold_tracker_logs(output: Path, recipe: Recipe, held: contextlib.ExitStack) -> HeldFolder:
    """`OUTPUT/logs` and `logs/<recipe name>`, created if missing, held open until `held` closes; a link in either,
    or anywhere below, is a CsekitError."""
    logs = hold_folder(output / TRACKER_LOGS)
    held.callback(logs.close)
    run = hold_folder(child_path(logs.path, recipe.name, "recipe key name"))
    held.callback(run.close)
    return logs


def start_trackers(accelerator: Accelerator, logs: HeldFolder, recipe: Recipe) -> None:
    """Start the trackers with the recipe as the run's configuration, writing into the held `logs` folder: a tracker
    that does not take accelerate's `logging_dir` gets its run folder `logs/<name>` through its own option."""
    accelerator.project_configuration.logging_dir = str(logs.path)
    accelerator.init_trackers(
        recipe.name, config=flat_hyperparameters(recipe), init_kwargs=tracker_options(logs, recipe)
    )


def tracker_options(logs: HeldFolder, recipe: Recipe) -> dict[str, dict[str, str]]:
    """Each named tracker's init options that place its local files in `logs/<recipe name>` (TRACKER_FOLDER_OPTIONS)."""
    run = str(child_path(Path(logs.path), recipe.name, "recipe key name"))
    names = tracker_names(recipe.run.report_to)
    return {name: {option: run} for name in names if (option := TRACKER_FOLDER_OPTIONS[name]) is not None}


def flat_hyperparameters(recipe: Recipe) -> dict[str, str | int | float | bool]:
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


def result_values(section: str, result: EvalResult) -> dict[str, float]:
    """An evaluation's numbers for the trackers, named by their place in the one result shape
    (`dev/tasks/stsb-dev`, `dev/tasks/align/uniform`, `dev/averages/avg_sts`); a score that is no number is left out."""
    values: dict[str, float] = {}

    def add(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                add(f"{prefix}/{key}", inner)
        elif isinstance(value, int | float) and not isinstance(value, bool):
            values[prefix] = float(value)

    add(section, result.as_json())
    return values

"""Running a suite: every pending recipe x seed trained (or resumed), evaluated and written, after every run's
inputs are checked; then the summary."""

from __future__ import annotations

import os
import shlex
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from csekit.bench.results import COSINES_FILE, RESULTS_FILE
from csekit.bench.suite import Suite, SuiteRecipe, load_suite, run_dir, suite_tasks
from csekit.bench.summary import summarise
from csekit.core.atomic import atomic_write_text, write_file
from csekit.core.errors import CsekitError
from csekit.core.json_text import json_text
from csekit.core.save_guard import guarded_save


def _run_one(
    recipe: SuiteRecipe,
    seed: int,
    suite: Suite,
    folder: Path,
    data_dir: Path | None,
    overrides: Sequence[str],
    show_progress: bool,
) -> dict[str, Any]:
    """Train (or resume) one run, evaluate its best model, sample corpus cosines, write results.json last."""
    from csekit.data.corpus import open_corpus
    from csekit.data.data_dir import resolve_data_dir
    from csekit.evaluation.alignment import pairwise_cosines, sample_sentences
    from csekit.evaluation.command_encoder import command_encoder
    from csekit.evaluation.suite import protocol_facts
    from csekit.training.run_folder import load_run_recipe, resolve_run_paths
    from csekit.training.trainer import train

    started = _started(folder)
    # Resumed only from a checkpoint: a run stopped before its first one starts over (its wall time is whole).
    resumed = (folder / "checkpoint").exists()
    # Paths absolute, a started run's as it recorded them: the corpus sampled below is the one it trained on.
    config = load_run_recipe(recipe.path, [*recipe.overrides, *overrides, f"train.seed={seed}"], folder, started)
    config = resolve_run_paths(config, folder, data_dir, started)
    train_start = time.perf_counter()
    result = train(config, folder, data_dir=data_dir, resume=started, show_progress=show_progress)
    train_seconds = time.perf_counter() - train_start
    evaluate_start = time.perf_counter()
    encode = command_encoder(folder / "best", None, "fp32", config.run.eval_batch_size, show_progress=False)
    root = resolve_data_dir(data_dir)
    tasks = suite_tasks(suite, n_jobs=-1)
    evaluation = tasks.run(encode, root)
    corpus = open_corpus(config.data.corpus, root, config.data.max_chars, "skip", config.data.text_column)
    texts = [str(corpus[i]) for i in range(len(corpus))]
    sample = sample_sentences(texts, suite.sample_sentences, seed=seed)
    cosines = pairwise_cosines(encode(sample)).astype(np.float32)
    facts: dict[str, Any] = {"recipe": recipe.name, "seed": seed, "steps": result.steps, "best_step": result.best_step}
    facts.update(protocol_facts(encode.representation, tasks))
    # Wall time of this call (training includes its dev evaluations); a resumed run counts only its last part.
    facts["wall_seconds"] = {
        "train": round(train_seconds, 3),
        "evaluate": round(time.perf_counter() - evaluate_start, 3),
        "resumed": resumed,
    }
    report = evaluation.report(facts)  # the layout of `csekit evaluate --output`, after the run's facts
    intact = f"the run's checkpoint is intact; run the suite again to finish {folder}"
    with guarded_save(f"{COSINES_FILE} and {RESULTS_FILE}", folder, intact):
        write_file(folder / COSINES_FILE, lambda handle: np.save(handle, cosines))
        atomic_write_text(folder / RESULTS_FILE, json_text(report, indent=2) + "\n")
    return report


def _started(folder: Path) -> bool:
    """Whether a run was started in `folder` (it is resumed, with the paths it recorded)."""
    return any((folder / name).exists() for name in ("metrics.jsonl", "checkpoint"))


def _pending_runs(out: Path, suite: Suite) -> list[tuple[SuiteRecipe, int]]:
    """The (recipe, seed) pairs without a results.json yet, in the order they run."""
    return [
        (recipe, seed)
        for recipe in suite.recipes
        for seed in suite.seeds
        if not os.path.lexists(run_dir(out, recipe, seed) / RESULTS_FILE)
    ]


def check_suite_inputs(
    suite: Suite,
    pending: list[tuple[SuiteRecipe, int]],
    data_dir: Path | None,
    overrides: Sequence[str],
    output: Path | None = None,
) -> None:
    """Resolve every pending run's recipe and look up its inputs before the first training (a run started in
    `output` with the paths it recorded).

    One line lists each recipe whose recipe or inputs are wrong (with the command that makes a missing
    input), so that a suite never stops hours in because a later recipe's corpus or counts were never made.
    """
    from csekit.training.inputs import check_recipe_inputs
    from csekit.training.recipe import load_recipe
    from csekit.training.run_folder import load_run_recipe, resolve_run_paths

    problems: dict[str, str] = {}
    for recipe, seed in pending:
        if recipe.name in problems:
            continue
        try:
            settings = [*recipe.overrides, *overrides, f"train.seed={seed}"]
            folder = run_dir(output, recipe, seed) if output is not None else None
            if folder is not None and _started(folder):  # its inputs are those it recorded
                config = load_run_recipe(recipe.path, settings, folder, resume=True)
                config = resolve_run_paths(config, folder, data_dir, resume=True)
            else:
                config = load_recipe(recipe.path, settings)
            check_recipe_inputs(config, data_dir)
        except CsekitError as error:
            problems[recipe.name] = str(error)
    missing_data = _missing_task_data(suite, data_dir) if pending else None
    if problems or missing_data:
        listed = "; ".join(f"[{name}] {problem}" for name, problem in problems.items())
        parts = [f"{len(problems)} recipe(s) cannot run: {listed}"] if problems else []
        parts += [missing_data] if missing_data else []
        raise CsekitError(f"suite {suite.name}: nothing trained, " + "; ".join(parts))


def _missing_task_data(suite: Suite, data_dir: Path | None) -> str | None:
    """The suite's evaluation tasks whose data folder is missing (checked before training, not after it)."""
    from csekit.data.data_dir import find_task_dir, resolve_data_dir
    from csekit.evaluation.tasks import EVAL_TASKS

    try:
        root = resolve_data_dir(data_dir)
    except CsekitError:
        return None  # every recipe's check has said so already
    missing = []
    for name in suite_tasks(suite).names("sts", "dev", "transfer"):
        task = EVAL_TASKS.get(name)
        try:
            if task.load is None:
                find_task_dir(root, task.folder)
        except CsekitError:
            missing.append(name)
    if not missing:
        return None
    return (
        f"[evaluation data] no data for {', '.join(missing)} under {root}: `csekit download-data {root}` fetches "
        "STS12-16, STS-B and SICK; the transfer tasks are read from transfer/MR .. MRPC (README, transfer tasks)"
    )


def _duration(seconds: float) -> str:
    minutes, seconds = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min {seconds:02d} s"


def run_suite(
    suite_path: str | Path,
    output: str | Path,
    data_dir: str | Path | None = None,
    overrides: Sequence[str] = (),
    show_progress: bool = True,
    log: Any = print,
) -> dict[str, Any]:
    """Run every recipe x seed not yet finished, then write the tables and plots; returns what ran.

    Every pending run's inputs are checked first; after each run, the time the rest is expected to take
    (the mean of this call's runs so far) is logged.
    """
    suite = load_suite(suite_path)
    out = Path(output)
    data_path = Path(data_dir) if data_dir else None
    pending = _pending_runs(out, suite)
    check_suite_inputs(suite, pending, data_path, overrides, out)
    out.mkdir(parents=True, exist_ok=True)
    ran: list[str] = []
    skipped = [run_dir(out, r, s).name for r in suite.recipes for s in suite.seeds if (r, s) not in pending]
    for name in skipped:
        log(f"{name}: finished earlier, skipped")
    started = time.perf_counter()
    for index, (recipe, seed) in enumerate(pending, start=1):
        folder = run_dir(out, recipe, seed)
        log(f"{folder.name}: training and evaluating (run {index} of {len(pending)})")
        _run_one(recipe, seed, suite, folder, data_path, overrides, show_progress)
        ran.append(folder.name)
        elapsed = time.perf_counter() - started
        left = len(pending) - index
        if left:
            log(f"{folder.name}: done; {left} run(s) left, about {_duration(elapsed / index * left)} more")
    summary = summarise(out, suite)
    return {"ran": ran, "skipped": skipped, **summary}


def continue_command(suite: Path, output: Path, overrides: list[str], data_dir: Path | None) -> str:
    """The `csekit bench` command line that continues a suite (finished runs are skipped, a training resumes)."""
    words = ["csekit", "bench", str(suite), "--output", str(output)]
    for override in overrides:
        words += ["--set", override]
    if data_dir is not None:
        words += ["--data-dir", str(data_dir)]
    return shlex.join(words)

"""Which model `best/` holds, and what a run says about it at the end.

`train.keep` decides, in `keep_if_best` (the one place every evaluation goes through): `best` (the default) keeps
the best-scoring model on `train.select_metric`; `last` keeps each evaluated step's model in turn, so `best/` ends
as the last one, as the authors' code of TSDAE (sentence-transformers' `fit` without an evaluator) and LLM2Vec
(the model at `stop_after_n_steps`) keeps it. Without a dev task every evaluation replaces it too (nothing to
compare), so both keep the last model there.

With `keep: best` the starting model counts: a run with dev tasks scores the backbone as loaded, in the recipe's
test-time representation, before its first step (step 0) and keeps it in `best/`. A later evaluation replaces it only
when it scores higher on `train.select_metric` than `best/`'s own model does (`best_score_on`: read off best/'s
dev scores, so a metric changed on resume is compared on itself), so a run cannot end with a `best/` worse on the
selection metric than the model it started from; where it can (`train.keep: last`, or a `select_metric` changed on
`--resume` after best/ left the start) the last line says best/ is below the start. A domain engineer's question,
"did adapting help, and if not, keep what I had", is answered by construction; the end of the run shows every dev
score at the start and at `best/`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from csekit.encoding.model_card import before_after_lines
from csekit.training.recipe_schema import KEEPS
from csekit.training.run_folder import TrainerState

START_STEP = 0
"""The step number of the starting model's evaluation (metrics.jsonl, trackers, progress)."""


@dataclass
class TrainResult:
    output_dir: Path
    steps: int
    best_score: float | None
    best_step: int | None
    skipped_steps: int
    start_scores: dict[str, float] | None = None  # every dev score of the starting model (step 0)
    best_scores: dict[str, float] | None = None  # every dev score of the model in best/
    select_metric: str = ""
    keep: str = "best"  # train.keep
    dev_tasks: bool = True  # whether the run scored dev tasks (train.dev_task other than none)
    reports: bool = True  # whether this process reports the run (the main one; every process returns a result)

    def summary(self) -> list[str]:
        """The run's last lines: what best/ holds (saying plainly when it is the starting model, when it scores
        below the start: `train.keep: last`, or a `select_metric` changed on resume, and when nothing was scored to
        compare it with the start), then one table of every dev score at the start and at best/. None on a process
        other than the main one, which alone evaluates and keeps best/ (its own view would contradict it)."""
        if not self.reports:
            return []
        best = self.output_dir / "best"
        metric = self.select_metric
        below = self._below_start()
        if self.best_step is None:  # nothing evaluated since a resume found best/ gone (`resume_selection`)
            lines = [f"trained {self.steps} steps; no evaluated model was kept: {best} is missing"]
        elif not self.dev_tasks:
            lines = [f"trained {self.steps} steps; {unscored_best(self.best_step)} ({best})"]
        elif self.keep == "last":
            score = "" if self.best_score is None else f"; {metric} {100 * self.best_score:.2f}"
            lines = [
                f"trained {self.steps} steps; best/ is the last evaluated model (train.keep: last), step "
                f"{self.best_step}{score}{below} ({best})"
            ]
        elif self.best_step == START_STEP and self.best_score is not None:
            lines = [
                f"trained {self.steps} steps; no step beat the start on {metric} ({100 * self.best_score:.2f}); "
                f"best/ is the starting model ({best})"
            ]
        else:
            score = "n/a" if self.best_score is None else f"{100 * self.best_score:.2f} at step {self.best_step}"
            lines = [f"trained {self.steps} steps; best {metric}: {score}{below}; model in {best}"]
        if self.start_scores and self.best_scores:
            lines += ["", *before_after_lines(self.start_scores, self.best_scores, self.best_step)]
        return lines

    def _below_start(self) -> str:
        """The words ", below the start's S" when best/ scores lower on the selection metric than the start did."""
        start = (self.start_scores or {}).get(self.select_metric)
        if start is None or self.best_score is None or not self.best_score < start:  # NaN compares False
            return ""
        return f", below the start's {100 * start:.2f}"


def unscored_best(best_step: int | None = None) -> str:
    """What a run without dev tasks says at its start and its end: nothing is scored, so nothing keeps best/ (each
    evaluated model in turn) from being worse than the starting model."""
    which = "the last evaluated model" + ("" if best_step is None else f", step {best_step}")
    return (
        f"train.dev_task is none: no model is scored, so best/ is {which}, and nothing keeps it from being "
        "worse than the starting model (name a dev task, e.g. pairs:FILE of your domain, to keep the start when no "
        "step beats it)"
    )


def keep_if_best(state: TrainerState, scores: Mapping[str, float], metric: str, keep: str = "best") -> bool:
    """Note an evaluation's `scores` in `state` (the start's, at step 0); whether its model is the new best/: with
    `keep` best when it scores higher on `metric` than best/ does (`best_score_on`; otherwise one more evaluation
    without improvement, counted against `train.patience`), with `keep` last always."""
    if keep not in KEEPS:
        raise ValueError(f"keep must be one of {', '.join(KEEPS)}, not {keep!r}")
    if state.step == START_STEP:
        state.start_scores = dict(scores)
    select_on(state, metric)
    score = scores.get(metric)
    if keep == "best" and not improves(score, state.best_score):
        state.evaluations_without_improvement += 1
        return False
    state.best_score, state.best_step, state.best_scores = score, state.step, dict(scores)
    state.evaluations_without_improvement = 0
    return True


def best_score_on(state: TrainerState, metric: str) -> float | None:
    """The score on `metric` of the model in best/: read off its own dev scores, so that a run resumed with another
    `train.select_metric` (`--allow-changes`) compares on the metric it now selects on, not on the one best/ was
    kept for; None when best/ was not scored on it (a dev task added on resume: nothing to compare). A checkpoint
    older than `best_scores` has only `best_score`, which is on its one metric."""
    if state.best_scores is None:
        return state.best_score
    return state.best_scores.get(metric)


def select_on(state: TrainerState, metric: str) -> None:
    """Make `state` select on `metric`, the run's `train.select_metric`: `best_score` is best/'s score on it
    (`best_score_on`), and evaluations without improvement counted on another metric (a checkpoint's, before a
    resume with --allow-changes) start again from none."""
    state.best_score = best_score_on(state, metric)
    if state.selected_on not in (None, metric):
        state.evaluations_without_improvement = 0
    state.selected_on = metric


def resume_selection(state: TrainerState, metric: str, best_folder: Path) -> str | None:
    """Continue a checkpoint's selection (`state` as read) in a resumed run: on the run's `metric` (`select_on`), and
    from nothing when `best_folder` is gone (deleted, or a run folder copied without it), so that the next
    evaluation saves best/ again instead of the run ending on "best/ is the starting model" with no best/; then the
    line that says so (None when best/ is there)."""
    select_on(state, metric)
    if state.best_step is None or best_folder.is_dir():
        return None
    step = "the starting model" if state.best_step == START_STEP else f"step {state.best_step}"
    state.best_score = state.best_step = state.best_scores = None
    return (
        f"csekit: {best_folder} is missing (the checkpoint kept {step} there): the run's next evaluation, if any, "
        "keeps its model there, and the start is no longer there to fall back to"
    )


def improves(score: float | None, best: float | None) -> bool:
    """Whether `score` beats `best`; a NaN score (e.g. constant embeddings) or none (the metric missing from an
    evaluation) never beats a kept score, a NaN best always loses. A tie keeps the earlier model (the starting one,
    when nothing moved). With no score kept (no dev task: nothing to compare) the newest model is the best one."""
    if score is None or math.isnan(score):
        return best is None
    return best is None or math.isnan(best) or score > best


def early_stop_line(state: TrainerState, metric: str, patience: int | None, best_folder: Path) -> str:
    """What a run says when `train.patience` stops it: the step, and the best score and where its model is."""
    best = "n/a" if state.best_score is None else f"{100 * state.best_score:.2f}"
    best += f" at step {state.best_step}" + (" (the starting model)" if state.best_step == START_STEP else "")
    return (
        f"csekit: early stop at step {state.step}: {metric} did not improve in {patience} evaluations; best {best}, "
        f"kept in {best_folder}"
    )

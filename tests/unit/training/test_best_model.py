"""The selection rule of best/ (`keep_if_best`) against a plain statement of it, on generated score sequences.

The rule: an evaluated model replaces the one in best/ only when it scores higher on the metric selected now than
best/'s own model does on that metric (a NaN or a missing score never beats a number, a number always beats a NaN,
a tie keeps the earlier model, anything replaces a model with no score), so best/ is never worse on it than the
start; `train.patience` counts the evaluations without improvement on that metric. The sequences switch the metric
at any evaluation, as a run resumed with another `train.select_metric` (`--allow-changes`) does.
"""

from __future__ import annotations

import math
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from csekit.training.best_model import START_STEP, TrainResult, keep_if_best
from csekit.training.run_folder import TrainerState

METRICS = ("pairs:a/spearman", "pairs:b/spearman")

scores = st.fixed_dictionaries(
    {},
    optional={metric: st.one_of(st.floats(-1, 1), st.sampled_from([0.0, 0.5, math.nan])) for metric in METRICS},
)
"""One evaluation's dev scores: any value in [-1, 1], often a repeated one (ties) or NaN (constant embeddings), or
none for a metric (a dev task added or dropped on resume)."""


def beats(new: float | None, kept: float | None) -> bool:
    """The rule, stated apart from csekit's code."""
    if kept is None:
        return True  # nothing to compare with: the newest model is kept
    return new is not None and not math.isnan(new) and (math.isnan(kept) or new > kept)


def same_score(a: float | None, b: float | None) -> bool:
    return a == b or (a is not None and b is not None and math.isnan(a) and math.isnan(b))


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    st.sampled_from(METRICS),
    scores,
    st.lists(st.tuples(st.sampled_from(METRICS), scores), max_size=8),
)
def test_best_is_replaced_only_by_a_model_that_scores_higher_on_the_metric_selected_now(
    start_metric: str, start: dict[str, float], evaluations: list[tuple[str, dict[str, float]]]
) -> None:
    state = TrainerState()
    assert keep_if_best(state, start, start_metric)  # the starting model is best/ first
    kept, kept_step = start, START_STEP  # the scores of the model in best/, followed here
    one_metric = all(metric == start_metric for metric, _ in evaluations)
    without, previous = 0, start_metric  # evaluations without improvement on the metric selected now (patience)
    for step, (metric, evaluation) in enumerate(evaluations, 1):
        state.step = step
        replaced = keep_if_best(state, evaluation, metric)
        assert replaced == beats(evaluation.get(metric), kept.get(metric))
        if replaced:
            kept, kept_step = evaluation, step
        without, previous = 0 if replaced else (without + 1 if metric == previous else 1), metric
        assert state.evaluations_without_improvement == without
        assert state.best_step == kept_step and state.best_scores == kept
        assert same_score(state.best_score, kept.get(metric))  # best/'s score on the metric selected now
        before, now = start.get(metric), kept.get(metric)
        if one_metric and before is not None and not math.isnan(before):
            assert now is not None and not math.isnan(now) and now >= before  # never worse than the start


@settings(max_examples=100, deadline=None, derandomize=True)
@given(st.floats(-1, 1), st.floats(-1, 1), st.sampled_from(["best", "last"]))
def test_the_last_line_says_when_best_is_below_the_start(start: float, best: float, keep: str) -> None:
    metric = METRICS[0]
    result = TrainResult(Path("run"), 4, best, 4, 0, {metric: start}, {metric: best}, select_metric=metric, keep=keep)
    assert (f", below the start's {100 * start:.2f}" in result.summary()[0]) == (best < start)


def test_a_result_that_kept_no_model_does_not_name_one() -> None:
    """A finished run resumed after its best/ was deleted evaluates nothing more: the last line said "model in
    run/best" of a folder that is not there."""
    result = TrainResult(Path("run"), 4, None, None, 0, {METRICS[0]: 0.5}, None, select_metric=METRICS[0])
    assert result.summary() == ["trained 4 steps; no evaluated model was kept: run/best is missing"]


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    best_step=st.one_of(st.none(), st.integers(0, 9)),
    best=st.one_of(st.none(), st.floats(-1, 1)),
    start=st.one_of(st.none(), st.floats(-1, 1)),
    keep=st.sampled_from(["best", "last"]),
    dev_tasks=st.booleans(),
    reports=st.booleans(),
)
def test_the_last_line_never_claims_more_than_the_run_checked(
    best_step: int | None, best: float | None, start: float | None, keep: str, dev_tasks: bool, reports: bool
) -> None:
    """Whatever a run ended with, its last line says the start is kept only when it was scored and kept, says when
    nothing was scored (no dev task: nothing keeps best/ from being worse than the start), and is said once, by the
    main process: another process's own view ("no evaluated model was kept") contradicted it."""
    metric = METRICS[0]
    start_scores = None if start is None or not dev_tasks else {metric: start}
    best_scores = None if best is None or not dev_tasks else {metric: best}
    result = TrainResult(
        Path("run"), 9, best_score=best if dev_tasks else None, best_step=best_step, skipped_steps=0,
        start_scores=start_scores, best_scores=best_scores, select_metric=metric, keep=keep, dev_tasks=dev_tasks,
        reports=reports,
    )  # fmt: skip
    lines = result.summary()
    if not reports:
        assert lines == []
        return
    first = lines[0]
    if "best/ is the starting model" in first:
        assert dev_tasks and keep == "best" and best_step == START_STEP
    assert ("nothing keeps it from being worse than the starting model" in first) == (
        not dev_tasks and best_step is not None
    )
    assert ("is missing" in first) == (best_step is None)

"""The selection rule of best/ (`keep_if_best`) against a plain statement of it, on generated score sequences.

The rule: an evaluated model replaces the one in best/ only when it scores higher on the metric selected now than
best/'s own model does on that metric (a NaN never beats a number, a number always beats a NaN, a tie keeps the
earlier model), so best/ is never worse on it than the start; `train.patience` counts the evaluations without
improvement on that metric. The sequences switch the metric at any evaluation, as
a run resumed with another `train.select_metric` (`--allow-changes`) does.
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
    {metric: st.one_of(st.floats(-1, 1), st.sampled_from([0.0, 0.5, math.nan])) for metric in METRICS}
)
"""One evaluation's dev scores: any value in [-1, 1], often a repeated one (ties) or NaN (constant embeddings)."""


def beats(new: float, kept: float) -> bool:
    """The rule, stated apart from csekit's code."""
    return not math.isnan(new) and (math.isnan(kept) or new > kept)


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
        assert replaced == beats(evaluation[metric], kept[metric])
        if replaced:
            kept, kept_step = evaluation, step
        without, previous = 0 if replaced else (without + 1 if metric == previous else 1), metric
        assert state.evaluations_without_improvement == without
        assert state.best_step == kept_step and state.best_scores == kept
        assert same_score(state.best_score, kept[metric])  # best/'s score on the metric selected now
        if one_metric and not (math.isnan(start[metric]) or math.isnan(kept[metric])):
            assert kept[metric] >= start[metric]  # never worse than the start on the one metric of the run


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

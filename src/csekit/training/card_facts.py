"""What a training run tells the model card of each model it saves (see csekit.encoding.model_card)."""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping
from typing import Any

from csekit.evaluation.result import EvalResult
from csekit.training.dev_selection import dev_task_names
from csekit.training.recipe import Recipe


def training_card_facts(
    recipe: Recipe,
    *,
    corpus_sentences: int,
    step: int,
    total_steps: int,
    precision: str,
    scores: Mapping[str, float],
    start_scores: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """Plain data for the card: the recipe as dicts, so the encoder layer never needs the Recipe type; the dev
    `scores` (as metrics.jsonl logs them) in the one result layout, {"tasks": ..., "averages": ...}; and
    `training`, what csekit.json keeps of the run (read back by `csekit evaluate --mteb` for mteb's ModelMeta:
    the base model, the corpus and the dev tasks as text, and the day the model was saved); `start_scores`, the
    starting model's dev scores (step 0), for the card's before-and-after table."""
    return {
        "training": {
            "base_model": recipe.model.backbone,
            "corpus": recipe.data.corpus,
            "dev_task": dev_task_names(recipe.train.dev_task),  # a file task's mapping as KIND:PATH
            "saved_on": datetime.datetime.now(datetime.UTC).date().isoformat(),
        },
        "recipe": dataclasses.asdict(recipe),
        "corpus_sentences": corpus_sentences,
        "step": step,
        "total_steps": total_steps,
        "precision": precision,
        "select_metric": recipe.train.select_metric,
        "scores": EvalResult.from_dev_scores(scores).as_json(),
        "start_scores": EvalResult.from_dev_scores(start_scores).as_json() if start_scores else None,
    }

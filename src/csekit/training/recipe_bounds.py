"""Every number a recipe gives has bounds, here, checked when the recipe is loaded (before any folder exists).

A count without an upper bound is a memory request: `data.views.num_views: 100000` was killed at 19.8 GB, after
the run folder had been created. So each numeric key of the schema has its range in `SCHEMA_BOUNDS`
(`tests/unit/training/test_recipe_bounds.py` fails for a numeric key that has none), each part option its range in
`OPTION_BOUNDS` by its name, any other integer option `DEFAULT_OPTION_BOUND`, and what they multiply into is
bounded as a whole: the views a step makes (`MAX_VIEWS`) and the tokens it encodes (`MAX_STEP_TOKENS`, batch x views
x max_length). Floats must be finite (the schema's and the part options' type checks); those with a range have it
here too. Relations between keys (a chunk no larger than the batch) stay with the keys' other checks.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from csekit.core.errors import CsekitError
from csekit.core.numbers import is_finite_number
from csekit.data.corpus import MAX_SENTENCE_CHARS
from csekit.parts.negatives.momentum import MAX_QUEUE_SIZE
from csekit.training.recipe_schema import MAX_SEED
from csekit.training.recipe_values import MAX_WORKERS, Part, Where, part_options, views_made

MAX_BATCH = 2**16
"""The largest batch (sentences a step) or evaluation batch: LLM2Vec's recipes use 128, SimCSE's 64 to 512."""
MAX_LENGTH = 131_072
"""The most tokens of a sentence (transformers' longest positions csekit loads, `CONFIG_LIMITS`)."""
MAX_VIEWS = 16
"""The most views of each sentence a step makes (each is another pass of the whole batch); methods use 2 to 4."""
MAX_STEP_TOKENS = 2**24
"""The most tokens one step encodes, batch x views x max_length (16.8 million: 4,096 x 2 x 2,048; LLM2Vec's
recipes encode 128 x 2 x 128)."""
MAX_WIDTH = 2**16
"""The largest width or group count a part option gives (model widths are at most 32,768)."""
MAX_STEPS = 10**9
FLOAT_MAX = sys.float_info.max


@dataclass(frozen=True)
class Bound:
    """A closed range [low, high] (`open_low`/`open_high`: the end excluded); `why` is said in the error."""

    low: float
    high: float
    why: str = ""
    open_low: bool = False
    open_high: bool = False
    nullable: bool = False  # null is allowed (and means what the key's comment says)

    def holds(self, value: float) -> bool:
        above = value > self.low if self.open_low else value >= self.low
        below = value < self.high if self.open_high else value <= self.high
        return is_finite_number(value) and above and below

    def text(self) -> str:
        if self.high == FLOAT_MAX and not self.open_high:
            within = f"a finite number {'>' if self.open_low else '>='} {_number(self.low)}"
        elif self.open_low or self.open_high or not (float(self.low).is_integer() and float(self.high).is_integer()):
            left, right = "(" if self.open_low else "[", ")" if self.open_high else "]"
            within = f"in {left}{_number(self.low)}, {_number(self.high)}{right}"
        else:
            within = f"from {_number(self.low)} to {_number(self.high)}"
        return within + (", or null" if self.nullable else "") + (f" ({self.why})" if self.why else "")


def _number(value: float) -> str:
    return f"{int(value):,}" if float(value).is_integer() and abs(value) < 2**63 else f"{value:g}"


SCHEMA_BOUNDS: Mapping[str, Bound] = {
    "model.max_length": Bound(4, MAX_LENGTH, "tokens of a sentence; the backbone's positions bound it further"),
    "model.dropout": Bound(0, 1, "null keeps the backbone's own", open_high=True, nullable=True),
    "data.max_chars": Bound(1, MAX_SENTENCE_CHARS, "characters of a sentence"),
    "train.batch_size": Bound(2, MAX_BATCH, "contrastive learning needs negatives"),
    "train.lr": Bound(0, FLOAT_MAX, open_low=True),
    "train.epochs": Bound(1, 10_000),
    "train.max_steps": Bound(1, MAX_STEPS, "null: train.epochs gives the length", nullable=True),
    "train.eval_every": Bound(0, MAX_STEPS, "0 evaluates only at the end"),
    "train.log_every": Bound(1, MAX_STEPS),
    "train.seed": Bound(0, MAX_SEED, "numpy's seed range"),
    "train.warmup_ratio": Bound(0, 1, open_high=True),
    "train.schedule_steps": Bound(1, MAX_STEPS, "the schedule's length; null: the run's", nullable=True),
    "train.weight_decay": Bound(0, FLOAT_MAX),
    "train.max_grad_norm": Bound(
        0, FLOAT_MAX, "the gradient norm is clipped to it; null for no clipping", True, nullable=True
    ),
    "train.max_bad_steps": Bound(1, 10**6),
    "train.patience": Bound(1, 10**6, "evaluations without improvement; null: no early stopping", nullable=True),
    "run.packed_bucket": Bound(0, 2**20, "0 is off; else a multiple of tokens"),
    "run.length_group_size": Bound(0, MAX_BATCH, "0 is one pass"),
    "run.chunk_size": Bound(1, MAX_BATCH, "null: the whole batch in one pass", nullable=True),
    "run.num_workers": Bound(0, MAX_WORKERS, "DataLoader worker processes, or auto"),
    "run.eval_batch_size": Bound(1, MAX_BATCH),
}
"""The range of every numeric key of the recipe's schema (`tests/unit/training/test_recipe_bounds.py` lists them from
the schema and fails for one missing here)."""

OPTION_BOUNDS: Mapping[str, Bound] = {
    "num_views": Bound(1, MAX_VIEWS, "views of each sentence; each is a pass of the whole batch"),
    "num_positives": Bound(1, MAX_VIEWS, "views the head makes of each sentence"),
    "queue_size": Bound(1, MAX_QUEUE_SIZE, "vectors in the queue"),
    "queue_ratio": Bound(0, MAX_QUEUE_SIZE, "the queue's length in batches", open_low=True),
    "num_groups": Bound(1, MAX_WIDTH),
    "group_size": Bound(1, MAX_WIDTH),
    "hidden_dim": Bound(1, MAX_WIDTH),
    "dim": Bound(1, MAX_WIDTH),
    "dims": Bound(1, MAX_WIDTH),
    "max_length": Bound(1, MAX_LENGTH),
    "min_tokens": Bound(0, MAX_LENGTH),
    "min_masked_words": Bound(0, MAX_LENGTH),
    "seed": Bound(0, MAX_SEED, "numpy's seed range"),
}
"""The range of a part option, by its name (any part); an integer in a list (`dims: [768, 64]`) each."""

DEFAULT_OPTION_BOUND = Bound(-(2**31), 2**31 - 1, "a part's whole-number option")
"""The range of an integer part option not in `OPTION_BOUNDS` (view indices are checked against the views)."""


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _refuse(where: Where, key: str, bound: Bound, value: Any) -> CsekitError:
    return CsekitError(f"{where(key)}: recipe key {key} must be {bound.text()}, got {value!r}")


def check_schema_bounds(recipe: Any, where: Where) -> None:
    """Each numeric schema key within its `SCHEMA_BOUNDS` range (a text such as `auto` is checked by its key)."""
    for key, bound in SCHEMA_BOUNDS.items():
        section, name = key.split(".")
        value = getattr(getattr(recipe, section), name)
        if value is None and bound.nullable:
            continue
        if _is_number(value) and not bound.holds(value):
            raise _refuse(where, key, bound, value)


def check_option_bounds(parts: Sequence[Part], where: Where) -> None:
    """Each number among the parts' options (or in a list of them) within its name's range."""
    for key, _, spec in parts:
        for option, value in spec.items():
            if option in ("name", "weight"):
                continue
            values = value if isinstance(value, list | tuple) else [value]
            for item in values:
                if not _is_number(item):
                    continue
                bound = OPTION_BOUNDS.get(option, DEFAULT_OPTION_BOUND if isinstance(item, int) else None)
                if bound is not None and not bound.holds(item):
                    raise _refuse(where, f"{key}.{option}", bound, value)


def check_step_size(recipe: Any, parts: Sequence[Part], where: Where) -> None:
    """The views a step makes of each sentence (`data.views`, however it counts them) and the tokens it encodes at
    once (`run.chunk_size` rows of the batch at a time, when set)."""
    factory, spec = next((factory, spec) for key, factory, spec in parts if key == "data.views")
    views = views_made(factory, part_options(factory, spec))
    if views is None:  # a views part that does not say: checked when it runs
        return
    batch_size, chunk_size, max_length = recipe.train.batch_size, recipe.run.chunk_size, recipe.model.max_length
    if not 1 <= views <= MAX_VIEWS:
        raise CsekitError(
            f"{where('data.views')}: recipe key data.views: it makes {views:,} views of each sentence; at most "
            f"{MAX_VIEWS} (each is a pass of the whole batch)"
        )
    rows, key = (batch_size, "train.batch_size") if chunk_size is None else (chunk_size, "run.chunk_size")
    tokens = rows * views * max_length
    if tokens > MAX_STEP_TOKENS:
        raise CsekitError(
            f"{where(key)}: recipe key {key}: a pass would encode up to {tokens:,} tokens ({key} {rows} x {views} "
            f"views x model.max_length {max_length}); at most {MAX_STEP_TOKENS:,}: pass the batch in parts "
            "(run.chunk_size), or make fewer views or tokens"
        )

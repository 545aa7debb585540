"""Published numbers (the papers' tables, kept as YAML data) and how a run's seeds compare with them.

A published file (`benchmarks/published/*.yaml`) maps a recipe name to either its paper's row::

    dclr-bert-base:
      source: DCLR camera-ready Table 1, BERT-base "+DCLR (Ours)" (paper 002)
      scores: {STS12: 70.81, ..., STS Avg.: 77.22}   # x 100, the papers' column labels
      note: ...                                        # optional
      paper_baseline: {source: ..., scores: {...}}     # optional: the paper's own baseline run

or the reason there is none (`reason: ...`): a number that could not be read is never guessed.

Whether a paper's number lies within csekit's seed spread is judged with a 95% prediction interval for
one more run: mean ± t(0.975, n-1) · s · sqrt(1 + 1/n), with s the standard deviation over the n seeds
(n - 1 in the denominator). A paper reports one training run (or a mean of a few), so the question is
whether that run could have been one more of csekit's seeds, not whether it equals csekit's mean; an
interval around the mean (± 2 s / sqrt(n)) would call a paper's single lucky seed a mismatch even when
csekit reproduces the method exactly. It needs at least 2 seeds and assumes scores spread normally over
seeds; with 3 seeds the interval is wide (± 4.97 s), which is what 3 seeds can say.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from csekit.core.bounded_read import read_yaml_file
from csekit.core.errors import CsekitError, at, did_you_mean
from csekit.core.numbers import is_finite_number
from csekit.evaluation.tasks import table_columns

STS_AVERAGE = "STS Avg."
TRANSFER_AVERAGE = "Transfer Avg."
PUBLISHED_COLUMNS: tuple[str, ...] = (
    *(label for label, _, _ in table_columns("sts")),
    STS_AVERAGE,
    *(label for label, _, _ in table_columns("transfer")),
    TRANSFER_AVERAGE,
)
"""Column labels a published row may give, in the papers' order (those of `csekit bench`'s tables)."""

ENTRY_KEYS = ("source", "scores", "note", "means", "paper_baseline", "reason")
UNKNOWN_RUNS = 2
"""The runs behind a published mean whose count the source does not give: 2, the fewest a mean has and so the
widest range it can fall in (the verdict then says "outside" only where no mean of runs could be)."""
PREDICTION_LEVEL = 0.95
"""Coverage of the one-run prediction interval that decides whether a paper's number is within the seed spread."""


@dataclass(frozen=True)
class PublishedRow:
    """One recipe's published numbers (x 100, by column label), or the reason it has none."""

    recipe: str
    source: str | None = None
    scores: dict[str, float] = field(default_factory=dict)
    note: str | None = None
    reason: str | None = None
    means: dict[str, int | None] = field(default_factory=dict)  # column -> runs it is the mean of (None: not given)
    # The baseline the paper compares this row with when it is the paper's own run (SLT-FAI reruns SimCSE at
    # batch 32), not the suite baseline's published row; a method's delta is taken against it.
    paper_baseline: PublishedRow | None = None

    def runs_of(self, label: str) -> int:
        """How many runs the published number of `label` is the mean of (1: one run, as most papers report)."""
        if label not in self.means:
            return 1
        return self.means[label] or UNKNOWN_RUNS


def _line(node: yaml.Node | None, key: str) -> int | None:
    """The line of `key` in the top-level mapping `node` (1-based), for error messages."""
    if isinstance(node, yaml.MappingNode):
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.value == key:
                return key_node.start_mark.line + 1
    return None


def _score(value: Any) -> float | None:
    """A published score: a finite number in [-100, 100] (x 100), else None."""
    if not is_finite_number(value):
        return None
    number = float(value)
    return number if -100.0 <= number <= 100.0 else None


def _text(value: Any) -> str | None:
    return value.strip() if isinstance(value, str) and value.strip() else None


def load_published(path: str | Path) -> dict[str, PublishedRow]:
    """Read and check a published-numbers file; a mistake is one CsekitError naming the file and line."""
    path = Path(path)
    raw, node = read_yaml_file(path, "published-numbers file")
    if not isinstance(raw, dict) or not raw:
        raise CsekitError(f"{path}: a published-numbers file maps recipe names to {{source, scores}} or {{reason}}")
    rows: dict[str, PublishedRow] = {}
    for recipe, entry in raw.items():
        where = at(path, _line(node, str(recipe)))
        if str(recipe) in rows:  # `~` and "None", `true` and "True": one recipe name
            raise CsekitError(
                f'{where}: two entries name recipe "{recipe}" (YAML reads ~ as None, true as True); keep one'
            )
        rows[str(recipe)] = _row(str(recipe), entry, where)
    return rows


def _row(recipe: str, entry: Any, where: str, keys: tuple[str, ...] = ENTRY_KEYS) -> PublishedRow:
    """One entry, checked: `source` and `scores` (and an optional `note`, `means`, `paper_baseline`), or a `reason`
    alone; `keys`: those allowed (a paper baseline holds no paper baseline and no reason)."""
    if not isinstance(entry, dict):
        raise CsekitError(f"{where}: {recipe}: an entry is a mapping with {{source, scores}} or {{reason}}")
    unknown = sorted(str(key) for key in entry if key not in keys)
    if unknown:
        raise CsekitError(f"{where}: {recipe}: unknown key {unknown[0]!r}; expected {list(keys)}")
    reason = _text(entry.get("reason"))
    if "reason" in entry:
        if reason is None or set(entry) != {"reason"}:
            raise CsekitError(f"{where}: {recipe}: a reason is a non-empty text, given alone (without scores)")
        return PublishedRow(recipe, reason=reason)
    source, scores = _text(entry.get("source")), entry.get("scores")
    if source is None or not isinstance(scores, dict) or not scores:
        raise CsekitError(
            f"{where}: {recipe}: give `source` (the paper and table) and `scores`, or a `reason` there are none"
        )
    checked: dict[str, float] = {}
    for label, value in scores.items():
        if str(label) not in PUBLISHED_COLUMNS:
            raise CsekitError(
                f"{where}: {recipe}: unknown column {label!r}{did_you_mean(str(label), PUBLISHED_COLUMNS)}; "
                f"expected one of {list(PUBLISHED_COLUMNS)}"
            )
        number = _score(value)
        if number is None:
            raise CsekitError(f"{where}: {recipe}: {label} must be a number in [-100, 100] (x 100), not {value!r}")
        checked[str(label)] = number
    ordered = {label: checked[label] for label in PUBLISHED_COLUMNS if label in checked}
    note = entry.get("note")
    if note is not None and _text(note) is None:
        raise CsekitError(f"{where}: {recipe}: note must be a non-empty text")
    means = _means(recipe, entry.get("means"), ordered, where)
    baseline = None
    if entry.get("paper_baseline") is not None:
        inner = tuple(key for key in keys if key not in ("paper_baseline", "reason"))
        baseline = _row(f"{recipe}.paper_baseline", entry["paper_baseline"], where, inner)
    return PublishedRow(recipe, source=source, scores=ordered, note=_text(note), means=means, paper_baseline=baseline)


def _means(recipe: str, value: Any, scores: dict[str, float], where: str) -> dict[str, int | None]:
    """`means: {runs: N or unknown, columns: [...]}`: which published numbers are means over runs (default all)."""
    if value is None:
        return {}
    if not isinstance(value, dict) or set(value) - {"runs", "columns"} or "runs" not in value:
        raise CsekitError(f"{where}: {recipe}: means is {{runs: N or unknown, columns: [...]}} (columns optional)")
    runs = value["runs"]
    if runs != "unknown" and not (isinstance(runs, int) and not isinstance(runs, bool) and 2 <= runs <= 1000):
        raise CsekitError(f"{where}: {recipe}: means.runs must be a count from 2 to 1000 or unknown, not {runs!r}")
    columns = value.get("columns", list(scores))
    if not isinstance(columns, list) or not columns or any(str(column) not in scores for column in columns):
        raise CsekitError(f"{where}: {recipe}: means.columns must list columns of this entry's scores, not {columns!r}")
    return dict.fromkeys((str(column) for column in columns), None if runs == "unknown" else runs)


def paper_delta(row: PublishedRow, baseline: PublishedRow | None, label: str = STS_AVERAGE) -> float | None:
    """The paper's own difference on column `label`: its row minus the baseline it compares the row with (the
    row's `paper_baseline`, else `baseline`, the suite baseline's published row); None where either lacks it."""
    against = row.paper_baseline or baseline
    if against is None or label not in row.scores or label not in against.scores:
        return None
    return row.scores[label] - against.scores[label]


@dataclass(frozen=True)
class PaperComparison:
    """csekit's seeds on one column against the paper's number (all x 100)."""

    paper: float
    mean: float
    std: float  # over seeds with ddof=0, as in the results table
    seeds: int
    low: float | None  # the prediction interval for the paper's kind of number; None with fewer than 2 seeds
    high: float | None
    runs: int = 1  # the runs the paper's number is the mean of

    @property
    def difference(self) -> float:
        """csekit's mean minus the paper's number."""
        return self.mean - self.paper

    @property
    def within(self) -> bool | None:
        """Whether the paper's number lies in the one-run interval; None when it cannot be judged (one seed)."""
        if self.low is None or self.high is None:
            return None
        return self.low <= self.paper <= self.high


def compare_with_paper(paper: float, values: Sequence[float], runs: int = 1) -> PaperComparison:
    """Compare one published number, one run's or the mean of `runs` runs, with csekit's values over seeds (x 100).

    The range is where such a number from csekit would fall with 95% probability: the mean of `runs` more
    runs, mean ± t(0.975, n - 1) · s · sqrt(1/runs + 1/n) (one run: sqrt(1 + 1/n)).
    """
    from scipy.stats import t as student_t

    if not values:
        raise ValueError("compare_with_paper needs at least one seed's value")
    n = len(values)
    mean = math.fsum(values) / n
    spread = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / n)
    low = high = None
    if n >= 2:
        sample_std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
        half = float(student_t.ppf(0.5 + PREDICTION_LEVEL / 2, n - 1)) * sample_std * math.sqrt(1 / runs + 1 / n)
        low, high = mean - half, mean + half
    return PaperComparison(paper, mean, spread, n, low, high, runs)

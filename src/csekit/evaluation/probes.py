"""OssCSE's bias probes: does a model follow surface (word overlap) or meaning?

Two probes (Shi et al., OssCSE, sections 3.1-3.2):

* **Cont./Oppn. splits of STS.** Surface similarity is the match error rate (MER) of a pair's words;
  meaning is the gold score. Per dataset, a pair whose surface agrees with its meaning (high score and
  low MER, or low score and high MER) is *Cont.*, the rest (ties at a median included) *Oppn.*. A
  model that scores Cont. far better than Oppn. leans on surface overlap.
* **Sentence transformations.** A hand-written probe set: each sentence with a paraphrase of different
  surface, a negation, an insertion, a deletion, a substitution and an unrelated sentence; the probe
  reports mean similarity per transformation and how often a negation beats its paraphrase.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from csekit.core.errors import CsekitError, at
from csekit.core.json_lines import json_rows, parse_json_row
from csekit.core.lines import split_lines
from csekit.data.data_dir import STS_SUBSETS, resolve_data_dir
from csekit.evaluation.sts_data import read_split, read_year
from csekit.evaluation.tasks import StsSubset
from csekit.prep.match_error import mer

Encoder = Callable[[list[str]], np.ndarray]

# The paper's Table 2: dataset -> (Cont., Oppn., median gold score, median MER).
PAPER_TABLE2: dict[str, tuple[int, int, float, float]] = {
    "STS12-MSRvid": (406, 344, 2.4, 0.444),
    "STS13-headlines": (495, 255, 2.6, 0.625),
    "STS13-OnWN": (286, 275, 2.4, 0.556),
    "STS14-deft-forum": (251, 199, 2.6, 0.4375),
    "STS14-headlines": (483, 267, 3.0, 0.6),
    "STS14-images": (461, 289, 3.2, 0.5),
    "STS15-answers-students": (494, 256, 3.0, 0.75),
    "STS15-headlines": (517, 233, 2.6, 0.625),
    "STS15-images": (548, 202, 2.5, 0.538),
    "STS16-answer-answer": (134, 120, 2.0, 0.5),
    "STS16-headlines": (160, 89, 2.0, 0.625),
    "STS16-plagiarism": (153, 77, 3.0, 0.737),
    "STS16-postediting": (180, 64, 3.0, 0.416),
    "STS16-question-question": (75, 134, 2.0, 0.4),
    "STSB-train": (3532, 2217, 3.0, 0.536),
    "STSB-test": (855, 524, 2.8, 0.516),
}
SCORE_RANGE = (2.0, 3.5)
"""Only datasets whose median gold score lies here are split (the paper's footnote 3)."""

TRANSFORMATIONS = ("paraphrase", "negation", "insertion", "deletion", "substitution", "random")


def split_cont_oppn(scores: Sequence[float], mers: Sequence[float]) -> np.ndarray:
    """Boolean mask of Cont. pairs: strictly above/below both medians in agreeing directions.

    Ties at either median go to Oppn.; with this rule our counts equal Table 2 exactly on the subsets
    with many ties (STS16-question-question: 49 pairs at the median score).
    """
    gold = np.asarray(scores, dtype=np.float64)
    surface = np.asarray(mers, dtype=np.float64)
    median_gold, median_mer = np.median(gold), np.median(surface)
    return ((gold > median_gold) & (surface < median_mer)) | ((gold < median_gold) & (surface > median_mer))


@dataclass
class ProbeDataset:
    """One STS dataset (an STS12-16 subset or an STS-B split) with its pairs' MER and split."""

    name: str
    subset: StsSubset
    mers: np.ndarray
    cont: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.cont = split_cont_oppn(self.subset.scores, self.mers)

    @property
    def median_score(self) -> float:
        return float(np.median(self.subset.scores))

    @property
    def median_mer(self) -> float:
        return float(np.median(self.mers))

    @property
    def in_range(self) -> bool:
        return SCORE_RANGE[0] <= self.median_score <= SCORE_RANGE[1]


def load_probe_datasets(data_dir: str | Path | None) -> list[ProbeDataset]:
    """Every STS12-16 subset and the STS-B train/dev/test splits, named as in the paper's Table 2.

    The paper splits each *subset* (STS12-MSRvid, ...) separately, because gold scores are only
    comparable within one annotation batch; STS-B's splits are separate datasets there too.
    """
    root = resolve_data_dir(data_dir)
    subsets: list[tuple[str, StsSubset]] = []
    for task in STS_SUBSETS:
        subsets += [(f"{task}-{sub.name.removeprefix('surprise.')}", sub) for sub in read_year(root, task)]
    subsets += [(f"STSB-{split}", read_split(root, "STSBenchmark", split)) for split in ("train", "dev", "test")]
    return [
        ProbeDataset(name, sub, np.array([mer(a, b) for a, b in zip(sub.sentences1, sub.sentences2, strict=True)]))
        for name, sub in subsets
    ]


def select_datasets(datasets: Sequence[ProbeDataset], which: str) -> list[ProbeDataset]:
    """`rule`: median gold score in [2, 3.5] (the paper's stated rule); `paper`: the 16 of Table 2."""
    if which == "rule":
        return [d for d in datasets if d.in_range]
    if which == "paper":
        return [d for d in datasets if d.name in PAPER_TABLE2]
    raise CsekitError(f'--datasets: unknown choice "{which}"; choose rule or paper')


def _spearman(predicted: np.ndarray, gold: np.ndarray) -> float | None:
    from scipy.stats import spearmanr

    if len(gold) < 2 or np.all(gold == gold[0]) or np.all(predicted == predicted[0]):
        return None
    return float(spearmanr(predicted, gold)[0])


def _cosines(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        cos = np.einsum("ij,ij->i", u, v) / (np.linalg.norm(u, axis=1) * np.linalg.norm(v, axis=1))
    return np.nan_to_num(cos)


def _weighted(rows: list[dict[str, Any]], key: str, count: str) -> float | None:
    pairs = [(row[key], row[count]) for row in rows if row[key] is not None and row[count] > 0]
    if not pairs:
        return None
    return float(sum(v * n for v, n in pairs) / sum(n for _, n in pairs))


def bias_probe(encode: Encoder | None, datasets: Sequence[ProbeDataset]) -> dict[str, Any]:
    """Counts and medians per dataset, and (with `encode`) Spearman on each split plus weighted averages.

    Weighted averages weight each dataset's Spearman by its split's number of pairs (the paper's Table 3).
    """
    similarities: dict[str, np.ndarray] = {}
    if encode is not None:
        sentences = list(dict.fromkeys(s for d in datasets for s in (*d.subset.sentences1, *d.subset.sentences2)))
        embeddings = np.asarray(encode(sentences), dtype=np.float32)
        row = {s: i for i, s in enumerate(sentences)}
        for d in datasets:
            u = embeddings[[row[s] for s in d.subset.sentences1]]
            v = embeddings[[row[s] for s in d.subset.sentences2]]
            similarities[d.name] = _cosines(u, v)
    rows: list[dict[str, Any]] = []
    for d in datasets:
        gold = np.asarray(d.subset.scores, dtype=np.float64)
        entry: dict[str, Any] = {
            "dataset": d.name,
            "pairs": len(gold),
            "cont": int(d.cont.sum()),
            "oppn": int((~d.cont).sum()),
            "median_score": d.median_score,
            "median_mer": d.median_mer,
        }
        if d.name in PAPER_TABLE2:
            entry["paper_cont"], entry["paper_oppn"] = PAPER_TABLE2[d.name][:2]
        if d.name in similarities:
            sims = similarities[d.name]
            entry["spearman_cont"] = _spearman(sims[d.cont], gold[d.cont])
            entry["spearman_oppn"] = _spearman(sims[~d.cont], gold[~d.cont])
            entry["spearman_all"] = _spearman(sims, gold)
        rows.append(entry)
    report: dict[str, Any] = {"datasets": rows}
    if encode is not None:
        report["weighted_average"] = {
            "cont": _weighted(rows, "spearman_cont", "cont"),
            "oppn": _weighted(rows, "spearman_oppn", "oppn"),
            "all": _weighted(rows, "spearman_all", "pairs"),
        }
    return report


def format_bias_table(report: dict[str, Any]) -> str:
    """A plain-text table: counts (with the paper's in brackets), medians, Spearman x 100 per split."""

    def pct(value: float | None) -> str:
        return "-" if value is None else f"{100 * value:.2f}"

    head = f"{'dataset':26s} {'Cont.':>11s} {'Oppn.':>11s} {'med.gold':>8s} {'med.MER':>7s} {'Cont.':>7s} {'Oppn.':>7s}"
    groups = f"{'':26s} {'pairs (paper)':>23s} {'medians':>16s} {'Spearman x 100':>15s}"
    lines = [groups, head, "-" * len(head)]
    for row in report["datasets"]:
        cont = f"{row['cont']}" + (f" ({row['paper_cont']})" if "paper_cont" in row else "")
        oppn = f"{row['oppn']}" + (f" ({row['paper_oppn']})" if "paper_oppn" in row else "")
        lines.append(
            f"{row['dataset']:26s} {cont:>11s} {oppn:>11s} {row['median_score']:8.2f} {row['median_mer']:7.3f} "
            f"{pct(row.get('spearman_cont')):>7s} {pct(row.get('spearman_oppn')):>7s}"
        )
    if "weighted_average" in report:
        average = report["weighted_average"]
        total_cont = sum(row["cont"] for row in report["datasets"])
        total_oppn = sum(row["oppn"] for row in report["datasets"])
        lines.append("-" * len(head))
        lines.append(
            f"{'weighted average':26s} {total_cont:>11d} {total_oppn:>11d} {'':8s} {'':7s} "
            f"{pct(average['cont']):>7s} {pct(average['oppn']):>7s}"
        )
    lines.append(BIAS_TABLE_LEGEND)
    return "\n".join(lines)


BIAS_TABLE_LEGEND = (
    "Cont.: pairs whose gold score and surface overlap agree (both above or both below the medians: high score "
    "with low MER, or low score with high MER); Oppn.: the rest. MER: match error rate of the two sentences' "
    "words. A model far better on Cont. than on Oppn. leans on surface overlap (OssCSE)."
)


# --- the transformation probe ----------------------------------------------------------------------


def load_transformation_probe(path: str | Path | None = None) -> list[dict[str, str]]:
    """The probe set shipped with csekit (or a user's own `.jsonl` of the same fields)."""
    fields = dict.fromkeys(("text", *TRANSFORMATIONS), str)
    numbered: Iterable[tuple[int, dict[str, Any]]]
    if path is None:
        shipped = resources.files("csekit").joinpath("data/transformation_probe.jsonl").read_bytes()
        label: str | Path = "csekit/data/transformation_probe.jsonl"
        lines = enumerate(split_lines(shipped.decode("utf-8")), start=1)
        numbered = ((n, parse_json_row(line, at(label, n), fields)) for n, line in lines if line.strip())
    else:
        label = Path(path)
        numbered = json_rows(path, "probe set", fields)
    rows: list[dict[str, str]] = []
    for number, row in numbered:
        empty = [key for key in fields if not row[key]]
        if empty:
            raise CsekitError(f"{at(label, number)}: empty field(s) {', '.join(empty)}")
        rows.append(row)
    if not rows:
        raise CsekitError(f"{label}: the probe set is empty")
    return rows


def transformation_probe(encode: Encoder, rows: Sequence[dict[str, str]]) -> dict[str, Any]:
    """Mean cosine (and mean MER) of each transformation to its original; negation-above-paraphrase rate."""
    sentences = list(dict.fromkeys(s for row in rows for s in (row["text"], *(row[t] for t in TRANSFORMATIONS))))
    embeddings = np.asarray(encode(sentences), dtype=np.float32)
    index = {s: i for i, s in enumerate(sentences)}
    originals = embeddings[[index[row["text"]] for row in rows]]
    sims: dict[str, np.ndarray] = {}
    report: dict[str, Any] = {"sentences": len(rows), "transformations": {}}
    for name in TRANSFORMATIONS:
        sims[name] = _cosines(originals, embeddings[[index[row[name]] for row in rows]])
        report["transformations"][name] = {
            "mean_similarity": float(sims[name].mean()),
            "mean_mer": float(np.mean([mer(row["text"], row[name]) for row in rows])),
        }
    above = sims["negation"] > sims["paraphrase"]
    report["negation_above_paraphrase"] = {"count": int(above.sum()), "rate": float(above.mean())}
    return report


def format_transformation_table(report: dict[str, Any]) -> str:
    lines = [f"{'transformation':14s} {'similarity':>10s} {'MER':>6s}"]
    for name, values in report["transformations"].items():
        lines.append(f"{name:14s} {values['mean_similarity']:10.4f} {values['mean_mer']:6.3f}")
    above = report["negation_above_paraphrase"]
    lines.append(f"negation scored above its paraphrase: {above['count']}/{report['sentences']} ({above['rate']:.0%})")
    return "\n".join(lines)


__all__ = [
    "PAPER_TABLE2",
    "TRANSFORMATIONS",
    "ProbeDataset",
    "bias_probe",
    "format_bias_table",
    "format_transformation_table",
    "load_probe_datasets",
    "load_transformation_probe",
    "mer",
    "select_datasets",
    "split_cont_oppn",
    "transformation_probe",
]

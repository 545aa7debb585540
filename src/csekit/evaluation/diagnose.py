"""`csekit diagnose`: the properties the papers study, measured on the data folder, one model pass each.

Each metric is a small function of embeddings (so it is tested on vectors built by hand); `diagnose`
collects every sentence they need, encodes them once through an `EmbeddingCache`, and reads the
metrics off the cache:

* anisotropy (the SimCSE paper, section 5, after Ethayarajh 2019): mean cosine of random pairs of
  distinct STS sentences;
* alignment and uniformity (Wang and Isola 2020) on STS-B dev (`csekit.evaluation.alignment`);
* frequency bias (SLT-FAI): the paper shows it in plots only, so csekit's proxy is a cross-validated
  linear probe that predicts a sentence's high/low-frequency class from its embedding;
* surface-structure bias (OssCSE): Spearman on the Cont. and Oppn. splits and their gap
  (`csekit.evaluation.probes`);
* false-negative rate (DCLR): the share of in-batch pairs that a complementary model puts at or
  above phi, i.e. the negatives DCLR's weighting would give weight 0.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from torch import Tensor

from csekit.core.bounded_read import read_json_file
from csekit.core.errors import CsekitError
from csekit.core.numbers import is_finite_number
from csekit.evaluation.alignment import align_uniform_from_embeddings
from csekit.evaluation.cache import EmbeddingCache
from csekit.evaluation.probes import ProbeDataset, bias_probe, load_probe_datasets, select_datasets
from csekit.evaluation.sts_data import read_split
from csekit.evaluation.tasks import StsSubset

Encoder = Callable[[list[str]], np.ndarray]
Tokenize = Callable[[list[str]], list[list[int]]]

DCLR_BATCH_SIZE = 64
"""In-batch pairs are counted in batches of this many sentences (DCLR's and SimCSE's batch size)."""
PROBE_FOLDS = 5


def _unit_rows(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.where(norms == 0, 1.0, norms)


# --- the metrics -----------------------------------------------------------------------------------


def random_pairs(count: int, pairs: int, seed: int = 0) -> np.ndarray:
    """`pairs` random index pairs [pairs, 2] of two different rows out of `count` (reproducible by `seed`)."""
    if count < 2:
        raise CsekitError(f"anisotropy needs at least 2 distinct sentences, got {count}")
    rng = np.random.default_rng(seed)
    first = rng.integers(0, count, size=pairs)
    second = (first + rng.integers(1, count, size=pairs)) % count  # any row but `first`, uniformly
    return np.stack([first, second], axis=1)


def anisotropy(embeddings: np.ndarray, pairs: np.ndarray) -> float:
    """Mean cosine of the given pairs of rows: 0 for directions spread evenly, 1 when all rows point one way.

    Rows are distinct sentences, so a high value means the embedding space is a narrow cone (Ethayarajh
    2019; SimCSE, Gao et al. 2021, section 5).
    """
    unit = _unit_rows(embeddings)
    return float(np.mean(np.einsum("ij,ij->i", unit[pairs[:, 0]], unit[pairs[:, 1]])))


def random_batches(count: int, batch_size: int = DCLR_BATCH_SIZE, seed: int = 0) -> list[np.ndarray]:
    """Disjoint random batches of `batch_size` row indices out of `count` (a last, partial batch is dropped)."""
    order = np.random.default_rng(seed).permutation(count)
    return [order[start : start + batch_size] for start in range(0, count - batch_size + 1, batch_size)]


def false_negative_pairs(complementary: np.ndarray, batches: Sequence[np.ndarray], phi: float = 0.9) -> tuple[int, int]:
    """(in-batch pairs i < j whose cosine under the complementary model is >= `phi`, all in-batch pairs).

    Their ratio is the false-negative rate: DCLR (Zhou et al. 2022, section 4.2) gives such negatives
    weight 0 as likely false negatives. `complementary` holds the complementary model's embeddings of
    the rows the batches index; no full batch is one line, not a division by zero.
    """
    unit = _unit_rows(complementary)
    above, total = 0, 0
    for batch in batches:
        sims = unit[batch] @ unit[batch].T
        upper = sims[np.triu_indices(len(batch), k=1)]
        above += int(np.sum(upper >= phi))
        total += len(upper)
    if total == 0:
        raise CsekitError(f"the false-negative rate needs at least one batch of {DCLR_BATCH_SIZE} sentences")
    return above, total


def low_frequency_shares(token_ids: Sequence[Sequence[int]], labels: Tensor | np.ndarray) -> np.ndarray:
    """Per sentence, the share of its tokens that SLT-FAI labels low-frequency (0 for a sentence with none)."""
    table = np.asarray(labels)
    return np.array([float(np.mean(table[list(ids)])) if len(ids) else 0.0 for ids in token_ids])


def frequency_classes(shares: np.ndarray) -> np.ndarray:
    """A sentence's class: 1 when its low-frequency share is above the median share, else 0 (ties at it: 0)."""
    return (shares > np.median(shares)).astype(np.int64)


def frequency_probe_accuracy(embeddings: np.ndarray, classes: np.ndarray, seed: int = 0) -> float:
    """5-fold stratified CV accuracy of a logistic regression predicting `classes` from L2-normalised rows.

    csekit's proxy for SLT-FAI's frequency bias (Wang et al. show it in plots only, with no number):
    how much a linear read-out finds a sentence's share of low-frequency tokens in its embedding. 0.5 on
    balanced classes means the embedding says nothing about frequency; 1 means it encodes it fully.
    """
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_score

    fewest = int(np.bincount(classes, minlength=2).min())
    if fewest < PROBE_FOLDS:
        raise CsekitError(
            f"the frequency probe needs at least {PROBE_FOLDS} sentences in each frequency class, "
            f"got {fewest}; raise --sentences"
        )
    folds = StratifiedKFold(n_splits=PROBE_FOLDS, shuffle=True, random_state=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        scores = cross_val_score(LogisticRegression(max_iter=1000), _unit_rows(embeddings), classes, cv=folds)
    return float(np.mean(scores))


def surface_bias(report: dict[str, Any]) -> dict[str, float | None]:
    """OssCSE's Cont. and Oppn. weighted Spearman (from `bias_probe`) and their gap, Cont. minus Oppn."""
    average = report["weighted_average"]
    cont, oppn = average["cont"], average["oppn"]
    gap = None if cont is None or oppn is None else cont - oppn
    return {"cont": cont, "oppn": oppn, "gap": gap}


# --- the data and the one pass ---------------------------------------------------------------------


@dataclass(frozen=True)
class DiagnoseData:
    """What the metrics read from the data folder: the STS sentences, the probe datasets, STS-B dev."""

    sentences: list[str]
    """Every distinct sentence of STS12-16 and STS-B (train, dev, test), in file order."""
    probe_datasets: list[ProbeDataset]
    """OssCSE's datasets chosen by its rule (median gold score in [2, 3.5])."""
    stsb_dev: StsSubset


def load_diagnose_data(data_dir: str | Path) -> DiagnoseData:
    """Read the STS files once for all metrics."""
    datasets = load_probe_datasets(data_dir)
    sentences = list(dict.fromkeys(s for d in datasets for s in (*d.subset.sentences1, *d.subset.sentences2)))
    return DiagnoseData(sentences, select_datasets(datasets, "rule"), read_split(Path(data_dir), "STSBenchmark", "dev"))


@dataclass(frozen=True)
class DiagnoseSettings:
    """The sample sizes and thresholds, the same for every model so their columns compare."""

    sentences: int = 10_000
    """Random pairs for anisotropy, and sentences sampled for the frequency probe and the in-batch pairs."""
    phi: float = 0.9
    seed: int = 0


def sample_indices(count: int, size: int, seed: int) -> np.ndarray:
    """A reproducible sample of `size` of `count` rows (all of them when there are fewer)."""
    if count <= size:
        return np.arange(count)
    return np.sort(np.random.default_rng(seed).choice(count, size=size, replace=False))


def diagnose(
    encode: Encoder,
    data: DiagnoseData,
    tokenize: Tokenize,
    low_frequency_labels: Tensor | np.ndarray,
    settings: DiagnoseSettings,
    complementary: Encoder | None = None,
) -> dict[str, Any]:
    """Every metric for one model: one `encode` call for all sentences (and one of `complementary`, if given).

    `tokenize` is the model's tokenizer without special tokens, `low_frequency_labels` SLT-FAI's label
    per token id; `complementary` (default: the model itself) decides the false negatives.
    """
    cache = EmbeddingCache(encode)
    cache.prefetch([*data.sentences, *data.stsb_dev.sentences1, *data.stsb_dev.sentences2])
    sentences = data.sentences
    embeddings = cache(sentences)
    sample = [sentences[i] for i in sample_indices(len(sentences), settings.sentences, settings.seed)]

    dev_sentences = list(dict.fromkeys([*data.stsb_dev.sentences1, *data.stsb_dev.sentences2]))
    dev_index = {s: i for i, s in enumerate(dev_sentences)}
    align = align_uniform_from_embeddings(dev_index, cache(dev_sentences), data.stsb_dev)

    shares = low_frequency_shares(tokenize(sample), low_frequency_labels)
    classes = frequency_classes(shares)
    surface = surface_bias(bias_probe(cache, data.probe_datasets))
    judge = cache if complementary is None else complementary
    batches = random_batches(len(sample), DCLR_BATCH_SIZE, settings.seed)
    above, in_batch = false_negative_pairs(judge(sample), batches, settings.phi)
    return {
        "anisotropy": anisotropy(embeddings, random_pairs(len(sentences), settings.sentences, settings.seed)),
        "alignment": align["align"],
        "uniformity": align["uniform"],
        "frequency_probe_accuracy": frequency_probe_accuracy(cache(sample), classes, settings.seed),
        "frequency_probe_baseline": float(max(classes.mean(), 1 - classes.mean())),
        "cont": surface["cont"],
        "oppn": surface["oppn"],
        "cont_oppn_gap": surface["gap"],
        "false_negative_rate": above / in_batch,
        "false_negative_pairs": above,
        "in_batch_pairs": in_batch,
        "encode_calls": cache.calls,
    }


# --- the printed table -----------------------------------------------------------------------------

TABLE_ROWS: tuple[tuple[str, str, float, str], ...] = (
    ("anisotropy", "anisotropy (mean cos)", 1.0, ".4f"),
    ("alignment", "alignment (STS-B dev)", 1.0, ".4f"),
    ("uniformity", "uniformity (STS-B dev)", 1.0, ".4f"),
    ("frequency_probe_accuracy", "frequency probe acc.", 1.0, ".4f"),
    ("frequency_probe_baseline", "  majority-class acc.", 1.0, ".4f"),
    ("cont", "Cont. Spearman x100", 100.0, ".2f"),
    ("oppn", "Oppn. Spearman x100", 100.0, ".2f"),
    ("cont_oppn_gap", "Cont.-Oppn. gap x100", 100.0, ".2f"),
    ("false_negative_rate", "false negatives (%)", 100.0, ".3g"),  # often tiny: significant digits, not places
)


def format_diagnose_table(models: dict[str, dict[str, Any]]) -> str:
    """Metrics as rows, models side by side as columns (each column as wide as its model's name)."""
    widths = {name: max(10, len(name)) for name in models}
    head = f"{'metric':24s}" + "".join(f" {name:>{widths[name]}s}" for name in models)
    lines = [head, "-" * len(head)]
    for key, label, scale, spec in TABLE_ROWS:
        cells = []
        for name, report in models.items():
            value = report.get(key)
            cells.append(f" {'-' if value is None else format(scale * value, spec):>{widths[name]}s}")
        lines.append(f"{label:24s}" + "".join(cells))
    return "\n".join(lines)


# --- a report read back (benchmarks/suite_diagnose.py) ------------------------------------------------------------

REPORT_LIMIT = 2**20
"""The largest diagnose report read back (`csekit diagnose --output` writes a few KiB a model)."""


def read_diagnose_report(path: str | Path) -> dict[str, float | None]:
    """The metrics of the one model a `csekit diagnose --output` report holds (bounded); a metric the report does
    not give, or gives as null (not a number: a Spearman correlation of constant embeddings), is None. Anything
    but such a report is one line naming the file."""
    report = read_json_file(path, "diagnose report", limit=REPORT_LIMIT)
    models = report.get("models") if isinstance(report, dict) else None
    if not isinstance(models, dict) or len(models) != 1:
        raise CsekitError(f'{path}: not a diagnose report of one model (a JSON object whose "models" holds one)')
    ((name, metrics),) = models.items()
    if not isinstance(metrics, dict):
        raise CsekitError(f'{path}: the metrics of model "{name[:80]}" are not a JSON object')
    for key, _, _, _ in TABLE_ROWS:
        value = metrics.get(key)
        if value is not None and not is_finite_number(value):
            raise CsekitError(f"{path}: {key} is {str(value)[:40]!r}, not a number (or null)")
    return {key: None if metrics.get(key) is None else float(metrics[key]) for key, _, _, _ in TABLE_ROWS}

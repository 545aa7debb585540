"""Reading SentEval's STS files exactly as SentEval does (``senteval/sts.py``; STS-B and SICK-R as in
SimCSE's fork). Shared by the STS scores, alignment/uniformity and the bias probes."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from csekit.core.errors import CsekitError, at
from csekit.data.data_dir import STS_SUBSETS, find_task_dir, resolve_data_dir
from csekit.evaluation.files import read_text, universal_lines
from csekit.evaluation.tasks import StsSubset, check_task

_STSB_FILES = {"train": "sts-train.csv", "dev": "sts-dev.csv", "test": "sts-test.csv"}
_SICK_FILES = {"train": "SICK_train.txt", "dev": "SICK_trial.txt", "test": "SICK_test_annotated.txt"}


# --- reading ---------------------------------------------------------------------------------------


def _gold(path: Path, line: int, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise CsekitError(f"{at(path, line)}: gold score {raw.strip()[:40]!r} is not a number") from None
    if not np.isfinite(value):
        raise CsekitError(f"{at(path, line)}: gold score {raw.strip()!r} is not a finite number")
    return value


def _check_scorable(path: Path, scores: Sequence[float]) -> None:
    """Spearman's correlation needs two pairs with different gold scores; otherwise it is NaN, not a score."""
    if len(scores) == 0:
        raise CsekitError(f"{path}: no scored sentence pairs (an empty or truncated file?)")
    if len(set(scores)) < 2:
        raise CsekitError(
            f"{path}: {len(scores)} scored pair(s), all with gold score {scores[0]}; "
            "a correlation needs at least two different gold scores"
        )


def _norm(sentence: str) -> str:
    """SentEval splits on whitespace and the batcher re-joins with single spaces."""
    return " ".join(sentence.split())


def _read_sts_subset(folder: Path, subset: str) -> StsSubset:
    """Read STS.input/STS.gs like SentEval's STSEval.loadFile; pairs with an empty gold line are skipped."""
    input_path = folder / f"STS.input.{subset}.txt"
    gs_path = folder / f"STS.gs.{subset}.txt"
    # str.splitlines, not file iteration: SentEval uses .read().splitlines() for these files.
    inputs = read_text(input_path).splitlines()
    golds = read_text(gs_path).splitlines()
    if len(inputs) != len(golds):
        raise CsekitError(
            f"{at(gs_path, min(len(inputs), len(golds)) + 1)}: {gs_path.name} has {len(golds)} lines "
            f"but {input_path.name} has {len(inputs)}; they must pair up line by line"
        )
    s1: list[str] = []
    s2: list[str] = []
    scores: list[float] = []
    for i, (pair, raw) in enumerate(zip(inputs, golds, strict=True), start=1):
        fields = pair.split("\t")
        if len(fields) != 2:
            raise CsekitError(f"{at(input_path, i)}: expected 2 tab-separated sentences, found {len(fields)} fields")
        if raw == "":
            continue  # unscored pair (STS15, STS16)
        scores.append(_gold(gs_path, i, raw))
        s1.append(_norm(fields[0]))
        s2.append(_norm(fields[1]))
    _check_scorable(gs_path, scores)
    return StsSubset(subset, s1, s2, scores)


def _read_pair_file(path: Path, header: bool, cols: tuple[int, int, int]) -> list[tuple[str, str, float]]:
    """Read STS-B / SICK rows as SimCSE's SentEval does: `line.strip().split('\\t')`, fields by index."""
    out = []
    need = max(cols) + 1
    for i, line in enumerate(universal_lines(read_text(path)), start=1):
        if header and i == 1:
            continue
        fields = line.strip().split("\t")
        if len(fields) < need:
            raise CsekitError(f"{at(path, i)}: expected at least {need} tab-separated fields, found {len(fields)}")
        a, b, y = cols
        out.append((_norm(fields[a]), _norm(fields[b]), _gold(path, i, fields[y])))
    _check_scorable(path, [row[2] for row in out])
    return out


def read_split(data_dir: Path, folder: str, split: str) -> StsSubset:
    task_dir = find_task_dir(data_dir, folder)
    if folder == "STSBenchmark":
        rows = _read_pair_file(task_dir / _STSB_FILES[split], header=False, cols=(5, 6, 4))
    else:
        rows = _read_pair_file(task_dir / _SICK_FILES[split], header=True, cols=(1, 2, 3))
    return StsSubset(split, [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows])


def read_year(data_dir: Path, folder: str) -> list[StsSubset]:
    """The subsets of one STS year (STS12-16), in SentEval's order."""
    task_dir = find_task_dir(data_dir, folder)
    return [_read_sts_subset(task_dir, subset) for subset in STS_SUBSETS[folder]]


def load_sts_task(data_dir: str | Path | None, name: str) -> list[StsSubset]:
    """Load the scored subsets of one STS or dev task: STS12-16 subsets, or the one split STS-B/SICK-R report.

    STSBenchmark and SICKRelatedness give their `test` split, stsb-dev and sick-dev their `dev`
    split (SICK's trial file); a registered task reads its own files. `data_dir=None` falls back to $CSEKIT_DATA.
    """
    task = check_task(name, ("sts", "dev"), "STS task")
    root = resolve_data_dir(data_dir)
    if task.load is not None:
        return task.load(root)
    if task.folder in STS_SUBSETS:
        return read_year(root, task.folder)
    assert task.split is not None
    return [read_split(root, task.folder, task.split)]

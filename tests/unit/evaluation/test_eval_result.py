"""One result shape (issue 50): EvalResult's layout, written alike by `csekit evaluate --output` and bench's
results.json, the old results.json layout still read, and one helper that reads a model for every command."""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import add_sick_trial, make_corpus, make_data_dir

from csekit.core.errors import CsekitError
from csekit.core.json_text import json_text
from csekit.encoding.model_card import render_model_card
from csekit.evaluation.result import EvalResult

SRC = Path(__file__).resolve().parents[3] / "src" / "csekit"
REPO = SRC.parents[1]
RESULT = EvalResult(
    {
        "STS12": {"all": 0.5, "mean": 0.4, "wmean": float("nan")},
        "stsb-dev": 0.7,
        "align": {"align": 0.3, "uniform": -2},
    },
    {"avg": 0.61, "avg_sts": 0.65},
)


def test_a_result_written_and_read_back_is_the_same_result() -> None:
    text = json_text(RESULT.report({"model": "m"}), indent=2)
    report = json.loads(text)
    assert list(report) == ["model", "tasks", "averages"]
    back = EvalResult.from_json(report, "r.json")
    assert back.averages == RESULT.averages and back.tasks["align"] == RESULT.tasks["align"]
    assert back.tasks["STS12"]["wmean"] is None  # a score that was not a number is written, and read, as null
    assert back.score("STS12", "all") == 0.5 and back.score("avg_sts") == 0.65 and back.score("STS13") is None


@pytest.mark.parametrize(
    ("report", "needle"),
    [
        ([1, 2], "not a JSON object"),
        ({"tasks": {"STS12": "high"}}, '"tasks" must map'),
        ({"tasks": {"STS12": {"all": True}}}, '"tasks" must map'),
        ({"tasks": {"align": {"align": 0.2}}}, '"tasks.align" must give'),
        ({"tasks": {}, "averages": {"avg": "0.7"}}, '"averages" must map'),
        ({"tasks": {}, "averages": {"average": 0.7}}, "not 'average'"),
        ({"tasks": {}, "averages": [0.7]}, '"averages" must map'),
    ],
)
def test_a_result_of_another_shape_is_one_line_naming_the_file(report: Any, needle: str) -> None:
    with pytest.raises(CsekitError, match=r"^r\.json: ") as error:
        EvalResult.from_json(report, "r.json")
    assert needle in str(error.value)


def test_dev_scores_become_the_same_layout() -> None:
    """metrics.jsonl's flat dev scores: alignment and uniformity are the align task, avg_sts an average."""
    result = EvalResult.from_dev_scores(
        {"stsb-dev": 0.7, "sick-dev": 0.6, "avg_sts": 0.65, "align": 0.3, "uniform": -2}
    )
    assert result.as_json() == {
        "tasks": {"stsb-dev": 0.7, "sick-dev": 0.6, "align": {"align": 0.3, "uniform": -2}},
        "averages": {"avg_sts": 0.65},
    }


def test_the_model_card_reads_the_layout_and_an_older_flat_one() -> None:
    scores = EvalResult.from_dev_scores({"stsb-dev": 0.7, "avg_sts": 0.65, "align": 0.3, "uniform": -2.0}).as_json()
    for given in (scores, {"stsb-dev": 0.7, "avg_sts": 0.65, "align": 0.3, "uniform": -2.0}):
        facts = {"recipe": {}, "step": 4, "select_metric": "avg_sts", "scores": given}
        card = render_model_card(base_model="m", pooler="cls", csekit_version="0", facts=facts)
        assert "Dev score (selection metric): avg_sts = 65.00 at step 4." in card
        assert "| stsb-dev | 70.00 |" in card and "| align | 0.3000 |" in card and "| uniform | -2.0000 |" in card


# --- evaluate --output and bench's results.json: one layout ------------------------------------------------

EVALUATE_FACTS = {"model", "pooler", "precision", "whiten", "seconds"}
BENCH_FACTS = {"recipe", "seed", "steps", "best_step", "wall_seconds"}
# How the numbers were computed: both write them.
PROTOCOL_FACTS = {"sentence_end", "test_template", "transfer_classifier"}


def _data(tmp_path: Path) -> Path:
    """STS-B dev and test and a SICK trial: the tasks `dev,STSBenchmark,align` give avg_sts and an align task."""
    data = add_sick_trial(make_data_dir(tmp_path / "data"))
    stsb = data / "sts" / "STSBenchmark"
    (stsb / "sts-test.csv").write_text((stsb / "sts-dev.csv").read_text(encoding="utf-8"), encoding="utf-8")
    return data


def test_evaluate_output_and_bench_results_have_one_layout(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same model evaluated by `csekit evaluate --output` and by a bench run: past each writer's own facts,
    the two files hold the same keys and the same numbers (avg_sts was at the top of one, in `tasks` of the
    other)."""
    from typer.testing import CliRunner

    import csekit.training.trainer
    from csekit.bench import run_suite
    from csekit.cli import app

    data, tasks = _data(tmp_path), "dev,STSBenchmark,align"
    args = ["evaluate", str(tiny_model_dir), "--tasks", tasks, "--data-dir", str(data)]
    result = CliRunner().invoke(app, [*args, "--output", str(tmp_path / "r.json")])
    assert result.exit_code == 0, result.output
    evaluated = json.loads((tmp_path / "r.json").read_text(encoding="utf-8"))

    def trained(config: Any, folder: Path, **_: Any) -> Any:  # the model above as the run's best/, no training
        shutil.copytree(tiny_model_dir, folder / "best")
        return SimpleNamespace(steps=0, best_step=0)

    monkeypatch.setattr(csekit.training.trainer, "train", trained)
    suite = tmp_path / "suite.yaml"
    suite.write_text(
        f"seeds: [1]\ntasks: {tasks}\nsample_sentences: 10\n"
        f"recipes: [{{recipe: {REPO / 'benchmarks/suites/smoke-recipe.yaml'}, name: m}}]\n",
        encoding="utf-8",
    )
    overrides = [f"model.backbone={tiny_model_dir}", f"data.corpus={make_corpus(tmp_path / 'corpus.txt', 20)}"]
    run_suite(suite, tmp_path / "out", data_dir=data, overrides=overrides, show_progress=False, log=lambda _: None)
    benched = json.loads((tmp_path / "out" / "m-seed1" / "results.json").read_text(encoding="utf-8"))

    assert set(evaluated) - EVALUATE_FACTS - PROTOCOL_FACTS == set(benched) - BENCH_FACTS - PROTOCOL_FACTS
    assert set(evaluated) - EVALUATE_FACTS - PROTOCOL_FACTS == {"tasks", "averages"}
    assert evaluated["sentence_end"] == benched["sentence_end"] == evaluated["test_template"] == "none"
    one, other = EvalResult.from_json(evaluated, "r.json"), EvalResult.from_json(benched, "results.json")
    assert set(one.averages) == set(other.averages) == {"avg_sts"}
    assert set(one.tasks) == set(other.tasks) == {"stsb-dev", "sick-dev", "STSBenchmark", "align"}
    for path in (("stsb-dev",), ("sick-dev",), ("STSBenchmark", "test"), ("align", "uniform"), ("avg_sts",)):
        assert one.score(*path) == pytest.approx(other.score(*path), abs=1e-6), path


# --- the results.json of an older csekit ------------------------------------------------------------------


def test_bench_reads_the_results_layout_before_averages(tmp_path: Path) -> None:
    """A bench folder of an older csekit (avg and transfer_avg at the top, avg_sts among the tasks) still
    summarises: its averages are read as today's `averages`."""
    from csekit.bench import load_suite, read_results, summarise

    folder = tmp_path / "out" / "m-seed1"
    folder.mkdir(parents=True)
    old = {
        "recipe": "m",
        "seed": 1,
        "steps": 3,
        "best_step": 3,
        "tasks": {"STS12": {"all": 0.5}, "stsb-dev": 0.7, "sick-dev": 0.6, "avg_sts": 0.65},
        "avg": 0.61,
        "transfer_avg": 0.8,
    }
    (folder / "results.json").write_text(json.dumps(old), encoding="utf-8")
    report = read_results(folder / "results.json")
    assert report["averages"] == {"avg": 0.61, "avg_sts": 0.65, "transfer_avg": 0.8}
    assert set(report["tasks"]) == {"STS12", "stsb-dev", "sick-dev"} and report["seed"] == 1
    assert "avg" not in report and "transfer_avg" not in report
    suite = tmp_path / "suite.yaml"
    suite.write_text(f"seeds: [1]\nrecipes: [{{recipe: {REPO / 'recipes/quickstart.yaml'}, name: m}}]\n")
    table = summarise(tmp_path / "out", load_suite(suite))["table"]
    assert "| STS Avg. |" in table.splitlines()[4] and "| 61.00 |" in table and "| 80.00 |" in table

    (folder / "results.json").write_text(json.dumps({**old, "avg": "high"}), encoding="utf-8")
    with pytest.raises(CsekitError, match=r"results\.json: \"averages\" must map .*not what csekit bench wrote"):
        read_results(folder / "results.json")


# --- one way a command reads a model ----------------------------------------------------------------------


def _loads(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    calls = (ast.unparse(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call))
    return [
        f"{path.relative_to(SRC)}: {call}"
        for call in calls
        if call.endswith(("SentenceEncoder.load", "SentenceEncoder"))
    ]


def test_every_command_and_bench_read_a_model_through_command_encoder() -> None:
    """cli, its helpers and bench never load an encoder themselves: evaluation/command_encoder.py warns about the
    pooler and chooses the precision once for all of them (four copies of that sat in cli.py and bench.py)."""
    files = [SRC / "cli.py", *(SRC / "commands").rglob("*.py"), *(SRC / "bench").rglob("*.py")]
    assert [found for path in files for found in _loads(path)] == []
    assert _loads(SRC / "evaluation" / "command_encoder.py") == ["evaluation/command_encoder.py: SentenceEncoder.load"]


def test_command_encoder_warns_about_another_pooler_and_a_slow_precision(tiny_model_dir: Path) -> None:
    """What every command used to do by itself: the pooler warning, and bf16 on a CPU that only emulates it."""
    from csekit.evaluation.command_encoder import command_encoder

    warnings: list[str] = []
    encode = command_encoder(tiny_model_dir, "mean", "bf16", 8, show_progress=False, warn=warnings.append)
    assert len(warnings) == 2
    assert warnings[0].startswith(f"csekit: warning: {tiny_model_dir} was trained with the cls pooler; --pooler mean")
    assert warnings[1].startswith("csekit: warning: --precision bf16 on a CPU without native bf16")
    assert (encode.pooler, encode.precision, encode.label) == ("mean", "bf16", "bf16")
    assert encode(["a man plays", "a dog runs"]).shape == (2, encode.encoder.dim)
    quiet: list[str] = []
    own = command_encoder(tiny_model_dir, None, "auto", 8, warn=quiet.append)
    assert quiet == [] and own.pooler == "cls" and own.label.startswith("fp32 (auto: ")


def test_the_evaluate_printout_reads_the_result(capsys: pytest.CaptureFixture[str]) -> None:
    from csekit.commands.evaluate import print_evaluation
    from csekit.evaluation.suite import parse_tasks

    flat = {"stsb-dev": 0.7, "sick-dev": 0.6, "avg_sts": 0.65, "align": 0.3, "uniform": -2}
    print_evaluation(EvalResult.from_dev_scores(flat), parse_tasks("dev,align"))
    assert capsys.readouterr().out.splitlines() == [
        "stsb-dev: 70.00",
        "sick-dev: 60.00",
        "avg_sts: 65.00 (the mean of stsb-dev and sick-dev)",
        "alignment 0.3000, uniformity -2.0000 (STS-B dev)",
    ]

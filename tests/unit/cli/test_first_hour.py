"""A newcomer's first hour (issue 42): the mistakes and waits that cost time, each answered at once and clearly."""

from __future__ import annotations

import re
import socket
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    TinyTrainer,
    add_sick_trial,
    assert_one_line_error,
    make_corpus,
    make_data_dir,
    run_main,
    tiny_recipe,
)
from transformers import AutoConfig
from typer.testing import CliRunner

from csekit.cli import app
from csekit.core.errors import CsekitError
from csekit.encoding import hub as hub_module
from csekit.encoding.encoder import SentenceEncoder
from csekit.encoding.hub import hub_reachable, looks_like_hub_id
from csekit.parts.hooks import StartsLater
from csekit.parts.objectives.slt_fai import AdversarialTuning, IncompleteSentenceFiltering
from csekit.training.progress_log import _progress_line, never_active_warnings
from csekit.training.trainer import train


@pytest.fixture
def hub_out_of_reach(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The hub cannot be reached; the options every `AutoConfig.from_pretrained` call got, recorded."""
    monkeypatch.setattr(hub_module, "hub_reachable", lambda timeout=0.0: False)
    calls: list[dict[str, Any]] = []
    original = AutoConfig.from_pretrained

    def recording(name: str, *args: Any, **options: Any) -> Any:
        calls.append(options)
        return original(name, *args, **options)

    monkeypatch.setattr(AutoConfig, "from_pretrained", recording)
    return calls


@pytest.mark.parametrize("name", ["minilm-l12", "someone/no-such-model-here"])
def test_a_mistyped_hub_name_fails_from_the_cache_with_suggestions_when_the_hub_is_out_of_reach(
    name: str, hub_out_of_reach: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """No network request and so none of huggingface_hub's retries (about 25 s): the cache only, then one line
    with the local-folder and alias suggestions. `owner/name` is a hub id too, not a missing path."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CsekitError) as error:
        SentenceEncoder.load(name)
    message = str(error.value)
    assert f'"{name}"' in message and "hub cannot be reached" in message
    assert "best/" in message and "minilm-l6" in message
    assert hub_out_of_reach and all(options.get("local_files_only") is True for options in hub_out_of_reach)
    if name == "minilm-l12":
        assert "did you mean the alias minilm-l6?" in message


def test_a_missing_path_is_no_hub_id(hub_out_of_reach: list[dict[str, Any]], tmp_path: Path) -> None:
    for name in [str(tmp_path / "no-model"), "./no-model", "runs/qs/bst", "../x"]:
        with pytest.raises(CsekitError, match="does not exist"):
            SentenceEncoder.load(name)
    assert not hub_out_of_reach
    assert looks_like_hub_id("bert-base-uncased") and looks_like_hub_id("princeton-nlp/unsup-simcse-bert-base-uncased")
    assert not looks_like_hub_id("a/b/c") and not looks_like_hub_id("/abs") and not looks_like_hub_id("..")


def test_offline_mode_answers_without_a_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_connection(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("offline mode must not open a connection")

    monkeypatch.setattr(socket, "create_connection", no_connection)
    for value in ("1", "true", "ON"):
        monkeypatch.setenv("HF_HUB_OFFLINE", value)
        assert hub_reachable() is False
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    assert hub_reachable() is False


def test_the_probe_is_one_short_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in (*hub_module.OFFLINE_VARIABLES, *hub_module.PROXY_VARIABLES):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "https://hub.example:8443")
    attempts: list[tuple[Any, float]] = []

    def refused(address: Any, timeout: float) -> None:
        attempts.append((address, timeout))
        raise OSError("unreachable")

    monkeypatch.setattr(socket, "create_connection", refused)
    assert hub_reachable() is False
    assert attempts == [(("hub.example", 8443), hub_module.HUB_PROBE_SECONDS)]


def test_freq_with_a_mistyped_tokenizer_fails_fast_too(
    hub_out_of_reach: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = run_main(
        monkeypatch, capsys, "freq", "--corpus", "c.txt", "--tokenizer", "bert-base-uncasd", "--output", "f.json"
    )
    assert_one_line_error(code, err, "--tokenizer", "bert-base-uncasd", "hub cannot be reached", "minilm-l6")


def test_evaluating_a_run_folder_names_its_best_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    (run / "best").mkdir(parents=True)
    (run / "checkpoint").mkdir()
    code, err = run_main(monkeypatch, capsys, "evaluate", str(run), "--data-dir", str(tmp_path))
    assert_one_line_error(code, err, f"its best model is {run / 'best'}")


def test_the_main_help_shows_no_type_beside_help() -> None:
    result = CliRunner().invoke(app, ["--help"], terminal_width=160)
    assert result.exit_code == 0 and "--help" in result.output and "<bool>" not in result.output


@pytest.mark.parametrize("command", ["train", "evaluate", "encode", "bench", "freq", "augment"])
def test_help_shows_no_type_beside_a_flag(command: str) -> None:
    result = CliRunner().invoke(app, [command, "--help"], terminal_width=160)
    assert result.exit_code == 0
    assert "<bool>" not in result.output
    assert "<path>" in result.output or "<text>" in result.output  # options that take a value keep their type


# ------------------------------------------------------------------ parts that start later; progress lines


class StartsAtStep:
    """A part of any kind that trains from `first` steps on (`csekit.parts.hooks.StartsLater`)."""

    def __init__(self, first: int) -> None:
        self.first = first

    def first_active_step(self, steps_per_epoch: int) -> int:
        return self.first


def test_a_part_that_starts_after_the_run_gets_a_warning_naming_it() -> None:
    parts: list[tuple[str, object]] = [
        ("negatives[0] (later)", StartsAtStep(10)),
        ("objectives[0] (infonce)", object()),  # no start step: always on
        ("objectives[1] (soon)", StartsAtStep(9)),
    ]
    (warning,) = never_active_warnings(parts, steps_per_epoch=100, total_steps=10)
    assert warning.startswith("csekit: warning: negatives[0] (later) switches on after 10 steps")
    assert "this run has 10" in warning and "train.max_steps above 10" in warning
    assert never_active_warnings(parts, steps_per_epoch=100, total_steps=11) == []


def test_slt_fai_warns_at_the_start_when_its_warm_up_outlasts_the_run(
    tmp_path: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The README's SLT-FAI example trained 20 steps with a 28-step warm-up: plain SimCSE, silently."""
    from test_slt_fai import write_counts
    from transformers import AutoTokenizer

    counts = write_counts(AutoTokenizer.from_pretrained(tiny_model_dir), tmp_path / "counts.json")
    corpus = make_corpus(tmp_path / "corpus.txt", lines=64)  # 4 steps an epoch at batch 16
    recipe = tiny_recipe(tiny_model_dir, corpus, "train.max_steps=3", "model.pooler=mean", "model.head.name=none")
    common = {"counts": str(counts), "low_fraction": 0.2}
    recipe.objectives += [
        {"name": "slt_fai_at", "weight": 1.0, "start_after_epochs": 0.5, **common},  # on after 2 steps
        {"name": "slt_fai_isf", "weight": 1.0, "mask_rate": 0.5, "start_after_epochs": 0.76, **common},  # after 4
    ]
    capsys.readouterr()
    train(recipe, tmp_path / "run", show_progress=False)
    warnings = [line for line in capsys.readouterr().err.splitlines() if "switches on" in line]
    assert warnings == [
        "csekit: warning: objectives[2] (slt_fai_isf) switches on after 4 steps (4 steps an epoch), but this run "
        "has 3: it never trains; give train.max_steps above 4"
    ]
    assert AdversarialTuning.first_active_step is not None and isinstance(
        IncompleteSentenceFiltering.__new__(IncompleteSentenceFiltering), StartsLater
    )


def test_progress_lines_in_a_log_name_the_dev_metric_and_the_time_left(
    tmp_path: Path, tiny_model_dir: Path, corpus: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = add_sick_trial(make_data_dir(tmp_path / "data"))
    recipe = tiny_recipe(
        tiny_model_dir,
        corpus,
        *("train.max_steps=4", "train.log_every=2", "train.eval_every=2"),
        *("train.dev_task=sts", "train.select_metric=avg_sts"),
    )
    capsys.readouterr()
    train(recipe, tmp_path / "run", data_dir=data, show_progress=True)  # stderr captured: not a terminal
    start, *lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("step ")]
    assert re.fullmatch(r"step 0/4 avg_sts -?\d+\.\d\d \(the starting model, before any step\)", start), start
    assert [line.split()[1] for line in lines] == ["2/4", "4/4"]
    assert all(re.search(r" sent/s, \d+:\d\d elapsed, \d+:\d\d left$", line) for line in lines), lines
    # Each line names the step its score was measured at: the log point of step 2 comes before step 2's evaluation.
    assert re.search(r" loss \d[\d.e+-]* avg_sts -?\d+\.\d\d @ step 0 ", lines[0]), lines
    assert re.search(r" loss \d[\d.e+-]* avg_sts -?\d+\.\d\d @ step 2 ", lines[1]), lines
    assert " dev " not in " ".join(lines)
    assert lines[1].endswith(" 0:00 left")


def test_the_time_left_is_the_pace_so_far() -> None:
    record = {"step": 30, "loss": 0.5, "sentences_per_second": 12.0}
    dev = "stsb-dev 81.23 @ step 25"
    line = _progress_line(record, 300, dev, elapsed=65.0, steps_run=10)  # 6.5 s a step since resume
    assert line == "step 30/300 loss 0.5000 stsb-dev 81.23 @ step 25 12.0 sent/s, 1:05 elapsed, 29:15 left"
    assert _progress_line(record, 300, "", 4000.0, 30).endswith("1:06:40 elapsed, 10:00:00 left")


# ------------------------------------------------------------------ an interrupted quickstart


STAND_IN_CSEKIT = """#!{python}
import json, os, sys
from pathlib import Path

args = sys.argv[1:]
with open(os.environ["CALLS"], "a", encoding="utf-8") as calls:
    calls.write(" ".join(args) + "\\n")
output = Path(args[args.index("--output") + 1])
if args[0] == "evaluate":
    output.write_text(json.dumps({{"averages": {{"avg": 0.7 if args[1].endswith("best") else 0.6}}}}), encoding="utf-8")
elif args[0] == "train":
    output.mkdir(parents=True, exist_ok=True)
    (output / "recipe.yaml").write_text("the saved recipe", encoding="utf-8")
    if os.environ.get("INTERRUPT"):
        sys.exit(130)  # Ctrl-C: a checkpoint, no best/ yet
    (output / "best").mkdir(exist_ok=True)
"""


def stand_in_checkout(tmp_path: Path, script: str, program: str, program_text: str) -> tuple[Path, Path]:
    """A checkout holding scripts/`script` and a stand-in .venv/bin/`program` (`program_text`, formatted with
    this Python) that records its calls; returns the checkout and its bin folder."""
    import shutil
    import sys

    checkout = tmp_path / "checkout"
    (checkout / "scripts").mkdir(parents=True)
    shutil.copy(Path(__file__).resolve().parents[3] / "scripts" / script, checkout / "scripts")
    bin_dir = checkout / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / program).write_text(program_text.format(python=sys.executable), encoding="utf-8")
    (bin_dir / program).chmod(0o755)
    return checkout, bin_dir


def test_an_interrupted_quickstart_continues_on_a_second_run(tmp_path: Path) -> None:
    """scripts/quickstart.sh in a checkout whose csekit is a stand-in that records its calls: interrupted in
    training, the second run resumes it (not refusing the folder) and then evaluates the trained model."""
    import subprocess
    import sys

    checkout, bin_dir = stand_in_checkout(tmp_path, "quickstart.sh", "csekit", STAND_IN_CSEKIT)
    (bin_dir / "python").symlink_to(sys.executable)
    calls = tmp_path / "calls.txt"
    env = {"PATH": "/usr/bin:/bin", "CALLS": str(calls), "CSEKIT_DATA": str(tmp_path / "data")}

    def quickstart(**extra: str) -> subprocess.CompletedProcess[str]:
        script = str(checkout / "scripts" / "quickstart.sh")
        return subprocess.run(["bash", script], capture_output=True, text=True, env={**env, **extra}, check=False)

    first = quickstart(INTERRUPT="1")
    assert first.returncode == 130, first.stderr
    second = quickstart()
    assert second.returncode == 0, second.stderr
    assert calls.read_text(encoding="utf-8").splitlines() == [
        "evaluate minilm-l6 --pooler cls --tasks sts --output runs/quickstart/before.json",
        "train recipes/quickstart.yaml --output runs/quickstart/run",
        "train --output runs/quickstart/run --resume",
        "evaluate runs/quickstart/run/best --tasks sts --output runs/quickstart/after.json",
    ]
    assert "STS average (7 tasks, Spearman x 100): 60.00 -> 70.00" in second.stdout


# ------------------------------------------------------------------ torch's CPU wheel


STAND_IN_PYTHON = """#!{python}
import os, sys

args = sys.argv[1:]
with open(os.environ["CALLS"], "a", encoding="utf-8") as calls:
    calls.write(" ".join(args) + "\\n")
sys.exit(1 if args == ["-c", "import torch"] else 0)  # torch missing; everything else there
"""


@pytest.mark.parametrize("index", ["", "https://download.pytorch.org/whl/cpu"])
def test_setup_installs_torch_from_the_index_torch_index_url_names(tmp_path: Path, index: str) -> None:
    """scripts/setup.sh in a checkout whose .venv is a stand-in that records its calls."""
    import subprocess

    checkout, bin_dir = stand_in_checkout(tmp_path, "setup.sh", "python", STAND_IN_PYTHON)
    (bin_dir / "activate").write_text(f'export PATH="{bin_dir}:$PATH"\n', encoding="utf-8")
    tools = tmp_path / "tools"  # apertium "installed": setup.sh must not reach for apt-get here
    tools.mkdir()
    (tools / "apertium").write_text("#!/bin/sh\n", encoding="utf-8")
    (tools / "apertium").chmod(0o755)
    calls = tmp_path / "calls.txt"
    env = {"PATH": f"{tools}:/usr/bin:/bin", "CALLS": str(calls), "TORCH_INDEX_URL": index}
    setup = subprocess.run(
        ["bash", str(checkout / "scripts" / "setup.sh")], capture_output=True, text=True, env=env, check=False
    )
    assert setup.returncode == 0, setup.stderr
    torch_install = [line for line in calls.read_text(encoding="utf-8").splitlines() if line.endswith("torch==2.13.0")]
    expected = f"--index-url {index} torch==2.13.0" if index else "torch==2.13.0"
    assert torch_install == [f"-m pip install --quiet {expected}"]


# ------------------------------------------------------------------ value typos


@pytest.mark.parametrize(
    ("line", "needles"),
    [
        ("model:\n  backbone: x\n  pooler: meen\n", ["recipe.yaml:3: recipe key model.pooler", '"meen"', '"mean"']),
        (
            "objectives:\n  - {name: infonce}\n  - {name: slt_fai_ats}\n",
            ["recipe.yaml:3: recipe key objectives[1].name"],
        ),
        ("data:\n  corpus: c.txt\n  views:\n    name: dropuot\n", ["recipe.yaml:4: recipe key data.views.name"]),
        ("model:\n  head: {name: mpl}\n", ["recipe.yaml:2: recipe key model.head.name", '"mlp"']),
    ],
)
def test_a_mistyped_part_or_pooler_name_gets_the_file_and_line(tmp_path: Path, line: str, needles: list[str]) -> None:
    from csekit.training.recipe import load_recipe

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(line, encoding="utf-8")
    with pytest.raises(CsekitError) as error:
        load_recipe(recipe)
    for needle in needles:
        assert needle in str(error.value), str(error.value)


# ------------------------------------------------------------------ a one-seed bench


def test_a_one_seed_bench_prints_no_spread_and_no_paired_test(tmp_path: Path) -> None:
    from test_bench import _write_results

    from csekit.bench import load_suite, summarise

    (tmp_path / "a.yaml").write_text("name: a\n", encoding="utf-8")
    suite_file = tmp_path / "suite.yaml"
    suite_file.write_text(
        "seeds: [1]\nbaseline: simcse\nrecipes:\n  - {recipe: a.yaml, name: simcse}\n"
        "  - {recipe: a.yaml, name: other, control: simcse}\n",
        encoding="utf-8",
    )
    out = tmp_path / "bench"
    _write_results(out, "simcse", 1, sts12=0.70, average=0.71)
    _write_results(out, "other", 1, sts12=0.72, average=0.73)
    markdown = summarise(out, load_suite(suite_file))["table"]
    assert "±" not in markdown.split("\n\n", 2)[2] and "| simcse | 1 | 70.00 | 71.00 |" in markdown
    assert "paired" not in markdown.lower().replace("no paired comparison", "") and "p = " not in markdown
    assert "One seed: no spread and no paired comparison" in markdown


# ------------------------------------------------------------------ freq's progress in a log


def test_freq_writes_plain_progress_lines_into_a_log(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = make_corpus(tmp_path / "corpus.txt", lines=40)
    output = tmp_path / "counts.json"
    args = ["freq", "--corpus", str(corpus), "--tokenizer", str(tiny_model_dir), "--output", str(output)]
    code, err = run_main(monkeypatch, capsys, *args, "--chunk-lines", "4")  # stderr captured: not a terminal
    assert code == 0 and output.is_file()
    assert "\r" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("counting tokens: ")]
    percents = [int(line.split()[2].rstrip("%")) for line in lines]  # 10 chunks: at most a line a tenth
    assert 5 <= len(lines) <= 10 and percents == sorted(set(percents)) and percents[-1] == 100, err
    assert lines[-1].startswith(f"counting tokens: 100% of {corpus.stat().st_size:,} B ("), err


# ------------------------------------------------------------------ another pooler than the trained one


def test_encode_warns_when_a_trained_model_is_read_with_another_pooler(
    tmp_path: Path,
    tiny_model_dir: Path,
    train_tiny: TinyTrainer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    best = str(train_tiny("model.pooler=cls", steps=1, lines=32).folder / "best")
    sentences = tmp_path / "sentences.txt"
    sentences.write_text("a man plays the guitar .\n", encoding="utf-8")
    capsys.readouterr()
    encode = ["encode", best, "--input", str(sentences), "--output", str(tmp_path / "e.npy")]
    code, err = run_main(monkeypatch, capsys, *encode, "--pooler", "mean")
    assert code == 0
    assert f"csekit: warning: {best} was trained with the cls pooler; --pooler mean reads another" in err
    for same in (["--pooler", "cls"], []):  # its own pooler, asked for or not: nothing to warn about
        code, err = run_main(monkeypatch, capsys, *encode, *same)
        assert code == 0 and "warning" not in err, err
    import shutil

    plain = shutil.copytree(tiny_model_dir, tmp_path / "plain")
    (plain / "csekit.json").unlink()  # a model csekit did not save (here: sentence-transformers') has none
    code, err = run_main(monkeypatch, capsys, *encode[:1], str(plain), *encode[2:], "--pooler", "mean")
    assert code == 0 and "warning" not in err, err


# ------------------------------------------------------------------ docs/recipes.md's recipe table


def expand_braces(name: str) -> list[str]:
    """`a-{x,y}-{1,2}.yaml` as the shell expands it: a-x-1, a-x-2, a-y-1, a-y-2."""
    braces = re.search(r"\{([^}]*)\}", name)
    if braces is None:
        return [name]
    head, tail = name[: braces.start()], name[braces.end() :]
    return [full for option in braces.group(1).split(",") for full in expand_braces(head + option + tail)]


def test_every_shipped_recipe_is_in_the_recipe_table_of_docs_recipes() -> None:
    """A row names recipes as `a.yaml`, `a-{x,y}.yaml` or `*-minilm.yaml`; every file of recipes/ matches one."""
    import fnmatch

    repo = Path(__file__).resolve().parents[3]
    section = (repo / "docs" / "recipes.md").read_text(encoding="utf-8").split("## Recipes", 1)[1].split("\n\n", 2)[1]
    names = [name for row in section.splitlines()[2:] for name in re.findall(r"`([^`]+\.yaml)`", row.split("|")[1])]
    patterns = [pattern for name in names for pattern in expand_braces(name)]
    recipes = sorted(path.name for path in (repo / "recipes").glob("*.yaml"))
    missing = [name for name in recipes if not any(fnmatch.fnmatch(name, pattern) for pattern in patterns)]
    assert len(patterns) > 20 and not missing, missing
    assert expand_braces("a-{x,y}-{1,2}.yaml") == ["a-x-1.yaml", "a-x-2.yaml", "a-y-1.yaml", "a-y-2.yaml"]


# ------------------------------------------------------------------ a recipe's inputs, checked without training


def test_a_recipe_whose_corpus_is_missing_is_named_with_the_command_that_makes_it(tmp_path: Path) -> None:
    """What `csekit bench` checks for every recipe of a suite before its first training."""
    from csekit.training.inputs import check_recipe_inputs
    from csekit.training.recipe import load_recipe

    recipe = load_recipe(None, ["model.backbone=x", "data.corpus=corpus/missing.osscse.jsonl"])
    with pytest.raises(CsekitError, match=r"missing\.osscse\.jsonl.*make it with: csekit augment"):
        check_recipe_inputs(recipe, tmp_path, needs_data_dir=False)
    text = make_corpus(tmp_path / "corpus.txt", lines=4)
    check_recipe_inputs(load_recipe(None, ["model.backbone=x", f"data.corpus={text}"]), None, needs_data_dir=False)

"""The README and the user guide cannot drift: every csekit command their code blocks show parses, and they run.

Each command line of a ```bash block of the README and of the guide's pages (GUIDE) is parsed by the real
command-line parser (a wrong option or a missing argument fails here) and its `--help` works. Every command block
of the README after its install block runs as written, in order, as a new shell after `make quickstart` would, on
a tiny model and tiny data, and so do the Python usage snippet and docs/usage.md's "Using csekit" block.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import typer
from conftest import add_sick_trial, make_corpus, make_data_dir
from typer.core import TyperGroup
from typer.testing import CliRunner

from csekit.cli import app

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
USAGE = REPO / "docs" / "usage.md"
GUIDE = [
    README,
    *(REPO / "docs" / page for page in ("quickstart.md", "usage.md", "evaluation.md", "recipes.md", "papers.md")),
]
"""The pages that show commands to type: the README and the pages its sections moved to."""
README_MAX_LINES = 300


def code_blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.DOTALL)


def readme_commands() -> list[list[str]]:
    """The argument lists of every `csekit ...` (or `-m csekit.cli ...`) line in the guide's bash blocks."""
    commands = []
    for block in (block for page in GUIDE for block in code_blocks(page.read_text(encoding="utf-8"), "bash")):
        for line in block.replace("\\\n", " ").splitlines():
            segment: list[str] = []
            for word in [*shlex.split(line, comments=True), "&&"]:
                if word not in ("&&", "||", ";", "|"):  # one command of a shell list at a time
                    segment.append(word)
                    continue
                for start, name in enumerate(segment):
                    if name in ("csekit", ".venv/bin/csekit") or (name == "csekit.cli" and segment[start - 1] == "-m"):
                        commands.append(segment[start + 1 :])
                        break
                segment = []
    return commands


COMMANDS = readme_commands()
COMMAND_GROUP = typer.main.get_command(app)
assert isinstance(COMMAND_GROUP, TyperGroup)


def test_the_readme_and_the_guide_show_every_command() -> None:
    shown = {command[0] for command in COMMANDS}
    assert shown == set(COMMAND_GROUP.commands)
    assert {"train", "evaluate", "recipes", "download-data"} <= shown


def test_the_readme_is_short() -> None:
    assert len(README.read_text(encoding="utf-8").splitlines()) <= README_MAX_LINES


@pytest.mark.parametrize("args", COMMANDS, ids=[" ".join(c)[:60] for c in COMMANDS])
def test_readme_command_parses_and_has_help(args: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CSEKIT_DATA", "/data")
    args = [os.path.expandvars(arg) for arg in args]
    group = typer.main.get_command(app)
    command = group.get_command(group.make_context("csekit", [args[0], "--help"], resilient_parsing=True), args[0])
    assert command is not None, f"README shows `csekit {args[0]}`, which does not exist"
    command.make_context(args[0], list(args[1:]))  # raises on an unknown option or a missing argument
    result = CliRunner().invoke(app, [args[0], "--help"])
    assert result.exit_code == 0 and "Usage" in result.output


@pytest.fixture
def workspace(tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A folder to run README lines in, and what their names stand for here."""
    data = add_sick_trial(make_data_dir(tmp_path / "data"))
    (data / "corpus").mkdir()
    make_corpus(data / "corpus" / "sts_sick_unlabeled_sentences.txt", lines=64)
    (tmp_path / "sentences.txt").write_text("a man plays the guitar .\na dog runs .\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CSEKIT_DATA", str(data))
    return {"minilm-l6": str(tiny_model_dir), "corpus": str(data / "corpus" / "sts_sick_unlabeled_sentences.txt")}


def _localise(args: list[str], names: dict[str, str]) -> list[str]:
    """README paths relative to the repository made absolute; the offline model replaced by the tiny one."""
    out = []
    for arg in args:
        arg = os.path.expandvars(arg)
        if arg.startswith(("../recipes/", "../benchmarks/", "../examples/")):  # the block's folder is in the checkout
            arg = arg.removeprefix("../")
        if arg.startswith(("recipes/", "benchmarks/", "examples/")):
            arg = str(REPO / arg)
        out.append(names.get(arg, arg))
    return out


def using_csekit_block() -> list[str]:
    """The command lines of docs/usage.md's "Using csekit" block (its first bash block), continuations joined."""
    section = USAGE.read_text(encoding="utf-8").split("## Using csekit", 1)[1]
    return command_lines(code_blocks(section, "bash")[0])


def command_lines(block: str) -> list[str]:
    """A bash block's command lines, continuations joined."""
    return [line for line in block.replace("\\\n", " ").splitlines() if line.strip()]


TINY_TRAINING = ("model.max_length=16", "train.batch_size=8", "train.eval_every=0", "train.dev_task=none")


@pytest.fixture
def after_quickstart(tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A checkout's folder as `make quickstart` leaves it (its trained model in runs/quickstart/run/best), with
    a data folder holding every file the block reads, and the tiny model standing in for minilm-l6."""
    from test_diagnose import make_probe_data_dir, write_counts

    from csekit.cli import DEFAULT_COUNTS
    from csekit.encoding.encoder import SentenceEncoder

    data = add_sick_trial(make_probe_data_dir(tmp_path / "data"))
    trial = data / "sts" / "SICK" / "SICK_trial.txt"
    (data / "sts" / "SICK" / "SICK_test_annotated.txt").write_text(trial.read_text(encoding="utf-8"), "utf-8")
    (data / "corpus").mkdir()
    corpus = make_corpus(data / "corpus" / "sts_sick_unlabeled_sentences.txt", lines=64)
    counts = data / DEFAULT_COUNTS
    counts.parent.mkdir(parents=True)
    write_counts(counts, SentenceEncoder.load(tiny_model_dir).tokenizer.get_vocab())
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    monkeypatch.chdir(checkout)
    monkeypatch.setenv("CSEKIT_DATA", str(data))
    quickstart = ["train", str(REPO / "recipes" / "quickstart.yaml"), "--output", "runs/quickstart/run"]
    overrides = [f"model.backbone={tiny_model_dir}", f"data.corpus={corpus}", "train.max_steps=2", *TINY_TRAINING]
    result = CliRunner().invoke(app, [*quickstart, *(word for o in overrides for word in ("--set", o))])
    assert result.exit_code == 0, result.output
    return {"minilm-l6": str(tiny_model_dir), "data": str(data)}


def _run_shell_line(line: str, names: dict[str, str]) -> None:
    """A line that is not a csekit command: `source` and the data folder's `export` are this test's own
    set-up (checked, not run); `python` is this interpreter, on the checkout's scripts; anything else runs in
    bash with the block's environment."""
    if line.startswith("source .venv/bin/activate"):
        return
    if line.startswith("export CSEKIT_DATA="):
        assert line.split()[1] == "CSEKIT_DATA=$PWD/../shared/data", line
        return
    words = shlex.split(line, comments=True)
    if words[0] == "python":
        line = shlex.join([sys.executable, *_localise(words[1:], names)])
    completed = subprocess.run(["bash", "-c", line], capture_output=True, text=True, check=False)
    assert completed.returncode == 0, (line, completed.stderr)


def test_the_using_csekit_block_runs_as_written_after_the_quickstart(
    after_quickstart: dict[str, str], tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every line of docs/usage.md's block, in order, as a new shell after `make quickstart` runs it: minilm-l6 is
    the tiny model here, and a new training run is kept tiny (short sentences, batches of 8, no dev task).
    Every file it writes lands in the one folder it names."""
    if shutil.which("apertium") is None:
        pytest.skip("csekit augment's default engine needs Debian's apertium-eng-spa (scripts/setup.sh installs it)")
    checkout = Path.cwd()
    before = sorted(checkout.rglob("*"))
    ran, folders = [], []
    for line in using_csekit_block():
        words = shlex.split(line, comments=True)
        if words[:2] == ["mkdir", "-p"] and words[3:5] == ["&&", "cd"] and words[2] == words[5]:
            folders.append(words[2])  # the block's folder: made, and the rest of the block runs in it
            Path(words[2]).mkdir(parents=True, exist_ok=True)
            monkeypatch.chdir(words[2])
            continue
        if words[0] != "csekit":
            _run_shell_line(line, after_quickstart)
            continue
        argv = _localise(words[1:], after_quickstart)
        if argv[0] == "train" and "--resume" not in argv:
            argv += [
                item
                for override in (f"model.backbone={tiny_model_dir}", *TINY_TRAINING)
                for item in ("--set", override)
            ]
        result = CliRunner().invoke(app, argv)
        assert result.exit_code == 0, (line, result.output)
        ran.append(argv[0])
    assert set(ran) == {"evaluate", "encode", "probe", "diagnose", "augment", "freq", "train"}
    assert np.load("embeddings.npy").shape == (64, 32)  # the head of a 64-line corpus
    assert json.loads(Path("results.json").read_text(encoding="utf-8"))["tasks"]
    assert json.loads(Path("runs/qs/metrics.jsonl").read_text(encoding="utf-8").splitlines()[-1])["step"] == 40
    assert len(folders) == 1 and Path.cwd() == checkout / folders[0]
    written = [path for path in sorted(checkout.rglob("*")) if path not in before]
    assert written and all(path.is_relative_to(checkout / folders[0]) for path in written), written


def test_readme_python_usage_snippet_runs(workspace: dict[str, str]) -> None:
    pytest.importorskip("sentence_transformers")
    result = CliRunner().invoke(
        app,
        [
            "train",
            str(REPO / "recipes" / "quickstart.yaml"),
            "--output",
            "runs/quickstart/run",
            *("--set", f"model.backbone={workspace['minilm-l6']}", "--set", f"data.corpus={workspace['corpus']}"),
            *("--set", "train.max_steps=1", "--set", "train.batch_size=8", "--set", "train.dev_task=none"),
        ],
    )
    assert result.exit_code == 0, result.output
    (snippet,) = [
        block for block in code_blocks(README.read_text(encoding="utf-8"), "python") if "SentenceEncoder.load" in block
    ]
    namespace: dict = {}
    exec(compile(snippet, "README.md", "exec"), namespace)  # the README's own example
    assert namespace["vectors"].shape == (2, 32)


def readme_lines() -> list[str]:
    """The command lines of the README's bash blocks after its install block (`make quickstart`, `make test`)."""
    install, *blocks = code_blocks(README.read_text(encoding="utf-8"), "bash")
    assert "make quickstart" in install and "make test" in install
    return [line for block in blocks for line in command_lines(block)]


def test_the_readme_runs_as_written_after_the_quickstart(
    after_quickstart: dict[str, str], tiny_model_dir: Path
) -> None:
    """Every command line of the README after its install block, in order, as a new shell after `make quickstart`
    runs it: minilm-l6 is the tiny model here, a training run is kept tiny (2 steps of short sentences, batches
    of 8, no dev task), and MTEB runs its offline mock task."""
    pytest.importorskip("mteb")
    ran = []
    for line in readme_lines():
        words = shlex.split(line, comments=True)
        if words[0] != "csekit":
            _run_shell_line(line, after_quickstart)
            continue
        argv = _localise(words[1:], after_quickstart)
        if argv[0] == "train":
            tiny = (f"model.backbone={tiny_model_dir}", *TINY_TRAINING, "train.max_steps=2")
            argv += [item for override in tiny for item in ("--set", override)]
        result = CliRunner().invoke(app, argv)
        assert result.exit_code == 0, (line, result.output)
        ran.append(argv[0])
    assert {"recipes", "train", "evaluate"} <= set(ran)
    scores = json.loads(Path("sts.json").read_text(encoding="utf-8"))
    assert "STSBenchmark" in scores["tasks"]

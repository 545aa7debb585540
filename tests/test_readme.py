"""The README cannot drift: every csekit command its code blocks show parses, and the cheap ones run.

Each command line of a ```bash block is parsed by the real command-line parser (a wrong option or a
missing argument fails here), its `--help` works, and the train, evaluate (dev), encode and freq lines
run for real on a tiny model and tiny data, as does the Python usage snippet.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import numpy as np
import pytest
import typer
from conftest import add_sick_trial, make_corpus, make_data_dir
from typer.testing import CliRunner

from csekit.cli import app

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
RUN_FOR_REAL = {"train", "evaluate", "encode", "freq"}


def code_blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.DOTALL)


def readme_commands() -> list[list[str]]:
    """The argument lists of every `csekit ...` (or `-m csekit.cli ...`) line in the README's bash blocks."""
    commands = []
    for block in code_blocks(README.read_text(encoding="utf-8"), "bash"):
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


def test_the_readme_shows_every_command() -> None:
    shown = {command[0] for command in COMMANDS}
    assert shown == {"train", "evaluate", "bench", "encode", "probe", "diagnose", "augment", "freq", "download-data"}


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
        if arg.startswith(("recipes/", "benchmarks/")):
            arg = str(REPO / arg)
        out.append(names.get(arg, arg))
    return out


def test_cheap_readme_commands_run_for_real(workspace: dict[str, str]) -> None:
    runner = CliRunner()
    tiny = [
        f"model.backbone={workspace['minilm-l6']}",
        f"data.corpus={workspace['corpus']}",
        "train.max_steps=2",
        "train.batch_size=8",
        "train.eval_every=0",
    ]
    ran = set()
    for args in COMMANDS:
        if args[0] not in RUN_FOR_REAL or "--resume" in args or Path(args[1]).name == "slt-fai-minilm.yaml":
            continue
        if args[0] == "evaluate" and "dev" not in args:
            continue  # the full suites need the real data folder (tested elsewhere)
        if args[0] == "train" and Path(args[1]).name != "quickstart.yaml":
            continue
        argv = _localise(args, workspace)
        if args[0] == "train":
            argv += [item for override in tiny for item in ("--set", override)]
        result = runner.invoke(app, argv)
        assert result.exit_code == 0, (argv, result.output)
        ran.add(args[0])
    assert ran == RUN_FOR_REAL
    assert np.load("embeddings.npy").shape[0] == 2
    assert Path("freq/sts_sick_minilm-l6.json").exists()


def test_readme_python_usage_snippet_runs(workspace: dict[str, str]) -> None:
    pytest.importorskip("sentence_transformers")
    result = CliRunner().invoke(
        app,
        [
            "train",
            str(REPO / "recipes" / "quickstart.yaml"),
            "--output",
            "runs/qs",
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

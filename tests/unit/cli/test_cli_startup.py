"""Issue 61 item 7: `csekit --help`, `--version` and the mistakes found before a model loads answer without importing
torch, transformers, sentence-transformers, accelerate or scipy (behaviour, checked in a fresh interpreter; the time
they take is benchmarks/cli_startup.py's). And transformers stays as quiet as when main() imported it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from csekit import __version__

HEAVY = ("torch", "transformers", "sentence_transformers", "accelerate", "scipy", "sklearn")
"""Libraries of a second or more to import: none is needed to print help or to refuse a mistaken input."""

PROBE = """
import json, sys
args, heavy_names = json.loads(sys.argv[1]), json.loads(sys.argv[2])
sys.argv = ["csekit", *args]
from csekit.cli import main
try:
    main()
    code = 0
except SystemExit as stop:
    code = stop.code or 0
heavy = sorted(name for name in heavy_names if name in sys.modules)
print("\\n" + json.dumps({"code": code, "heavy": heavy}))
"""


def run_probe(args: list[str], cwd: Path) -> tuple[int, list[str], subprocess.CompletedProcess[str]]:
    """`csekit ARGS` in a fresh interpreter: its exit status, the heavy libraries it imported, and the process."""
    command = [sys.executable, "-c", PROBE, json.dumps(args), json.dumps(HEAVY)]
    done = subprocess.run(command, capture_output=True, text=True, cwd=cwd, check=False)
    report = json.loads(done.stdout.strip().splitlines()[-1])
    return report["code"], report["heavy"], done


@pytest.fixture
def mistakes(tmp_path: Path) -> dict[str, list[str]]:
    typo = tmp_path / "typo.yaml"
    typo.write_text("model:\n  backbone: some-model\ntrian:\n  batch_size: 8\n", encoding="utf-8")
    missing = str(tmp_path / "missing")
    suite = tmp_path / "suite.yaml"
    suite.write_text("seeds: [1, 1]\nrecipes: [a.yaml]\n", encoding="utf-8")
    return {
        "help": ["--help"],
        "version": ["--version"],
        "evaluate-help": ["evaluate", "--help"],
        "recipes": ["recipes"],  # the list of recipes reads YAML only
        "recipe-typo": ["train", str(typo), "--output", str(tmp_path / "run")],
        "missing-recipe": ["train", f"{missing}.yaml", "--output", str(tmp_path / "run")],
        "missing-pairs-file": ["evaluate", "some-model", "--pairs", f"{missing}.tsv"],
        "missing-encode-input": ["encode", "some-model", "-i", f"{missing}.txt", "-o", str(tmp_path / "e.npy")],
        "bench-suite-mistake": ["bench", str(suite), "--output", str(tmp_path / "bench")],  # took 10 s: torch first
    }


EXPECTED = {
    "help": (0, "Usage"),
    "version": (0, f"csekit {__version__}"),
    "evaluate-help": (0, "--mteb"),
    "recipes": (0, "simcse-bert-base"),
    "recipe-typo": (2, 'typo.yaml:3: unknown recipe key "trian" (did you mean "train"?)'),
    "missing-recipe": (2, "missing.yaml does not exist"),
    "missing-pairs-file": (2, "missing.tsv does not exist"),
    "missing-encode-input": (2, "missing.txt does not exist"),
    "bench-suite-mistake": (2, "suite.yaml:1: seed 1 is given twice"),
}


@pytest.mark.parametrize("case", list(EXPECTED))
def test_help_version_and_early_mistakes_import_no_heavy_library(
    case: str, mistakes: dict[str, list[str]], tmp_path: Path
) -> None:
    code, heavy, done = run_probe(mistakes[case], tmp_path)
    expected_code, needle = EXPECTED[case]
    assert code == expected_code, done.stderr
    assert needle in done.stdout + done.stderr
    assert heavy == [], f"csekit {' '.join(mistakes[case])} imported {heavy}"


def test_the_probe_sees_a_heavy_import(tmp_path: Path) -> None:
    """A mistake found only by the parts' checks (an unknown objective) needs the parts, so torch: the probe says so."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("model:\n  backbone: m\nobjectives:\n  - name: infonse\n", encoding="utf-8")
    code, heavy, done = run_probe(["train", str(recipe), "--output", str(tmp_path / "run")], tmp_path)
    assert code == 2 and 'unknown objective "infonse"' in done.stderr and "torch" in heavy


def test_version_is_the_packages_version() -> None:
    pyproject = Path(__file__).resolve().parents[3] / "pyproject.toml"
    assert f'version = "{__version__}"' in pyproject.read_text(encoding="utf-8")
    from typer.testing import CliRunner

    from csekit.cli import app

    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output == f"csekit {__version__}\n"


QUIET_PROBE = """
import sys
sys.argv = ["csekit", "--version"]
from csekit.cli import main
try:
    main()
except SystemExit:
    pass
assert "transformers" not in sys.modules
from transformers.utils import logging
print(logging.get_verbosity() == logging.ERROR, logging.is_progress_bar_enabled())
"""


def test_transformers_imported_after_main_is_as_quiet_as_before(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", QUIET_PROBE], capture_output=True, text=True, cwd=tmp_path)
    assert done.stdout.split()[-2:] == ["True", "False"], done.stderr


def test_transformers_already_imported_is_quieted_directly() -> None:
    from transformers.utils import logging

    from csekit.commands.startup import quiet_transformers

    level, bars = logging.get_verbosity(), logging.is_progress_bar_enabled()
    logging.set_verbosity_info()
    logging.enable_progress_bar()
    try:
        quiet_transformers()
        assert logging.get_verbosity() == logging.ERROR and not logging.is_progress_bar_enabled()
    finally:
        logging.set_verbosity(level)
        (logging.enable_progress_bar if bars else logging.disable_progress_bar)()

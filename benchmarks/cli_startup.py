"""Time what a new user waits for before csekit does anything: `csekit --help`, `csekit --version`, a recipe with a
mistyped key, and an `evaluate --pairs` file that does not exist, each in a fresh interpreter.

    PYTHONPATH=src python benchmarks/cli_startup.py --runs 5

Prints, per command, the wall time of each run's whole process (interpreter start included), its minimum and
median, and whether torch was imported (none of these needs it; tests/unit/cli/test_cli_startup.py checks that without
timing). On a shared machine the times are inflated by the other processes; the load average is printed
beside them, and the bare interpreter's start is timed too, for scale.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROBE = """
import json, sys
args = json.loads(sys.argv[1])
sys.argv = ["csekit", *args]
from csekit.cli import main
try:
    main()
except SystemExit:
    pass
sys.stdout.flush()
sys.__stderr__.write("\\nTORCH_IMPORTED=" + json.dumps("torch" in sys.modules) + "\\n")
"""


def timed_run(args: list[str] | None, cwd: Path) -> tuple[float, bool]:
    """(seconds, whether torch was imported) of one fresh interpreter running `csekit ARGS` (None: `pass`)."""
    command = [sys.executable, "-c", "pass"] if args is None else [sys.executable, "-c", PROBE, json.dumps(args)]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=cwd, check=False)
    seconds = time.perf_counter() - started
    torch = args is not None and "TORCH_IMPORTED=true" in done.stderr
    return seconds, torch


def cases(folder: Path) -> dict[str, list[str] | None]:
    """The commands timed, by label; the recipe and paths they name are made in `folder`."""
    recipe = folder / "typo.yaml"
    recipe.write_text("model:\n  backbone: some-model\ntrian:\n  batch_size: 8\n", encoding="utf-8")
    return {
        "python -c pass (the interpreter alone)": None,
        "csekit --help": ["--help"],
        "csekit --version": ["--version"],
        "csekit train RECIPE (a mistyped key)": ["train", str(recipe), "--output", str(folder / "run")],
        "csekit evaluate M --pairs MISSING": ["evaluate", "some-model", "--pairs", str(folder / "missing.tsv")],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5, help="fresh interpreters per command (default 5)")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        for label, args in cases(folder).items():
            timed_run(args, folder)  # one run first: the files it reads are then in the page cache for all
            runs = [timed_run(args, folder) for _ in range(options.runs)]
            seconds = [run[0] for run in runs]
            torch = "" if args is None else f"; torch imported: {'yes' if any(run[1] for run in runs) else 'no'}"
            print(
                f"{label:44s} min {min(seconds):.2f} s, median {statistics.median(seconds):.2f} s "
                f"({options.runs} runs: {', '.join(f'{s:.2f}' for s in seconds)}){torch}"
            )
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"{os.cpu_count()} CPU cores, load average {load} (times on a shared machine are inflated)")


if __name__ == "__main__":
    main()

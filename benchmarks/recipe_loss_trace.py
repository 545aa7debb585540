"""Fixed-seed loss traces of the shipped recipes on tiny models (the behaviour lock of tests/test_recipe_losses.py).

Trains every `recipes/*.yaml` (or the recipes named) for 20 steps on a tiny random model of its backbone's
family (see tests/recipe_trace.py for the setup and what it overrides), prints each recipe's largest
relative deviation from the recorded trace in tests/data/recipe_losses.json, and with --write records the
new traces there (only the named recipes' entries when some are named; tests/data/recipe_losses.machine
then names this machine for those recipes only). Record again only after a change that is meant to change
training, and say so in the commit.

    PYTHONPATH=src python benchmarks/recipe_loss_trace.py                 # compare with the recording
    PYTHONPATH=src python benchmarks/recipe_loss_trace.py --write         # record every recipe
    PYTHONPATH=src python benchmarks/recipe_loss_trace.py --write recipes/quickstart.yaml
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # recipe_trace and conftest live there

from recipe_trace import (
    RECORDED,
    RECORDED_ON,
    deviation,
    format_machines,
    format_traces,
    machine_signature,
    read_machines,
    read_recorded,
    shipped_recipes,
    trace_recipes,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipes", nargs="*", type=Path, help="recipe files (default: every recipes/*.yaml)")
    parser.add_argument("--write", action="store_true", help=f"record the traces in {RECORDED}")
    parser.add_argument(
        "--work-dir",
        type=Path,
        help="keep the tiny models and runs in this new or empty folder (default: a temporary one)",
    )
    args = parser.parse_args()

    paths = [path.resolve() for path in args.recipes] or shipped_recipes()
    recorded = read_recorded()
    started = time.perf_counter()
    traces = trace_recipes(paths, args.work_dir)
    print(f"{len(traces)} recipes traced in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    for recipe_file, trace in traces.items():
        before = recorded.get(recipe_file)
        if before is None:
            status = "not recorded"
        elif set(before) != set(trace):
            status = f"loss parts differ: recorded {sorted(before)}, now {sorted(trace)}"
        else:
            status = f"max relative deviation {max(deviation(trace[n], before[n]) for n in trace):.3g}"
        print(f"{recipe_file}: {', '.join(trace)}; {status}")
    if args.write:
        RECORDED.parent.mkdir(parents=True, exist_ok=True)
        kept = {**recorded, **traces} if args.recipes else traces  # all recipes: drop removed ones' traces
        RECORDED.write_text(format_traces(kept), encoding="utf-8")
        here = machine_signature()
        if args.recipes:  # the other recipes' traces keep the machine they were recorded on
            default, per_recipe = read_machines()
            machines = format_machines(default, {**per_recipe, **dict.fromkeys(traces, here)})
        else:
            machines = format_machines(here, {})
        RECORDED_ON.write_text(machines, encoding="utf-8")
        print(f"wrote {RECORDED}", file=sys.stderr)


if __name__ == "__main__":
    main()

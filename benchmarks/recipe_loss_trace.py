"""Fixed-seed loss traces of the shipped recipes on tiny models (the behaviour lock of
tests/invariants/test_recipe_losses.py).

Trains every `recipes/*.yaml` (or the recipes named) for 20 steps on a tiny random model of its backbone's
family (see tests/recipe_trace.py for the setup and what it overrides), prints each recipe's largest
relative deviation from the recorded trace in tests/data/recipe_losses.json, and with --write records the
new traces there (only the named recipes' entries when some are named; tests/data/recipe_losses.machine
then names this machine for those recipes only). A recipe of recipe_trace.MACHINE_DEPENDENT is compared
with, and recorded as, this machine's trace in tests/data/recipe_losses.per_machine.json instead; where
its trace changed, the other machines' traces of it are dropped and named (record them there). Record
again only after a change that is meant to change training, and say so in the commit.

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
    MACHINE_DEPENDENT,
    RECORDED,
    RECORDED_ON,
    RECORDED_PER_MACHINE,
    deviation,
    format_machines,
    format_traces,
    format_traces_per_machine,
    machine_signature,
    read_machines,
    read_recorded,
    read_recorded_per_machine,
    record_per_machine,
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
    here = machine_signature()
    per_machine = read_recorded_per_machine()
    recorded = {**read_recorded(), **per_machine.get(here, {})}
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
        dependent = {name: trace for name, trace in traces.items() if name in MACHINE_DEPENDENT}
        common = {name: trace for name, trace in traces.items() if name not in MACHINE_DEPENDENT}
        RECORDED.parent.mkdir(parents=True, exist_ok=True)
        kept = {**read_recorded(), **common} if args.recipes else common  # all recipes: drop removed ones' traces
        kept = {name: trace for name, trace in kept.items() if name not in MACHINE_DEPENDENT}
        RECORDED.write_text(format_traces(kept), encoding="utf-8")
        if args.recipes:  # the other recipes' traces keep the machine they were recorded on
            default, per_recipe = read_machines()
            per_recipe = {name: signature for name, signature in per_recipe.items() if name in kept}
            machines = format_machines(default, {**per_recipe, **dict.fromkeys(common, here)})
        else:
            machines = format_machines(here, {})
        RECORDED_ON.write_text(machines, encoding="utf-8")
        per_machine, notes = record_per_machine(per_machine, here, dependent)
        if not args.recipes:  # all recipes: drop removed ones' traces
            per_machine = {
                signature: {name: trace for name, trace in recipes.items() if name in traces}
                for signature, recipes in per_machine.items()
            }
        RECORDED_PER_MACHINE.write_text(format_traces_per_machine(per_machine), encoding="utf-8")
        for note in notes:
            print(note, file=sys.stderr)
        print(f"wrote {RECORDED} and {RECORDED_PER_MACHINE}", file=sys.stderr)


if __name__ == "__main__":
    main()

"""The second prepared GPU call (issue "On a GPU III", item 5): the controlled suite for one epoch on a lent GPU.

`benchmarks/gpu_suite.sh` runs it on the device after `benchmarks/gpu_check.sh`, from the same carry folder
(`.gpu-carry/`: all-MiniLM-L6-v2 in fp16, the STS/SICK data and the 89,192-sentence corpus, the wheels). This
module writes the suite it trains: `benchmarks/suites/controlled.yaml` with its `set:` lists as they are, only
the configurations that need nothing the carry lacks (`CARRIED`: no `csekit augment` corpus, no BookCorpus
counts), the seeds asked for, each recipe path made absolute so that the file may live anywhere, and every
key naming the model's alias (the backbone, DCLR's complementary model) pointed at the carried model. The
shell script adds one epoch (`train.max_steps=null`, `train.epochs=1`) and bf16.

    python benchmarks/gpu_suite.py subset --out /tmp/suite.yaml --model /tmp/minilm [--keep NAME ...] [--seeds 42 43]
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import yaml

from csekit.bench.suite import load_suite
from csekit.core.atomic import atomic_write_text
from csekit.core.bounded_read import read_yaml_file
from csekit.core.errors import CsekitError, message_line

REPO = Path(__file__).resolve().parents[1]
CONTROLLED = REPO / "benchmarks" / "suites" / "controlled.yaml"
CARRIED = (
    "simcse-minilm",
    "mixcse-minilm",
    "esimcse-minilm",
    "simcse-prompt-minilm",
    "promptbert-minilm",
    "whitenedcse-minilm",
    "dclr-minilm",
)
"""The controlled suite's configurations that train from the carry folder alone, in the suite's order. The
others need `csekit augment`'s corpora (SNCSE, OssCSE, the combined recipe), `csekit freq`'s counts (SLT-FAI)
or a teacher named inside the objectives' list (RankCSE), which a `set:` key cannot reach."""


def alias_keys(tree: Any, alias: str, prefix: str = "") -> list[str]:
    """The dotted keys of `tree`'s mappings whose value is `alias` (lists are not walked)."""
    if not isinstance(tree, dict):
        return []
    found = []
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if value == alias:
            found.append(dotted)
        found += alias_keys(value, alias, f"{dotted}.")
    return found


def subset(suite: Path, keep: list[str], seeds: list[int], alias: str, model: str | None) -> dict[str, Any]:
    """`suite` with only the recipes named in `keep` and their controls (its order kept), `seeds`, absolute
    recipe paths, and, with `model`, every key of a recipe or of its `set:` list that names `alias` pointed at
    that folder instead."""
    checked = load_suite(suite)  # bounded, every value checked, as `csekit bench` reads it
    loaded, _ = read_yaml_file(suite, "suite file")
    # each entry named as bench names it (a name-less one by its recipe file)
    entries = [{"recipe": entry} if isinstance(entry, str) else entry for entry in loaded["recipes"]]
    entries = [{**entry, "name": recipe.name} for entry, recipe in zip(entries, checked.recipes, strict=True)]
    unknown = sorted(set(keep) - {entry["name"] for entry in entries})
    if unknown:
        raise SystemExit(f"{suite}: no recipe named {', '.join(unknown)}")
    controls = {entry["name"]: entry.get("control") for entry in entries}
    wanted = set(keep)
    for name in keep:  # a kept configuration's control comes along: bench refuses a control it cannot find
        while controls.get(name) and controls[name] not in wanted:
            name = controls[name]
            wanted.add(name)
    recipes = []
    for entry in entries:
        if entry["name"] not in wanted:
            continue
        recipe = (suite.parent / entry["recipe"]).resolve()
        overrides = list(entry.get("set", []))
        if model is not None:
            named = alias_keys(read_yaml_file(recipe, "recipe")[0], alias)
            named += [item.split("=", 1)[0] for item in overrides if item.split("=", 1)[-1] == alias]
            overrides += [f"{key}={model}" for key in dict.fromkeys(named)]
        recipes.append({**entry, "recipe": str(recipe), "set": overrides})
    baseline = loaded.get("baseline")
    chosen = {
        **loaded,
        "name": f"{checked.name}-gpu-epoch",
        "seeds": seeds,
        "recipes": recipes,
    }
    if baseline not in {entry["name"] for entry in recipes}:
        chosen.pop("baseline", None)
    return chosen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    making = commands.add_parser("subset", help="write the suite the GPU call trains")
    making.add_argument("--out", type=Path, required=True)
    making.add_argument("--suite", type=Path, default=CONTROLLED)
    making.add_argument("--keep", action="append", default=[], help=f"a configuration (default: {', '.join(CARRIED)})")
    making.add_argument("--seeds", type=int, nargs="+", default=[42])
    making.add_argument("--model", help="a model folder to use wherever a recipe names --alias")
    making.add_argument("--alias", default="minilm-l6")
    args = parser.parse_args()
    try:
        chosen = subset(args.suite, args.keep or list(CARRIED), args.seeds, args.alias, args.model)
        atomic_write_text(args.out, yaml.safe_dump(chosen, sort_keys=False))  # a link at --out is refused
    except CsekitError as error:
        raise SystemExit(f"gpu_suite: {message_line(error)}") from None
    print(f"{args.out}: {len(chosen['recipes'])} configurations x seeds {args.seeds}")


if __name__ == "__main__":
    main()

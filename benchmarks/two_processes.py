"""Every recipe trains as 2 CPU processes (gloo) under `accelerate launch`, offline.

    python benchmarks/two_processes.py                          # every recipe in recipes/, 3 steps each
    python benchmarks/two_processes.py dclr-minilm.yaml osscse-minilm.yaml

Each recipe runs `accelerate launch --config_file configs/accelerate-cpu.yaml --num_processes 2
-m csekit.cli train ...` for 3 steps with a global batch of 16, and must log 2 processes and 3 steps.
What this machine cannot reach is replaced, and each replacement is printed beside the recipe:
hub backbones and complementary models by all-MiniLM-L6-v2 (bert-base-uncased's vocabulary, so the
BookCorpus frequency counts fit it), corpora missing from the data folder by the STS/SICK sentences
(or, for OssCSE's fields, a surrogate augmented corpus of the same lengths), whitening group sizes
that do not divide 384 by 128. Warm-ups are set to 0 so every part runs from the first step.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from train_throughput import corpus_exists, steady_state_objectives, surrogate_augmented_corpus

REPO = Path(__file__).resolve().parents[1]
BACKBONE = "minilm-l6"
PLAIN_CORPUS = "corpus/sts_sick_unlabeled_sentences.txt"
STEPS, BATCH = 3, 16


def offline_recipe(path: Path, folder: Path) -> tuple[str, list[str]]:
    """The recipe as YAML text with this machine's substitutions, and the list of substitutions made."""
    from csekit.training.recipe import load_recipe

    recipe = load_recipe(path)
    changes: list[str] = []
    if recipe.model.backbone != BACKBONE:
        changes.append(f"backbone {recipe.model.backbone} -> {BACKBONE}")
        recipe.model.backbone = BACKBONE
    head = recipe.model.head
    if head.get("group_size") and 384 % int(head["group_size"]):
        changes.append(f"group_size {head['group_size']} -> 128")
        head["group_size"] = 128
    weighting = recipe.weighting
    if weighting and weighting.get("model", "self") not in ("self", BACKBONE):
        changes.append(f"complementary model {weighting['model']} -> {BACKBONE}")
        weighting["model"] = BACKBONE
    changes += steady_state_objectives(recipe.objectives)
    corpus = recipe.data.corpus
    if not corpus_exists(corpus):
        if corpus.endswith(".jsonl"):
            recipe.data.corpus = surrogate_augmented_corpus(folder, BATCH * (STEPS + 1))
            changes.append(f"corpus {corpus} -> surrogate augmented corpus")
        else:
            recipe.data.corpus = PLAIN_CORPUS
            changes.append(f"corpus {corpus} -> {PLAIN_CORPUS}")
    recipe.train.batch_size = BATCH
    recipe.train.max_steps = STEPS
    recipe.train.eval_every = 0
    recipe.train.log_every = 1
    recipe.train.dev_task = "none"
    return recipe.to_yaml(), changes


def run(path: Path) -> tuple[bool, float, str]:
    """Train `path` on 2 processes; (passed, seconds, last logged loss or the error's last line)."""
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        text, changes = offline_recipe(path, folder)
        recipe_file = folder / path.name
        recipe_file.write_text(text, encoding="utf-8")
        command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file"]
        command += [str(REPO / "configs" / "accelerate-cpu.yaml"), "--num_processes", "2"]
        command += ["-m", "csekit.cli", "train", str(recipe_file), "--output", str(folder / "run"), "--no-progress"]
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        seconds = time.perf_counter() - started
        note = "; ".join(changes) or "as written"
        if done.returncode != 0:
            return False, seconds, f"{done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}"
        records = [json.loads(line) for line in (folder / "run" / "metrics.jsonl").read_text().splitlines()]
        steps = [r["step"] for r in records if "loss" in r]
        passed = records[0].get("processes") == 2 and steps == list(range(1, STEPS + 1))
        loss = next(r["loss"] for r in reversed(records) if "loss" in r)
        return passed, seconds, f"loss {loss:.4f} ({note})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recipes", nargs="*", help="recipe file names in recipes/ (default: all)")
    args = parser.parse_args()
    names = args.recipes or sorted(p.name for p in (REPO / "recipes").glob("*.yaml"))
    failures = 0
    for name in names:
        passed, seconds, detail = run(REPO / "recipes" / name)
        failures += not passed
        print(f"{'ok    ' if passed else 'FAILED'} {name:<38} {seconds:5.0f} s  {detail}", flush=True)
    print(f"{len(names) - failures} of {len(names)} recipes trained on 2 processes")
    raise SystemExit(1 if failures else 0)


if __name__ == "__main__":
    main()

"""Every shipped recipe on a GPU: a few steps at `precision: auto` (bf16 on a GPU that has it) on a randomly
initialised backbone of its architecture, then its saved model reloaded by csekit and by sentence-transformers.

    python benchmarks/cuda_recipes.py --assets .gpu/assets --steps 6 [--output results.json] [recipes ...]

No weights are needed: the BERT recipes (bert-base-uncased and all-MiniLM-L6-v2) train a BERT-base-sized model
(transformers' BertConfig defaults) with all-MiniLM-L6-v2's WordPiece tokenizer, the RoBERTa recipes a
RoBERTa-base-sized one with a byte-level BPE tokenizer trained here on the corpus (RoBERTa's special tokens,
8,192 entries). Each recipe keeps its batch size, maximum length, views, head, negatives, weighting and
objectives; only the backbone and the models it names (DCLR's complementary model, RankCSE's teachers: a
second random model of the same architecture), the corpus (`--assets`: the STS/SICK sentences, and for the
recipes that read an augmented corpus a `.jsonl` with text, paraphrase and negation) and SLT-FAI's counts (the
BookCorpus counts of bert-base-uncased) are replaced, and dev evaluation is off. Warm-ups stay as written, so
terms that start after a fraction of an epoch may not run in a few steps: the step test on the CPU covers them.

`--assets` holds `tokenizer-bert/` (a BERT tokenizer folder), `corpus.txt`, `corpus.jsonl` and `counts.json`.
Prints one row a recipe (ok or the error's last line) and, with `--output`, writes every figure as JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

from csekit.encoding.encoder import SentenceEncoder
from csekit.training.recipe import load_recipe
from csekit.training.trainer import train

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # conftest: the tests' RoBERTa-style tokenizer
MODEL_TYPE_OF_BACKBONE = {"bert-base-uncased": "bert", "minilm-l6": "bert", "roberta-base": "roberta"}
PROMPT_POOLERS = {"mask", "mask_denoised"}
"""Poolers that read a prompt template: their saved models load in csekit only (sentence-transformers has no
template step, so csekit's export names a module it refuses, rather than one that silently skips the prompt)."""
CHECK_SENTENCES = ["A man is playing a guitar.", "The dog runs in the park.", "Nobody is playing.", "a"]


def roberta_tokenizer(corpus: Path, folder: Path):  # type: ignore[no-untyped-def]
    """A byte-level BPE tokenizer with RoBERTa's special tokens, 8,192 entries learnt from `corpus` (tokens seen
    at least twice), saved in `folder`: the tests' RoBERTa-style tokenizer at a real vocabulary's size."""
    from conftest import make_byte_level_bpe_tokenizer

    texts = corpus.read_text(encoding="utf-8").splitlines()
    tokenizer = make_byte_level_bpe_tokenizer(texts, vocab_size=8192, min_frequency=2 * 5)
    tokenizer.save_pretrained(folder)
    return tokenizer


def base_models(assets: Path, folder: Path) -> dict[tuple[str, int], Path]:
    """Random base-sized models: (model type, seed) -> saved csekit folder; seed 1 is the second model."""
    from transformers import AutoConfig, AutoTokenizer

    tokenizers = {
        "bert": AutoTokenizer.from_pretrained(assets / "tokenizer-bert"),
        "roberta": roberta_tokenizer(assets / "corpus.txt", folder / "tokenizer-roberta"),
    }
    sizes = {"bert": {}, "roberta": {"max_position_embeddings": 514, "type_vocab_size": 1}}
    models = {}
    for model_type, tokenizer in tokenizers.items():
        for seed in (0, 1):
            torch.manual_seed(seed)
            config = AutoConfig.for_model(
                model_type, vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, **sizes[model_type]
            )
            path = folder / f"{model_type}-base-random-{seed}"
            SentenceEncoder.from_config(config, tokenizer).save(path)
            models[model_type, seed] = path
    return models


def overrides_for(
    recipe_path: Path, models: dict[tuple[str, int], Path], assets: Path, steps: int, batch_size: int | None
) -> list[str]:
    recipe = load_recipe(recipe_path)
    model_type = MODEL_TYPE_OF_BACKBONE[recipe.model.backbone]
    corpus = assets / ("corpus.jsonl" if recipe.data.corpus.endswith(".jsonl") else "corpus.txt")
    overrides = [
        f"model.backbone={models[model_type, 0]}",
        f"data.corpus={corpus}",
        f"train.max_steps={steps}",
        "train.dev_task=none",
        "train.eval_every=0",
        "train.patience=null",
        "train.log_every=1",
        "train.precision=auto",
    ]
    if batch_size:
        overrides.append(f"train.batch_size={batch_size}")
    weighting = recipe.weighting or {}
    if weighting.get("model", "self") != "self":
        overrides.append(f"weighting.model={models[model_type, 1]}")
    for index, objective in enumerate(recipe.objectives):
        if "counts" in objective:
            overrides.append(f"objectives.{index}.counts={assets / 'counts.json'}")
        if "teachers" in objective:
            teachers = ", ".join(str(models[model_type, 1]) for _ in objective["teachers"])
            overrides.append(f"objectives.{index}.teachers=[{teachers}]")
    return overrides


def reload_check(model_dir: Path, device: str) -> dict:
    """Embeddings of the saved model through csekit (fp32) and through sentence-transformers: both finite and equal."""
    from sentence_transformers import SentenceTransformer

    encoder = SentenceEncoder.load(model_dir)
    ours = encoder.encode(CHECK_SENTENCES, batch_size=4, precision="fp32")
    finite = bool(math.isfinite(float(ours.sum())))
    if encoder.pooler.name in PROMPT_POOLERS:  # csekit writes these so that sentence-transformers refuses them
        return {"finite": finite, "csekit_vs_st_max_abs": None}
    theirs = SentenceTransformer(str(model_dir), device=device).encode(CHECK_SENTENCES, convert_to_numpy=True)
    return {"finite": finite, "csekit_vs_st_max_abs": float(abs(ours - theirs).max())}


def run_one(recipe_path: Path, models: dict, args: argparse.Namespace, folder: Path) -> dict:
    recipe = load_recipe(recipe_path, overrides_for(recipe_path, models, args.assets, args.steps, args.batch_size))
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    train(recipe, folder / recipe_path.stem, show_progress=False)
    seconds = time.perf_counter() - started
    records = [json.loads(line) for line in (folder / recipe_path.stem / "metrics.jsonl").read_text().splitlines()]
    losses = [record["loss"] for record in records if "loss" in record]
    precision = next((record["precision"] for record in records if "precision" in record), None)
    saved = next(path for path in (folder / recipe_path.stem / name for name in ("last", "best")) if path.exists())
    checked = reload_check(saved, "cuda" if cuda else "cpu")
    shutil.rmtree(folder / recipe_path.stem)  # a base-sized run's checkpoint, last and best: several GB
    return {
        "batch": recipe.train.batch_size,
        "precision": precision,
        "losses": losses,
        "seconds": seconds,
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0,
        **checked,
    }


def _difference(value: float | None) -> str:
    return "n/a (prompt)" if value is None else f"{value:.1e}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recipes", nargs="*", type=Path, help="recipe files (default: every recipes/*.yaml)")
    parser.add_argument("--assets", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch-size", type=int, help="instead of each recipe's (a dry run on a CPU)")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    recipes = args.recipes or sorted((REPO / "recipes").glob("*.yaml"))
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU: CPU (a dry run of the script)"
    print(f"{device}; torch {torch.__version__}; {len(recipes)} recipes, {args.steps} steps")
    results = {}
    with tempfile.TemporaryDirectory(prefix="cuda-recipes-") as temporary:
        folder = Path(temporary)
        models = base_models(args.assets, folder / "models")
        for path in recipes:
            try:
                results[path.name] = run_one(path, models, args, folder / "runs")
            except Exception as error:
                results[path.name] = {"error": f"{type(error).__name__}: {error}", "trace": traceback.format_exc()}
            row = results[path.name]
            if "error" in row:
                print(f"FAIL {path.name}: {row['error'].splitlines()[0][:300]}", flush=True)
            else:
                finite = all(math.isfinite(x) for x in row["losses"]) and row["finite"]
                print(
                    f"{'ok  ' if finite else 'NaN '} {path.name:<40} batch {row['batch']:>3} {row['precision']} "
                    f"loss {row['losses'][0]:.3f}->{row['losses'][-1]:.3f} {row['seconds']:5.1f} s "
                    f"{row['peak_gib']:5.1f} GiB  vs ST {_difference(row['csekit_vs_st_max_abs'])}",
                    flush=True,
                )
            if args.output:  # after every recipe, so a run stopped at its time limit keeps what it did
                args.output.write_text(json.dumps(results, indent=1), encoding="utf-8")
    failed = [name for name, row in results.items() if "error" in row]
    print(f"{len(results) - len(failed)} of {len(results)} recipes trained and reloaded; failed: {failed or 'none'}")


if __name__ == "__main__":
    main()

"""Compare csekit's STS evaluation with a SentEval-style loop: same numbers, less time.

The baseline re-implements SentEval's protocol independently of csekit's readers: each subset's
pairs are sorted by (length of sentence 1, length of sentence 2, gold score), encoded 64 pairs at a
time (sentences 1 then sentences 2 of each batch), and STS-B/SICK-R encode train, dev and test as
SentEval does before reporting test. csekit encodes each distinct sentence once.

    python benchmarks/senteval_check.py MODEL_DIR --pooler cls --data-dir ../shared/data --threads 2
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from scipy.stats import spearmanr
from transformers import AutoModel, AutoTokenizer

from csekit.data_dir import STS_SUBSETS, find_task_dir, resolve_data_dir
from csekit.evaluation.sts import STS_TASKS, evaluate_sts, format_sts_table

Pair = tuple[list[str], list[str], float]  # tokens of sentence 1, tokens of sentence 2, gold


def make_embedder(model_dir: str, pooler: str) -> Callable[[list[str]], np.ndarray]:
    """One forward pass over a list of sentences: float32, padded, never truncated."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir, dtype=torch.float32).eval()

    def embed(sentences: list[str]) -> np.ndarray:
        batch = tokenizer(sentences, padding=True, return_tensors="pt")
        with torch.inference_mode():
            hidden = model(**batch).last_hidden_state
        if pooler == "cls":
            out = hidden[:, 0]
        else:
            mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            out = (hidden * mask).sum(1) / mask.sum(1)
        return out.float().numpy()

    return embed


def batched_encoder(embed: Callable[[list[str]], np.ndarray], batch_size: int) -> Callable[[list[str]], np.ndarray]:
    """csekit's side: encode a long list in length-sorted batches, rows back in input order."""

    def encode(sentences: list[str]) -> np.ndarray:
        order = sorted(range(len(sentences)), key=lambda i: len(sentences[i].split()))
        parts = [embed([sentences[i] for i in order[k : k + batch_size]]) for k in range(0, len(order), batch_size)]
        out = np.empty((len(sentences), parts[0].shape[1]), dtype=np.float32)
        out[order] = np.concatenate(parts)
        return out

    return encode


# --- SentEval-style baseline --------------------------------------------------------------------------


def read_sts_year(folder: Path, subset: str) -> list[Pair]:
    inputs = (folder / f"STS.input.{subset}.txt").read_text(encoding="utf-8").splitlines()
    golds = (folder / f"STS.gs.{subset}.txt").read_text(encoding="utf-8").splitlines()
    pairs = []
    for line, gold in zip(inputs, golds, strict=True):
        if gold != "":
            a, b = line.split("\t")
            pairs.append((a.split(), b.split(), float(gold)))
    return pairs


def read_columns(path: Path, skip_header: bool, a: int, b: int, y: int) -> list[Pair]:
    with path.open(encoding="utf-8") as f:
        rows = [line.strip().split("\t") for line in f]
    return [(r[a].split(), r[b].split(), float(r[y])) for r in rows[1 if skip_header else 0 :]]


def baseline_scores(embed: Callable[[list[str]], np.ndarray], pairs: list[Pair], batch_size: int) -> np.ndarray:
    """Cosine per pair in SentEval's order and batching; returns a 2 x n array (similarities, golds)."""
    pairs = sorted(pairs, key=lambda p: (len(p[0]), len(p[1]), p[2]))
    sims = []
    for k in range(0, len(pairs), batch_size):
        chunk = pairs[k : k + batch_size]
        u = np.nan_to_num(embed([" ".join(p[0]) for p in chunk]))
        v = np.nan_to_num(embed([" ".join(p[1]) for p in chunk]))
        for x, z in zip(u, v, strict=True):  # one pair at a time, float32, NaN -> 0 as SentEval
            with np.errstate(divide="ignore", invalid="ignore"):
                sims.append(np.nan_to_num(np.dot(x, z) / (np.linalg.norm(x) * np.linalg.norm(z))))
    return np.array([sims, [p[2] for p in pairs]])


def senteval_style(embed: Callable[[list[str]], np.ndarray], data_dir: Path, batch_size: int) -> dict:
    results: dict = {}
    for year, subsets in STS_SUBSETS.items():
        folder = find_task_dir(data_dir, year)
        scored = [baseline_scores(embed, read_sts_year(folder, s), batch_size) for s in subsets]
        per = np.array([spearmanr(s[0], s[1])[0] for s in scored])
        sizes = [s.shape[1] for s in scored]
        joined = np.concatenate(scored, axis=1)
        results[year] = {
            "all": float(spearmanr(joined[0], joined[1])[0]),
            "mean": float(np.average(per)),
            "wmean": float(np.average(per, weights=sizes)),
        }
    stsb, sick = find_task_dir(data_dir, "STSBenchmark"), find_task_dir(data_dir, "SICK")
    for task, files in (
        ("STSBenchmark", [read_columns(stsb / f"sts-{s}.csv", False, 5, 6, 4) for s in ("train", "dev", "test")]),
        (
            "SICKRelatedness",
            [read_columns(sick / f"SICK_{s}.txt", True, 1, 2, 3) for s in ("train", "trial", "test_annotated")],
        ),
    ):
        scored = [baseline_scores(embed, pairs, batch_size) for pairs in files]  # all splits, as SentEval
        results[task] = {"test": float(spearmanr(scored[2][0], scored[2][1])[0])}
    results["avg"] = float(
        np.mean([results[t]["all"] for t in STS_SUBSETS] + [results[t]["test"] for t in STS_TASKS[5:]])
    )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir")
    parser.add_argument("--pooler", choices=("cls", "mean"), default="cls")
    parser.add_argument("--data-dir", default=None, help="SentEval data (default: $CSEKIT_DATA)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    data_dir = resolve_data_dir(args.data_dir)
    embed = make_embedder(args.model_dir, args.pooler)

    start = time.perf_counter()
    ours = evaluate_sts(batched_encoder(embed, args.batch_size), data_dir)
    t_ours = time.perf_counter() - start
    start = time.perf_counter()
    base = senteval_style(embed, data_dir, args.batch_size)
    t_base = time.perf_counter() - start

    print("csekit evaluate_sts\n" + format_sts_table(ours))
    print("\nSentEval-style loop\n" + format_sts_table(base))
    print("\nmax |difference| per task (Spearman, all reported keys)")
    for task in STS_TASKS:
        print(f"  {task:16s} {max(abs(ours[task][k] - base[task][k]) for k in ours[task]):.2e}")
    print(f"\nwall time: csekit {t_ours:.1f} s, SentEval-style {t_base:.1f} s ({t_base / t_ours:.1f}x)")


if __name__ == "__main__":
    main()

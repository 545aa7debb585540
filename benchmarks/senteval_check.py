"""Compare csekit's STS evaluation with a SentEval-style loop, or with real SentEval: same numbers, less time.

The baseline re-implements SentEval's protocol independently of csekit's readers: each subset's
pairs are sorted by (length of sentence 1, length of sentence 2, gold score), encoded 64 pairs at a
time (sentences 1 then sentences 2 of each batch), and STS-B/SICK-R encode train, dev and test as
SentEval does before reporting test. csekit encodes each distinct sentence once.

    python benchmarks/senteval_check.py MODEL_DIR --pooler cls --data-dir ../shared/data --threads 2

For a model csekit trained (any head, any pooler sentence-transformers can run), `--senteval PATH`
runs real SentEval (a checkout of facebookresearch/SentEval or SimCSE's fork, `PATH/senteval/`) with
the exported model, `SentenceTransformer(MODEL_DIR).encode`, as its batcher, and compares it with
what `csekit evaluate MODEL_DIR --tasks sts --precision fp32` computes: one check of the evaluation
against SentEval and of the export against the evaluation.

    python benchmarks/senteval_check.py runs/quickstart/run/best --senteval /path/to/SentEval --threads 2
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

from csekit.data.data_dir import STS_SUBSETS, find_task_dir, resolve_data_dir
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


# --- real SentEval on the exported model ------------------------------------------------------------


def senteval_layout(data_dir: Path, where: Path) -> Path:
    """SentEval's `data/downstream/STS/STS1x-en-test`, `STS/STSBenchmark`, `SICK` layout, as links into data_dir."""
    sts = where / "downstream" / "STS"
    sts.mkdir(parents=True, exist_ok=True)
    for year in STS_SUBSETS:
        (sts / f"{year}-en-test").symlink_to(find_task_dir(data_dir, year).resolve())
    (sts / "STSBenchmark").symlink_to(find_task_dir(data_dir, "STSBenchmark").resolve())
    (where / "downstream" / "SICK").symlink_to(find_task_dir(data_dir, "SICK").resolve())
    return where


def real_senteval(senteval_path: Path, model_dir: str, data_dir: Path, batch_size: int) -> dict:
    """STS12-16, STS-B and SICK-R from SentEval's own engine, the exported model as batcher (as SimCSE's
    evaluation.py: tokens joined with single spaces, fp32, no truncation)."""
    import sys
    import tempfile

    from sentence_transformers import SentenceTransformer

    sys.path.insert(0, str(senteval_path))
    import senteval  # type: ignore[import-not-found]

    model = SentenceTransformer(model_dir, device="cpu")

    def batcher(params: object, batch: list[list[str]]) -> np.ndarray:
        sentences = [" ".join(words) for words in batch]
        return model.encode(sentences, batch_size=len(sentences), convert_to_numpy=True)

    results: dict = {}
    with tempfile.TemporaryDirectory() as folder:
        params = {"task_path": str(senteval_layout(data_dir, Path(folder))), "usepytorch": False, "kfold": 10}
        params["batch_size"] = batch_size
        engine = senteval.engine.SE(params, batcher, lambda params, samples: None)
        for task in STS_TASKS:
            out = engine.eval([task])[task]
            if task in STS_SUBSETS:
                results[task] = dict(out["all"]["spearman"])
            else:
                results[task] = {"test": float(out["test"]["spearman"].correlation)}
    results["avg"] = float(
        np.mean([results[t]["all"] for t in STS_SUBSETS] + [results[t]["test"] for t in STS_TASKS[5:]])
    )
    return results


def compare_with_real_senteval(args: argparse.Namespace, data_dir: Path) -> None:
    from csekit.encoding.encoder import SentenceEncoder

    encoder = SentenceEncoder.load(args.model_dir)
    start = time.perf_counter()
    ours = evaluate_sts(lambda s: encoder.encode(s, precision="fp32"), data_dir)
    t_ours = time.perf_counter() - start
    start = time.perf_counter()
    theirs = real_senteval(Path(args.senteval), args.model_dir, data_dir, args.batch_size)
    t_theirs = time.perf_counter() - start
    print(f"csekit evaluate ({args.model_dir}, pooler {encoder.pooler.name}, fp32)\n" + format_sts_table(ours))
    print("\nreal SentEval, batcher SentenceTransformer(MODEL_DIR).encode\n" + format_sts_table(theirs))
    print("\nmax |difference| per task (Spearman, all reported keys)")
    worst = 0.0
    for task in STS_TASKS:
        gap = max(abs(ours[task][k] - theirs[task][k]) for k in ours[task])
        worst = max(worst, gap)
        print(f"  {task:16s} {gap:.2e}")
    print(f"largest: {worst:.2e} ({'within' if worst <= 5e-4 else 'NOT within'} 5e-4)")
    print(f"\nwall time: csekit {t_ours:.1f} s, real SentEval {t_theirs:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir")
    parser.add_argument("--pooler", choices=("cls", "mean"), default="cls")
    parser.add_argument("--data-dir", default=None, help="SentEval data (default: $CSEKIT_DATA)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--senteval", default=None, help="a SentEval checkout: compare with real SentEval")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    data_dir = resolve_data_dir(args.data_dir)
    if args.senteval:
        compare_with_real_senteval(args, data_dir)
        return
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

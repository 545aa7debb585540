"""STS evaluation speed: csekit in fp32 and bf16 against a SentEval-style loop, in one run.

The baseline (from `senteval_check.py`) follows SentEval: each subset's pairs in SentEval's sorted
order, 64 pairs a batch, sentences 1 then sentences 2, and STS-B/SICK-R train, dev and test encoded
before the test split is reported. csekit encodes each distinct sentence of the reported splits once,
in batches sorted by token count. Differences are per reported number (Spearman).

    python benchmarks/eval_speed.py minilm-l6 --pooler cls
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from senteval_check import make_embedder, senteval_style

from csekit.data.data_dir import resolve_data_dir
from csekit.encoding.encoder import SentenceEncoder, resolve_model_path
from csekit.evaluation.sts import STS_TASKS, evaluate_sts, format_sts_table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default="minilm-l6")
    parser.add_argument("--pooler", choices=("cls", "mean"), default="cls")
    parser.add_argument("--data-dir", default=None, help="SentEval data (default: $CSEKIT_DATA)")
    args = parser.parse_args()
    data_dir = resolve_data_dir(args.data_dir)
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; model {args.model}, {args.pooler}")

    encoder = SentenceEncoder.load(args.model, pooler=args.pooler)
    results, seconds = {}, {}
    for precision in ("fp32", "bf16"):
        start = time.perf_counter()
        results[precision] = evaluate_sts(lambda s, p=precision: encoder.encode(s, precision=p), data_dir)
        seconds[precision] = time.perf_counter() - start
    start = time.perf_counter()
    baseline = senteval_style(make_embedder(resolve_model_path(args.model), args.pooler), data_dir, 64)
    seconds["SentEval-style"] = time.perf_counter() - start

    for name, table in (("csekit fp32", results["fp32"]), ("csekit bf16", results["bf16"])):
        print(f"\n{name}\n{format_sts_table(table)}")
    print(f"\nSentEval-style loop (fp32)\n{format_sts_table(baseline)}")
    print("\nmax |difference| over each task's reported numbers")
    for task in STS_TASKS:
        fp32 = max(abs(results["fp32"][task][k] - baseline[task][k]) for k in baseline[task])
        bf16 = max(abs(results["bf16"][task][k] - results["fp32"][task][k]) for k in baseline[task])
        print(f"  {task:16s} fp32 vs SentEval-style {fp32:.1e}   bf16 vs fp32 {bf16:.1e}")
    base = seconds["SentEval-style"]
    fp32, bf16 = seconds["fp32"], seconds["bf16"]
    print(f"\nwall time: SentEval-style {base:.1f} s; csekit fp32 {fp32:.1f} s ({fp32 / base:.2f} of it), ", end="")
    print(f"bf16 {bf16:.1f} s ({bf16 / base:.2f} of it)")


if __name__ == "__main__":
    main()

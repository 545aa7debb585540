"""STS evaluation speed: csekit in fp32 (and bf16 where native) against a SentEval-style loop, in one run.

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
from train_throughput import cpu_name

from csekit.core.precision import cpu_has_native_bf16
from csekit.data.data_dir import resolve_data_dir
from csekit.encoding.encoder import SentenceEncoder
from csekit.encoding.hub import resolve_model_path
from csekit.evaluation.sts import STS_TASKS, evaluate_sts, format_sts_table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default="minilm-l6")
    parser.add_argument("--pooler", choices=("cls", "mean"), default="cls")
    parser.add_argument("--data-dir", default=None, help="SentEval data (default: $CSEKIT_DATA)")
    args = parser.parse_args()
    data_dir = resolve_data_dir(args.data_dir)
    print(
        f"machine: {cpu_name()}, {os.cpu_count()} cores, native bf16: {cpu_has_native_bf16()}, load average "
        f"{os.getloadavg()[0]:.1f}; model {args.model}, {args.pooler}"
    )

    encoder = SentenceEncoder.load(args.model, pooler=args.pooler)
    results, seconds = {}, {}
    # bf16 only where this CPU runs it natively: emulated, it would take an hour here and say nothing
    precisions = ("fp32", "bf16") if cpu_has_native_bf16() else ("fp32",)
    for precision in precisions:
        start = time.perf_counter()
        results[precision] = evaluate_sts(lambda s, p=precision: encoder.encode(s, precision=p), data_dir)
        seconds[precision] = time.perf_counter() - start
    start = time.perf_counter()
    baseline = senteval_style(make_embedder(resolve_model_path(args.model), args.pooler), data_dir, 64)
    seconds["SentEval-style"] = time.perf_counter() - start

    for precision, table in results.items():
        print(f"\ncsekit {precision}\n{format_sts_table(table)}")
    print(f"\nSentEval-style loop (fp32)\n{format_sts_table(baseline)}")
    print("\nmax |difference| over each task's reported numbers")
    for task in STS_TASKS:
        line = f"  {task:16s} fp32 vs SentEval-style "
        line += f"{max(abs(results['fp32'][task][k] - baseline[task][k]) for k in baseline[task]):.1e}"
        if "bf16" in results:
            bf16 = max(abs(results["bf16"][task][k] - results["fp32"][task][k]) for k in baseline[task])
            line += f"   bf16 vs fp32 {bf16:.1e}"
        print(line)
    base = seconds["SentEval-style"]
    shares = ", ".join(f"csekit {p} {seconds[p]:.1f} s ({seconds[p] / base:.2f} of it)" for p in results)
    print(f"\nwall time: SentEval-style {base:.1f} s; {shares}")


if __name__ == "__main__":
    main()

"""Time the whole transfer suite (MR, CR, SUBJ, MPQA, SST-2, TREC, MRPC) for one model.

    PYTHONPATH=src python benchmarks/transfer_speed.py minilm-l6 --pooler cls --n-jobs -1

Prints the encoding time, the classifier time and the accuracies. On a shared machine the times
are inflated by the other processes; the load average is printed beside them so the numbers can be
labelled honestly.
"""

from __future__ import annotations

import argparse
import os
import time

from csekit.encoding.encoder import SentenceEncoder
from csekit.evaluation.cache import EmbeddingCache
from csekit.evaluation.task_set import TaskSet
from csekit.evaluation.transfer import TRANSFER_TASKS, TransferTask, format_transfer_table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("model", nargs="?", default="minilm-l6")
    parser.add_argument("--pooler", default="cls")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--n-jobs", type=int, default=-1)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--precision", default="fp32")
    args = parser.parse_args()

    encoder = SentenceEncoder.load(args.model, pooler=args.pooler)
    cache = EmbeddingCache(
        lambda s: encoder.encode(s, batch_size=args.batch_size, precision=args.precision, show_progress_bar=True)
    )
    started = time.perf_counter()
    tasks = TaskSet(TransferTask(name, n_jobs=args.n_jobs) for name in TRANSFER_TASKS).read(args.data_dir)
    sentences = tasks.sentences()
    cache.prefetch(sentences)
    encoded = time.perf_counter()
    results = tasks.run(cache).flat()  # every sentence is in the cache: the classifiers' time alone
    done = time.perf_counter()
    print(format_transfer_table(results))
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"{args.model} ({args.pooler}, {args.precision}): {len(set(sentences))} distinct sentences; "
        f"encoding {encoded - started:.0f} s, classifiers {done - encoded:.0f} s, total {done - started:.0f} s "
        f"on {os.cpu_count()} CPU cores (load average {load}; times on a shared machine are inflated)"
    )
    print("acc:", {name: round(100 * results[name]["acc"], 2) for name in TRANSFER_TASKS})
    print("C:", {name: results[name]["C"] for name in TRANSFER_TASKS})


if __name__ == "__main__":
    main()

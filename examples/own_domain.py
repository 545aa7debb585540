"""Build docs/evaluation.md's "Your own domain" files from the data folder: a pairs file and a small retrieval set.

    python examples/own_domain.py OUT       # CSEKIT_DATA (or --data-dir) names the data folder

writes, in the folder OUT (created; files already there are replaced):

* `OUT/stsb-train.tsv`: 1,500 pairs drawn (seed 0) from STS-B's train split (5,749) as a pairs file, header
  `sentence1 sentence2 score`, for `csekit evaluate --pairs` and `train.dev_task: pairs:OUT/stsb-train.tsv`;
* `OUT/sick-related/`: a BEIR-layout retrieval set from 2,000 pairs drawn (seed 0) from SICK's test split (4,927).
  Every distinct sentence of those pairs is a document; each sentence A of a pair scored 4 or more (of 5) is a
  query whose relevant document is its sentence B (relevance 2 from a score of 4.5, else 1). A query's id is its
  own sentence's document id, so the search leaves that document out (BEIR's `ignore_identical_ids`) instead of
  finding the query itself.

`--stsb-pairs` and `--sick-pairs` draw more (or fewer); the samples keep a 2-core CPU's dev evaluations short.
It stands in for a user's own data: any TSV of scored pairs or BEIR folder is read the same way.
"""

from __future__ import annotations

import argparse
import json
import random
from collections import defaultdict
from pathlib import Path

from csekit.data.data_dir import resolve_data_dir

RELATED = 4.0
"""The SICK relatedness (1 to 5) from which sentence B counts as relevant to sentence A."""
VERY_RELATED = 4.5
"""The relatedness from which it is graded 2."""


def sample(lines: list[str], count: int) -> list[str]:
    """`count` of `lines` drawn with seed 0, in their order in the file (all of them when there are fewer)."""
    if count >= len(lines):
        return lines
    return [lines[row] for row in sorted(random.Random(0).sample(range(len(lines)), count))]


def write_pairs(stsb_train: Path, out: Path, count: int) -> int:
    """`count` pairs of STS-B's train split (SentEval's tab-separated layout: genre, file, year, id, score,
    sentence 1, sentence 2, sometimes more fields) as a pairs TSV; the number of pairs."""
    rows = ["sentence1\tsentence2\tscore"]
    lines = [line for line in stsb_train.read_text(encoding="utf-8").splitlines() if len(line.split("\t")) >= 7]
    for line in sample(lines, count):
        fields = line.split("\t")
        rows.append(f"{fields[5]}\t{fields[6]}\t{fields[4]}")
    out.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return len(rows) - 1


def write_retrieval(sick_test: Path, folder: Path, count: int) -> tuple[int, int]:
    """The SICK retrieval set of `count` pairs in BEIR's layout (see the module's docstring); (documents, queries)."""
    lines = [line for line in sick_test.read_text(encoding="utf-8").splitlines()[1:] if line.strip()]
    pairs = [line.split("\t") for line in sample(lines, count)]
    ids: dict[str, str] = {}
    for _, first, second, *_ in pairs:
        for sentence in (first, second):
            ids.setdefault(sentence, f"s{len(ids)}")
    qrels: dict[str, dict[str, int]] = defaultdict(dict)
    for _, first, second, score, *_ in pairs:
        if float(score) >= RELATED and first != second:
            qrels[ids[first]][ids[second]] = 2 if float(score) >= VERY_RELATED else 1
    (folder / "qrels").mkdir(parents=True, exist_ok=True)
    documents = [{"_id": doc_id, "title": "", "text": sentence} for sentence, doc_id in ids.items()]
    text_of = {doc_id: sentence for sentence, doc_id in ids.items()}
    queries = [{"_id": query_id, "text": text_of[query_id]} for query_id in qrels]
    (folder / "corpus.jsonl").write_text("".join(json.dumps(row) + "\n" for row in documents), encoding="utf-8")
    (folder / "queries.jsonl").write_text("".join(json.dumps(row) + "\n" for row in queries), encoding="utf-8")
    judged = [f"{query}\t{doc}\t{rel}" for query, docs in qrels.items() for doc, rel in docs.items()]
    (folder / "qrels" / "test.tsv").write_text("\n".join(["query-id\tcorpus-id\tscore", *judged]) + "\n")
    return len(documents), len(queries)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the folder to write (created)")
    parser.add_argument("--data-dir", help="the data folder (default: CSEKIT_DATA)")
    parser.add_argument("--stsb-pairs", type=int, default=1500, help="STS-B train pairs drawn (default: 1500)")
    parser.add_argument("--sick-pairs", type=int, default=2000, help="SICK test pairs drawn (default: 2000)")
    args = parser.parse_args()
    data = resolve_data_dir(args.data_dir)
    args.out.mkdir(parents=True, exist_ok=True)
    stsb, sick = data / "sts" / "STSBenchmark" / "sts-train.csv", data / "sts" / "SICK" / "SICK_test_annotated.txt"
    pairs = write_pairs(stsb, args.out / "stsb-train.tsv", args.stsb_pairs)
    documents, queries = write_retrieval(sick, args.out / "sick-related", args.sick_pairs)
    print(f"{args.out / 'stsb-train.tsv'}: {pairs:,} pairs")
    print(f"{args.out / 'sick-related'}: {documents:,} documents, {queries:,} queries")


if __name__ == "__main__":
    main()

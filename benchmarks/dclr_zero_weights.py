"""How many in-batch negatives DCLR's complementary model weights out, on the training corpus.

DCLR (Zhou et al., 2022, Eq. 5) gives weight 0 to every in-batch negative whose cosine to the anchor,
under a frozen complementary model, is at least phi. This script draws random batches of the training
corpus (the data folder's corpus/sts_sick_unlabeled_sentences.txt), encodes them with the complementary
model of `recipes/dclr-minilm.yaml` (all-MiniLM-L6-v2 with its own mean pooling, inputs cut at the
recipe's 32 tokens, as `ComplementaryWeighting` does) and counts the in-batch pairs at or above each phi.

    CSEKIT_DATA=../shared/data PYTHONPATH=src python benchmarks/dclr_zero_weights.py --batches 50
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from csekit import SentenceEncoder
from csekit.core.lines import read_lines
from csekit.data.data_dir import resolve_data_dir
from csekit.evaluation.diagnose import false_negative_pairs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=50, help="random batches (default 50)")
    parser.add_argument("--batch-size", type=int, default=64, help="sentences a batch (default 64)")
    parser.add_argument(
        "--phi", type=float, nargs="+", default=[0.9, 0.85, 0.8], help="thresholds (default 0.9 0.85 0.8)"
    )
    parser.add_argument("--max-length", type=int, default=32, help="tokens a sentence (default 32)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    corpus = resolve_data_dir(None) / "corpus" / "sts_sick_unlabeled_sentences.txt"
    lines = [line for line in read_lines(corpus) if line.strip()]
    picked = np.random.default_rng(args.seed).choice(len(lines), args.batches * args.batch_size, replace=False)
    sentences = [lines[i] for i in picked]
    encoder = SentenceEncoder.load("minilm-l6", pooler="mean").eval()
    vectors = []
    with torch.inference_mode():
        for start in range(0, len(sentences), 256):
            inputs = encoder.tokenize(sentences[start : start + 256], max_length=args.max_length)
            vectors.append(encoder(inputs, token_states=False).pooled.float())
    embeddings = torch.cat(vectors).numpy()
    batches = [np.arange(b * args.batch_size, (b + 1) * args.batch_size) for b in range(args.batches)]
    for phi in args.phi:
        hits, pairs = false_negative_pairs(embeddings, batches, phi)
        per_batch = hits / args.batches
        print(f"phi {phi}: {hits} of {pairs} in-batch pairs weighted 0 ({hits / pairs:.2e}; {per_batch:.2f} per batch)")


if __name__ == "__main__":
    main()

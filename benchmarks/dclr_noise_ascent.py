"""How far DCLR's gradient ascent moves the noise negatives, at the paper's settings, on real batches.

DCLR (Zhou et al., 2022, Eq. 1-4) draws k = batch Gaussian vectors (sigma 1) and moves each by t = 4
normalised gradient-ascent steps of beta = 1e-3 on the non-uniformity loss L_U. Each step moves a
vector by exactly beta, so after 4 steps it has moved at most 4e-3, against a norm of about
sigma * sqrt(d). This script measures, with csekit's own `improve_noise` and `non_uniformity_loss`:

* the displacement ||h_4 - h_0|| of each noise vector, absolute and relative to ||h_0||;
* L_U before and after the ascent (absolute and relative change);
* the training loss the model sees (InfoNCE over the in-batch candidates plus the noise, tau 0.05)
  with the drawn noise and with the ascended noise (float64), the largest change of a noise logit,
  and the share of each anchor's softmax that the noise negatives hold at all.

Representations: all-MiniLM-L6-v2 (alias minilm-l6) with the cls pooler, two dropout views of each
sentence (train mode, as a training step), batches of 64 consecutive lines of the data folder's
corpus/sts_sick_unlabeled_sentences.txt; measured in the pooled space and after a freshly initialised
SimCSE head (Linear + tanh: the space DCLR's noise lives in at the start of training).

    CSEKIT_DATA=../shared/data PYTHONPATH=src python benchmarks/dclr_noise_ascent.py --batches 8
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F

from csekit.data.data_dir import resolve_data_dir
from csekit.encoding.encoder import SentenceEncoder
from csekit.parts.heads.mlp import MLPHead
from csekit.parts.negatives.noise import improve_noise, non_uniformity_loss

SIGMA, STEPS, BETA, TAU_U, TAU = 1.0, 4, 1e-3, 0.05, 0.05
"""The paper's settings (section 5.1) and csekit's tau_u default (the paper gives none; the code uses tau)."""


def cosines64(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Cosine matrix in float64: the changes measured here are below float32's resolution of the loss."""
    return F.normalize(a.double(), dim=-1) @ F.normalize(b.double(), dim=-1).T


def training_logits(anchors: torch.Tensor, positives: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """Each anchor against the in-batch positives and the shared noise (paper Eq. 6, all weights 1), float64."""
    return torch.cat([cosines64(anchors, positives), cosines64(anchors, noise)], dim=1) / TAU


def measure(anchors: torch.Tensor, positives: torch.Tensor, generator: torch.Generator) -> dict[str, float]:
    drawn = torch.randn(anchors.shape[0], anchors.shape[1], generator=generator) * SIGMA
    ascended = improve_noise(drawn, anchors, positives, STEPS, BETA, TAU_U)
    moved = (ascended - drawn).norm(dim=1)
    before = float(non_uniformity_loss(anchors, positives, drawn, TAU_U))
    after = float(non_uniformity_loss(anchors, positives, ascended, TAU_U))
    labels = torch.arange(anchors.shape[0])
    logits_drawn = training_logits(anchors, positives, drawn)
    loss_drawn = float(F.cross_entropy(logits_drawn, labels))
    loss_ascended = float(F.cross_entropy(training_logits(anchors, positives, ascended), labels))
    noise_mass = logits_drawn.softmax(dim=1)[:, anchors.shape[0] :].sum(dim=1).mean()
    logit_change = (cosines64(anchors, ascended) - cosines64(anchors, drawn)).abs().max() / TAU
    return {
        "moved_mean": float(moved.mean()),
        "moved_max": float(moved.max()),
        "relative_move": float((moved / drawn.norm(dim=1)).mean()),
        "lu_before": before,
        "lu_change": after - before,
        "lu_relative_change": (after - before) / abs(before),
        "loss_change": loss_ascended - loss_drawn,
        "loss_relative_change": (loss_ascended - loss_drawn) / abs(loss_drawn),
        "max_noise_logit_change": float(logit_change),
        "noise_softmax_mass": float(noise_mass),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    corpus = Path(resolve_data_dir(args.data_dir)) / "corpus" / "sts_sick_unlabeled_sentences.txt"
    lines = [line.strip() for line in corpus.read_text(encoding="utf-8").splitlines() if line.strip()]
    torch.manual_seed(args.seed)
    encoder = SentenceEncoder.load("minilm-l6", pooler="cls").train()  # dropout on: two views
    head = MLPHead(encoder.dim)  # a fresh SimCSE head, as at the first DCLR step
    generator = torch.Generator().manual_seed(args.seed)
    results: dict[str, list[dict[str, float]]] = {"pooled [CLS]": [], "fresh MLP head": []}
    for index in range(args.batches):
        batch = lines[index * args.batch_size : (index + 1) * args.batch_size]
        inputs = encoder.tokenize(batch, max_length=32)  # the recipes' training bound
        with torch.no_grad():
            anchors = encoder(inputs, token_states=False).pooled
            positives = encoder(inputs, token_states=False).pooled
            results["pooled [CLS]"].append(measure(anchors, positives, generator))
            results["fresh MLP head"].append(measure(head(anchors), head(positives), generator))

    print(f"DCLR noise ascent: sigma {SIGMA}, {STEPS} steps of beta {BETA}, tau_u {TAU_U}; minilm-l6 cls, ", end="")
    print(f"{args.batches} batches of {args.batch_size} (d = {encoder.dim}, k = batch)")
    for space, rows in results.items():
        print(f"\n{space}: mean over batches [min, max]")
        for key in rows[0]:
            values = [row[key] for row in rows]
            print(f"  {key:24s} {statistics.mean(values): .3e}  [{min(values): .3e}, {max(values): .3e}]")


if __name__ == "__main__":
    main()

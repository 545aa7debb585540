"""DCLR as the authors' released code computes it, for reproducing their numbers (SPEC §3).

The paper (Eq. 6, csekit's default through `infonce`) removes a false negative from the softmax
denominator (weight 0 -> log-weight -inf). The authors' code instead MULTIPLIES the similarity logits
by the weights, so a false negative stays in the softmax with logit 0, and trains with a binary
cross-entropy over the softmax probabilities (target 1 for the positive, 0 for every other candidate,
averaged over all anchor-candidate entries, as `torch.nn.BCELoss` does) instead of InfoNCE.
`loss: infonce` keeps the code's weighting but uses cross-entropy, to separate the two differences.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from csekit.objectives.infonce import cosine_matrix
from csekit.state import StepState

LOSSES = ("bce", "infonce")


class DclrCodeLoss(nn.Module):
    """Weights multiply the logits (false negatives get logit 0); BCE over softmax probabilities by default."""

    def __init__(self, temperature: float = 0.05, loss: str = "bce", anchor_view: int = 0, positive_view: int = 1):
        super().__init__()
        if temperature <= 0:
            raise ValueError("temperature must be positive")
        if loss not in LOSSES:
            raise ValueError(f'option loss must be one of {", ".join(LOSSES)} (got "{loss}")')
        self.temperature = temperature
        self.loss = loss
        self.anchor_view = anchor_view
        self.positive_view = positive_view

    def logits(self, state: StepState) -> Tensor:
        """Scaled similarities [n, N_global + k]; in-batch logits multiplied by their weights."""
        anchors = state.embeddings[self.anchor_view]
        logits = cosine_matrix(anchors, state.global_view(self.positive_view)) / self.temperature
        if state.negative_weights is not None:
            logits = logits * state.negative_weights.to(logits.dtype)
        extra = [cosine_matrix(anchors, negatives) / self.temperature for negatives in state.extra_negatives]
        return torch.cat([logits, *extra], dim=1) if extra else logits

    def forward(self, state: StepState) -> dict[str, Tensor]:
        logits = self.logits(state)
        labels = state.positive_index()
        if self.loss == "infonce":
            return {"dclr_code": F.cross_entropy(logits, labels)}
        probabilities = logits.softmax(dim=1)
        targets = F.one_hot(labels, num_classes=logits.shape[1]).to(probabilities.dtype)
        return {"dclr_code": F.binary_cross_entropy(probabilities, targets)}

"""DCLR as the authors' released code computes it, for reproducing their numbers (SPEC §3).

The paper (Eq. 6, csekit's default through `infonce`) removes a false negative from the softmax
denominator (weight 0 -> log-weight -inf). The authors' code instead MULTIPLIES the similarity logits
by the weights, so a false negative stays in the softmax with logit 0, and trains with a binary
cross-entropy over the softmax probabilities (target 1 for the positive, 0 for every other candidate,
averaged over all anchor-candidate entries, as `torch.nn.BCELoss` does) instead of InfoNCE.
`loss: infonce` keeps the code's weighting but uses cross-entropy, to separate the two differences.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from csekit.objectives.infonce import InfoNCE
from csekit.state import StepState

LOSSES = ("bce", "infonce")


class DclrCodeLoss(InfoNCE):
    """Weights multiply the logits (false negatives get logit 0); BCE over softmax probabilities by default."""

    def __init__(self, temperature: float = 0.05, loss: str = "bce", anchor_view: int = 0, positive_view: int = 1):
        super().__init__(temperature, anchor_view, positive_view)
        if loss not in LOSSES:
            raise ValueError(f'option loss must be one of {", ".join(LOSSES)} (got "{loss}")')
        self.loss = loss

    def apply_weights(self, logits: Tensor, weights: Tensor) -> Tensor:
        """The authors' code: logits x weight, so a weighted-out negative keeps logit 0 in the softmax."""
        return logits * weights

    def forward(self, state: StepState) -> dict[str, Tensor]:
        logits = self.logits(state)
        labels = state.positive_index()
        if self.loss == "infonce":
            return {"dclr_code": F.cross_entropy(logits, labels)}
        probabilities = logits.softmax(dim=1)
        targets = F.one_hot(labels, num_classes=logits.shape[1]).to(probabilities.dtype)
        return {"dclr_code": F.binary_cross_entropy(probabilities, targets)}

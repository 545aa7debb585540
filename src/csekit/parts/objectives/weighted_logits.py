"""DCLR as the authors' released code computes it, for reproducing their numbers (SPEC §3).

The paper (Eq. 6, csekit's default through `infonce`) removes a false negative from the softmax
denominator (weight 0 -> log-weight -inf). The authors' code instead MULTIPLIES the similarity logits
by the weights, so a false negative stays in the softmax with logit 0, and trains with a binary
cross-entropy over the softmax probabilities (target 1 for the positive, 0 for every other candidate,
averaged over all anchor-candidate entries, as `torch.nn.BCELoss` does) instead of InfoNCE.
`loss: infonce` keeps the code's weighting but uses cross-entropy, to separate the two differences.

The BCE is computed from the logits in float32 with autocast off (`bce_of_softmax`): CUDA autocast
refuses `binary_cross_entropy` on probabilities ("unsafe to autocast"), and bf16 probabilities would
round the loss. The value is `torch.nn.BCELoss`'s, its log terms clamped at -100 like BCELoss's.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from csekit.parts.objectives.infonce import InfoNCE
from csekit.parts.step_state import StepState

LOSSES = ("bce", "infonce")
BCE_LOG_FLOOR = -100.0
"""`torch.nn.BCELoss` clamps its log terms at -100 (so p = 0 or 1 gives a finite loss); kept for equality."""


def log1mexp(x: Tensor) -> Tensor:
    """log(1 - exp(x)) for x <= 0, accurate at both ends (Maechler 2012): expm1 near 0, log1p far below.

    Where 1 - exp(x) is below e^-100 (x > -1e-38: p = 1 to float32 precision) the result is BCELoss's
    floor, -100, with a zero gradient; each branch's input is replaced
    where the other branch is taken, so no inf or NaN enters the gradient.
    """
    at_one = x > -1e-38
    near_zero = x > -math.log(2.0)
    placeholder = torch.full_like(x, -1.0)  # each branch sees only inputs where it is finite
    near = torch.where(near_zero & ~at_one, x, placeholder)
    far = torch.where(near_zero, placeholder, x)
    value = torch.where(near_zero, torch.log(-torch.expm1(near)), torch.log1p(-torch.exp(far)))
    return torch.where(at_one, torch.full_like(x, BCE_LOG_FLOOR), value)


def bce_of_softmax(logits: Tensor, labels: Tensor) -> Tensor:
    """`BCELoss(softmax(logits), one_hot(labels))`, from the logits in float32 with autocast off.

    The mean over all [n, m] entries of -(t log p + (1 - t) log(1 - p)), with log p from log_softmax
    and log(1 - p) from it by `log1mexp`, both floored at -100 as BCELoss floors them. Gradients equal
    BCELoss's away from p(1 - p) < 1e-12, where BCELoss's backward clamps its denominator.
    """
    with torch.autocast(logits.device.type, enabled=False):
        log_p = F.log_softmax(logits.float(), dim=1)
        targets = F.one_hot(labels, num_classes=logits.shape[1]).to(torch.bool)
        terms = torch.where(targets, log_p.clamp_min(BCE_LOG_FLOOR), log1mexp(log_p).clamp_min(BCE_LOG_FLOOR))
        return -terms.mean()


class WeightedLogitsLoss(InfoNCE):
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
        return {"dclr_code": bce_of_softmax(logits, labels)}

"""WhitenedCSE's multi-positive contrastive loss (Zhuo et al., 2023, Eqs. 7 and 8).

Reading of the paper (checked against the authors' code, whose `num_pos = 3` views are z1, z2, z3 and
whose loss is CE(sim(z1, z2)) + CE(sim(z1, z3))): the anchor h_i is view 0 of sentence i; its
positives h_{i,p}^+ are the other views p = 1..V-1 (V = m, the "number of positives" of Table 5, which
counts the anchor: m = 2 is SimCSE's pair). Each positive p has its own denominator over the candidates
of the same view, sum_j e^{s(h_i, h_{j,p}^+)/tau} (all processes' view p, plus any extra negatives and
negative weights other parts put in the StepState), exactly as InfoNCE does for one positive.

* Eq. 7 (default): lambda_m * sum_p -log softmax_p(i); with m = 2 and lambda_m = 1 this is InfoNCE.
* Eq. 8 as printed: -log sum_p lambda_m e^{-s(h_i, h_{i,p}^+)/tau} / sum_j e^{s(h_i, h_{j,p}^+)/tau}.
  Note the printed minus sign makes the minimum *lower* the positives' similarity; it is provided for
  faithfulness, not recommended. `eq8_unsigned` drops that sign (the usual sum-inside-the-log form,
  and what the authors' commented-out code computes); with m = 2 it is InfoNCE shifted by -log lambda_m.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from csekit.parts.objectives.infonce import InfoNCE
from csekit.parts.step_state import StepState

FORMS = ("eq7", "eq8", "eq8_unsigned")


class MultiPositiveInfoNCE(nn.Module):
    """InfoNCE with one anchor view and several positive views (WhitenedCSE, Eq. 7 or 8)."""

    def __init__(
        self,
        temperature: float = 0.05,
        form: str = "eq7",
        lambda_m: float = 1.0,
        anchor_view: int = 0,
        positive_views: list[int] | None = None,
    ) -> None:
        super().__init__()
        if temperature <= 0:
            raise ValueError("temperature must be positive")
        if form not in FORMS:
            raise ValueError(f'form "{form}" is not one of {", ".join(FORMS)}')
        if lambda_m <= 0:
            raise ValueError("lambda_m must be positive")
        if positive_views is not None and (not positive_views or anchor_view in positive_views):
            raise ValueError("positive_views must be a non-empty list of views other than anchor_view")
        self.temperature = temperature
        self.form = form
        self.lambda_m = float(lambda_m)
        self.anchor_view = anchor_view
        self.positive_views = positive_views

    def _views(self, state: StepState) -> list[int]:
        views = self.positive_views or [v for v in range(state.num_views) if v != self.anchor_view]
        if not views or max(views) >= state.num_views or self.anchor_view >= state.num_views:
            raise ValueError(
                f"multi_positive needs views {self.anchor_view} and {views} but the step has {state.num_views}"
            )
        return views

    def forward(self, state: StepState) -> dict[str, Tensor]:
        target = state.positive_index()
        log_probs, similarities = [], []
        for view in self._views(state):
            logits = InfoNCE(self.temperature, self.anchor_view, view).logits(state)
            log_probs.append(-F.cross_entropy(logits, target, reduction="none"))
            similarities.append(logits.gather(1, target[:, None]).squeeze(1))
        log_p = torch.stack(log_probs, dim=1)  # [n, m-1]: log softmax of each positive
        if self.form == "eq7":
            loss = -self.lambda_m * log_p.sum(dim=1)
        elif self.form == "eq8_unsigned":
            loss = -torch.logsumexp(log_p + math.log(self.lambda_m), dim=1)
        else:  # eq8 as printed: numerator e^{-s/tau}, i.e. log term = -s/tau - logsumexp = log_p - 2 s/tau
            scaled = torch.stack(similarities, dim=1)
            loss = -torch.logsumexp(log_p - 2.0 * scaled + math.log(self.lambda_m), dim=1)
        return {"multi_positive": loss.mean()}

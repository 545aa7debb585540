"""MixCSE's mixed hard negatives (Zhang et al., AAAI 2022): `negatives: [{name: mixcse, ...}]`.

Paper section 3 (mixing negatives): h~ = (lambda h_i^+ + (1 - lambda) h_j^-) / ||lambda h_i^+ + (1 - lambda) h_j^-||,
with the gradient stopped, so the mix is a constant negative that stays close to the anchor however
far training has pushed the random in-batch negatives. As in the authors' code (`models_mix.py`):
h_i^+ is the positive view's vector of sentence i, h_j^- that of the next sentence of the (global)
batch, j = i + 1 (cyclic), both before any normalisation; every anchor contrasts all N mixes, except
the one whose larger share (1 - lambda) is its own positive. The authors' code sets that logit to 0
(cosine 0, still in the denominator); here its weight is 0 (left out).

`symmetric: true` adds the code's second block (`models_mix.py` L246-271), which the paper's loss does
not have: z4_i = lambda h_i + (1 - lambda) h_{i+1}, the anchors mixed the same way (detached), scored
against every positive h_j^+ (with gradient) and appended to anchor i's row, except j = i + 1 (the
positive of the anchor that makes up most of z4_i; logit 0 in the code, left out here). The MixCSE
recipes use it: it is half of the code's hard-negative terms.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from csekit.core.distributed import gather_no_grad, world
from csekit.parts.step_state import StepState


def mixed_negatives(positives: Tensor, positive_share: float) -> Tensor:
    """Row j: normalise(share * positives[j] + (1 - share) * positives[j + 1 mod N]), float32, no graph."""
    positives = positives.detach().float()
    mixed = positive_share * positives + (1 - positive_share) * torch.roll(positives, shifts=-1, dims=0)
    return F.normalize(mixed, dim=-1)


def own_positive_weights(local: int, total: int, rank: int, device: torch.device, offset: int = -1) -> Tensor:
    """Weights [local, total]: 0 at column g + offset of global anchor g (the mix mostly of its own positive,
    g - 1; in the symmetric block the positive of anchor g + 1, mostly in its stand-in), else 1."""
    weights = torch.ones(local, total, device=device)
    anchors = torch.arange(local, device=device) + rank * local
    weights[torch.arange(local, device=device), (anchors + offset) % total] = 0.0
    return weights


class MixedNegatives(nn.Module):
    """MixCSE's hard negatives: each positive mixed into the next in-batch positive (a negative for it).

    positive_share (lambda): the positive's share of each mix, 0.2 in the paper (the authors' script
    option `--lambdas`); positive_view: the view whose vectors are mixed (the objective's positives);
    symmetric: also the code's second block, anchors (view `anchor_view`) mixed and scored against the
    positives (see the module's docstring).
    """

    def __init__(
        self, positive_share: float = 0.2, positive_view: int = 1, symmetric: bool = False, anchor_view: int = 0
    ) -> None:
        super().__init__()
        if not 0.0 <= positive_share < 1.0:
            raise ValueError(f"option positive_share must be in [0, 1) (got {positive_share})")
        if symmetric and anchor_view == positive_view:
            raise ValueError(f"options anchor_view and positive_view must differ (both {anchor_view})")
        self.positive_share = float(positive_share)
        self.positive_view = positive_view
        self.symmetric = bool(symmetric)
        self.anchor_view = anchor_view

    def forward(self, state: StepState) -> None:
        positives = gather_no_grad(state.embeddings[self.positive_view].detach())
        rank, _ = world()
        weights = own_positive_weights(state.batch_size, positives.shape[0], rank, positives.device)
        state.extra_negative_weights[len(state.extra_negatives)] = weights
        state.extra_negatives.append(mixed_negatives(positives, self.positive_share))
        if self.symmetric:
            n = state.batch_size
            anchors = gather_no_grad(state.embeddings[self.anchor_view].detach())
            stand_ins = mixed_negatives(anchors, self.positive_share)[rank * n : (rank + 1) * n]
            weights = own_positive_weights(n, positives.shape[0], rank, positives.device, offset=1)
            state.extra_row_contrasts.append((stand_ins, state.global_view(self.positive_view), weights))

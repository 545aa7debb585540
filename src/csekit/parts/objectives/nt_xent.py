"""ConSERT's contrastive loss: NT-Xent (SimCLR's normalized temperature-scaled cross entropy).

ConSERT (Yan et al., 2021; `_contrastive_loss_forward` in its `sentence_transformers/losses/AdvCLSoftmaxLoss.py`)
and SLT-FAI's code (the same file, ConSERT's loss) contrast both views as anchors. Each sentence's view a is scored
against every sentence's view b (its own is the positive) and every *other* sentence's view a: 2N-1
candidates, itself excluded (the code subtracts 1e9 from its own logit; here it is -inf, the same softmax).
The loss is the mean over anchors of each direction, the two directions summed:

    L = CE([S_ab, S_aa - inf*I] / tau) + CE([S_ba, S_bb - inf*I] / tau)

SimCSE's InfoNCE is one direction with the other view's N candidates only. Across processes the
candidates are every process's views (as ConSERT's TPU code gathers them). DCLR-style weights and extra
negatives, when a recipe adds them, act on the cross-view candidates as in InfoNCE.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from csekit.parts.objectives.infonce import InfoNCE, cosine_matrix
from csekit.parts.step_state import StepState


class NTXent(nn.Module):
    """ConSERT's NT-Xent over views `views` (two of them): both directions summed."""

    def __init__(self, temperature: float = 0.1, views: tuple[int, int] | list[int] = (0, 1)) -> None:
        super().__init__()
        if temperature <= 0:
            raise ValueError("temperature must be positive")
        if len(views) != 2 or views[0] == views[1]:
            raise ValueError(f"views must name two different views, got {list(views)}")
        self.temperature = temperature
        self.views = (int(views[0]), int(views[1]))

    def direction(self, state: StepState, anchor_view: int, other_view: int) -> Tensor:
        """Mean -log softmax of each anchor's positive among the other view's and its own view's sentences."""
        cross = InfoNCE(self.temperature, anchor_view, other_view).logits(state)
        same = cosine_matrix(state.embeddings[anchor_view], state.global_view(anchor_view)) / self.temperature
        target = state.positive_index()
        itself = F.one_hot(target, same.shape[1]).bool()
        same = same.masked_fill(itself, float("-inf"))
        return F.cross_entropy(torch.cat([cross, same], dim=1), target)

    def forward(self, state: StepState) -> dict[str, Tensor]:
        a, b = self.views
        if max(a, b) >= state.num_views:
            raise ValueError(f"nt_xent needs views {a} and {b} but the step has {state.num_views}")
        return {"nt_xent": self.direction(state, a, b) + self.direction(state, b, a)}

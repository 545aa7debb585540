"""InfoNCE with in-batch negatives: SimCSE's loss."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from csekit.parts.step_state import StepState


def cosine_matrix(a: Tensor, b: Tensor) -> Tensor:
    """Cosine similarity of every row of `a` with every row of `b`, in float32."""
    return F.normalize(a.float(), dim=-1) @ F.normalize(b.float(), dim=-1).T


SIMILARITIES = ("cosine", "dot")
"""An objective's `similarity` option: sentence-transformers' `cos_sim` or `dot_score`."""


def similarity_matrix(a: Tensor, b: Tensor, similarity: str = "cosine") -> Tensor:
    """`similarity` (cosine or dot) of every row of `a` with every row of `b`, in float32."""
    if similarity == "cosine":
        return cosine_matrix(a, b)
    return a.float() @ b.float().T


def check_similarity(similarity: str) -> str:
    """`similarity` if it is one of SIMILARITIES, else a ValueError naming the option."""
    if similarity not in SIMILARITIES:
        raise ValueError(f"option similarity must be one of {', '.join(SIMILARITIES)} (got {similarity!r})")
    return similarity


class InfoNCE(nn.Module):
    """-log softmax of each anchor's positive among all candidates, similarities scaled by 1/tau.

    Anchors are view `anchor_view` of the local batch; candidates are view `positive_view` of the
    global batch (all processes), then any extra negatives in the state, then any extra row contrasts
    (`StepState.extra_row_contrasts`: candidates scored from a stand-in for each anchor). A weighting part (or a
    negative source, for its own negatives) may give each candidate a weight alpha: the candidate's
    term in the denominator becomes alpha * exp(s / tau), i.e. log(alpha) is added to its logit
    (weight 0 removes it).

    `positive_in_denominator` (default true) is SimCSE's cross-entropy, which DCLR's code keeps: the
    positive is one of the candidates of the softmax. False is DCLR's Eq. 6 as printed, whose
    denominator holds only the negatives (noise and in-batch): -s+/tau + log sum_neg alpha e^{s/tau}.
    An anchor left with no negative at all (every one weighted out, no noise) then adds 0 to the mean.

    `similarity` (default cosine, SimCSE's) or dot: the plain dot product, as sentence-transformers'
    `MultipleNegativesRankingLoss(similarity_fct=dot_score)` scores (its `scale` is 1 / temperature).
    """

    def __init__(
        self,
        temperature: float = 0.05,
        anchor_view: int = 0,
        positive_view: int = 1,
        positive_in_denominator: bool = True,
        similarity: str = "cosine",
    ) -> None:
        super().__init__()
        if temperature <= 0:
            raise ValueError("temperature must be positive")
        self.temperature = temperature
        self.anchor_view = anchor_view
        self.positive_view = positive_view
        self.positive_in_denominator = bool(positive_in_denominator)
        self.similarity = check_similarity(similarity)

    def scores(self, a: Tensor, b: Tensor) -> Tensor:
        """The similarities of `a`'s rows to `b`'s, scaled by 1/tau."""
        return similarity_matrix(a, b, self.similarity) / self.temperature

    def logits(self, state: StepState) -> Tensor:
        """Scaled similarities [n, N_global + k] of anchors to candidates, weights applied."""
        anchors = state.embeddings[self.anchor_view]
        logits = self.scores(anchors, state.global_view(self.positive_view))
        if state.negative_weights is not None:
            logits = self.apply_weights(logits, state.negative_weights.to(logits.dtype))
        extra = [self.scores(anchors, negatives) for negatives in state.extra_negatives]
        for index, weights in state.extra_negative_weights.items():
            extra[index] = self.apply_weights(extra[index], weights.to(extra[index].dtype))
        for queries, candidates, weights in state.extra_row_contrasts:
            block = self.scores(queries, candidates)
            extra.append(block if weights is None else self.apply_weights(block, weights.to(block.dtype)))
        return torch.cat([logits, *extra], dim=1) if extra else logits

    def apply_weights(self, logits: Tensor, weights: Tensor) -> Tensor:
        """Paper Eq. 6: weight alpha scales a candidate's exp term, i.e. adds log(alpha) to its logit."""
        return logits + torch.log(weights)

    def forward(self, state: StepState) -> dict[str, Tensor]:
        logits, labels = self.logits(state), state.positive_index()
        if self.positive_in_denominator:
            return {"infonce": F.cross_entropy(logits, labels)}
        return {"infonce": negatives_only_nce(logits, labels)}


def negatives_only_nce(logits: Tensor, labels: Tensor) -> Tensor:
    """Mean over anchors of -logits[i, label_i] + logsumexp of row i without its label (DCLR Eq. 6 as printed)."""
    positive = logits.gather(1, labels.unsqueeze(1)).squeeze(1)
    is_positive = F.one_hot(labels, num_classes=logits.shape[1]).bool()
    negatives = logits.masked_fill(is_positive, float("-inf"))
    has_negatives = torch.isfinite(negatives).any(dim=1)
    safe = torch.where(has_negatives.unsqueeze(1), negatives, torch.zeros_like(negatives))  # no -inf row: finite grads
    terms = torch.logsumexp(safe, dim=1) - positive
    return torch.where(has_negatives, terms, torch.zeros_like(terms)).mean()

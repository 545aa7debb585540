"""SNCSE's bidirectional margin loss on soft negatives (Wang et al., 2022): `objectives: [{name: bml, ...}]`.

Paper section 3 (BML): with Delta_i = cos(h_i, h_i^sn) - cos(h_i, h_i^+), the similarity of sentence i
to its negation (the soft negative) minus that to its positive view,

    L_BML = mean_i [ ReLU(Delta_i + alpha) + ReLU(-Delta_i - beta) ],

zero exactly when -beta <= Delta_i <= -alpha: the negation stays less similar than the positive, by
at least alpha and at most beta, since it shares almost every word. The recipe weights it with lambda
(1e-3 for BERT, 5e-4 for RoBERTa) beside InfoNCE. As in the authors' code (`simcse/models.py`,
`cl_forward`): h_i, h_i^+ are the training vectors (after the head) of views 0 and 1, the negation is
encoded in the same step with view 1's template (`This sentence of "[X]" means [MASK] .`) and through
the same head; a sentence without a negation becomes "Not " + sentence, as the code's fallback.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from csekit.core.errors import CsekitError
from csekit.parts.hooks import MakesViews
from csekit.parts.objectives.two_way_margin import two_way_margin
from csekit.parts.step_state import StepState

HEAD_PER_VECTOR = "objective bml encodes the negations through the step's head: use head mlp or none"


def _present(value: object) -> bool:
    return isinstance(value, str) and bool(value.strip())


class BidirectionalMargin(nn.Module):
    """SNCSE's BML: each sentence's negation kept between alpha and beta less similar than its positive.

    alpha, beta: the margins (0.1 and 0.3 in the authors' code); negation_field: the corpus field of
    the negations (`csekit augment` writes `negation`); fallback_prefix: the negation of a sentence
    that has none ("Not ", the authors' code; null skips those rows); negation_view: the template the
    negations are wrapped in under a prompt pooler (view 1, the positive's, as the authors' code).
    """

    def __init__(
        self,
        alpha: float = 0.1,
        beta: float = 0.3,
        anchor_view: int = 0,
        positive_view: int = 1,
        negation_view: int = 1,
        negation_field: str = "negation",
        fallback_prefix: str | None = "Not ",
        max_length: int | None = None,
        head: nn.Module | None = None,
    ) -> None:
        super().__init__()
        if isinstance(head, MakesViews):  # the recipe's head, when built from a recipe: refused before the run starts
            raise ValueError(HEAD_PER_VECTOR)
        if alpha > beta:
            raise ValueError(f"alpha ({alpha}) must not exceed beta ({beta}): no similarity gap would satisfy both")
        self.alpha = float(alpha)
        self.beta = float(beta)
        self.anchor_view = anchor_view
        self.positive_view = positive_view
        self.negation_view = negation_view
        self.negation_field = negation_field
        self.fallback_prefix = fallback_prefix
        self.max_length = max_length

    def negations(self, state: StepState) -> tuple[list[int], list[str]]:
        """The rows that have a soft negative, and their negations (the fallback where the corpus has none)."""
        if self.negation_field not in state.fields:
            raise CsekitError(
                f'objective bml needs the field "{self.negation_field}" in the corpus: train on the .jsonl '
                "written by `csekit augment` (data.corpus, data.text_column: text)"
            )
        rows, texts = [], []
        for i, (sentence, negation) in enumerate(zip(state.sentences, state.fields[self.negation_field], strict=True)):
            if _present(negation):
                rows.append(i)
                texts.append(str(negation))
            elif self.fallback_prefix is not None:
                rows.append(i)
                texts.append(self.fallback_prefix + sentence)
        return rows, texts

    def forward(self, state: StepState) -> dict[str, Tensor]:
        anchors = state.embeddings[self.anchor_view]
        rows, texts = self.negations(state)
        if not rows:
            return {"bml": anchors.sum() * 0.0}
        if state.head is None or isinstance(state.head, MakesViews):
            raise CsekitError(HEAD_PER_VECTOR)
        encoder = state.encoder
        inputs = encoder.tokenize(texts, view=self.negation_view, max_length=self.max_length)
        pooled = encoder({key: value.to(anchors.device) for key, value in inputs.items()}, token_states=False).pooled
        negations = state.head(pooled)
        index = torch.tensor(rows, device=anchors.device)
        anchor, positive = anchors.index_select(0, index), state.embeddings[self.positive_view].index_select(0, index)
        return {"bml": two_way_margin(anchor, positive, negations, self.alpha, self.beta).mean()}

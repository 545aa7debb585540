"""OssCSE's two-way max-margin loss between a sentence's paraphrase and its negation."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from csekit.core.errors import CsekitError
from csekit.parts.step_state import StepState


def two_way_margin(anchor: Tensor, paraphrase: Tensor, negation: Tensor, alpha: float, beta: float) -> Tensor:
    """Per row: max(s(h,h^n) - s(h,h^p) + alpha, 0) + max(s(h,h^p) - s(h,h^n) - beta, 0), s = cosine.

    Zero exactly when alpha <= s(h,h^p) - s(h,h^n) <= beta: the paraphrase must beat the negation, but
    by no more than beta, since a negation is still closely related to the sentence.
    """
    s_p = F.cosine_similarity(anchor.float(), paraphrase.float(), dim=-1)
    s_n = F.cosine_similarity(anchor.float(), negation.float(), dim=-1)
    return torch.clamp(s_n - s_p + alpha, min=0) + torch.clamp(s_p - s_n - beta, min=0)


def _present(value: object) -> bool:
    return isinstance(value, str) and bool(value.strip())


class TwoWayMargin(nn.Module):
    """The margin loss on (sentence, paraphrase, negation); the latter two come from a `.jsonl` corpus.

    The sentence's vector is its view-`view` pooled feature (the test-time representation, no head);
    paraphrases and negations are encoded by the same encoder in the same step (view-0 template for a
    prompt pooler), so the loss trains the encoder through all three. Rows without a paraphrase or a
    negation (dropped by `csekit augment`) are skipped; the loss is the mean over the other rows.
    """

    #: The view options that index the step's inputs (not the training representations): checked at load.
    input_view_options = ("view",)

    def __init__(
        self,
        alpha: float = 0.05,
        beta: float = 0.2,
        view: int = 0,
        paraphrase_field: str = "paraphrase",
        negation_field: str = "negation",
        max_length: int | None = None,
    ) -> None:
        super().__init__()
        if alpha > beta:
            raise ValueError(f"alpha ({alpha}) must not exceed beta ({beta}): no similarity gap would satisfy both")
        self.alpha = alpha
        self.beta = beta
        self.view = view
        self.paraphrase_field = paraphrase_field
        self.negation_field = negation_field
        self.max_length = max_length

    def forward(self, state: StepState) -> dict[str, Tensor]:
        anchors = state.features[self.view]
        for name in (self.paraphrase_field, self.negation_field):
            if name not in state.fields:
                raise CsekitError(
                    f'objective margin needs the field "{name}" in the corpus: train on the .jsonl written by '
                    "`csekit augment` (data.corpus)"
                )
        paraphrases = state.fields[self.paraphrase_field]
        negations = state.fields[self.negation_field]
        rows = [i for i, (p, n) in enumerate(zip(paraphrases, negations, strict=True)) if _present(p) and _present(n)]
        if not rows:
            return {"margin": anchors.sum() * 0.0}
        encoder = state.encoder
        texts = [paraphrases[i] for i in rows] + [negations[i] for i in rows]
        inputs = encoder.tokenize(texts, view=0, max_length=self.max_length)
        pooled = encoder({key: value.to(anchors.device) for key, value in inputs.items()}, token_states=False).pooled
        paraphrase, negation = pooled.split(len(rows))
        index = torch.tensor(rows, device=anchors.device)
        losses = two_way_margin(anchors.index_select(0, index), paraphrase, negation, self.alpha, self.beta)
        return {"margin": losses.mean()}

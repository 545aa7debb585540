"""Loss terms. Each is a small `nn.Module` taking the `StepState` and returning named loss parts.

A recipe lists objectives with weights; the model sums weight * part over all of them. New methods
add their terms to `OBJECTIVES`.
"""

from __future__ import annotations

from torch import nn

from csekit.objectives.dclr_code import DclrCodeLoss
from csekit.objectives.infonce import InfoNCE, cosine_matrix
from csekit.objectives.margin import TwoWayMargin, two_way_margin
from csekit.objectives.multi_positive import MultiPositiveInfoNCE
from csekit.objectives.recall import RecallLoss
from csekit.objectives.slt_fai import AdversarialTuning, IncompleteSentenceFiltering

OBJECTIVES: dict[str, type[nn.Module]] = {
    "infonce": InfoNCE,
    "dclr_code": DclrCodeLoss,  # DCLR as the authors' code computes it (weights x logits, BCE)
    "multi_positive": MultiPositiveInfoNCE,  # WhitenedCSE, Eq. 7 (or 8)
    "slt_fai_at": AdversarialTuning,  # SLT-FAI's frequency adversary through gradient reversal
    "slt_fai_isf": IncompleteSentenceFiltering,  # SLT-FAI's incomplete-sentence filtering
    "margin": TwoWayMargin,  # OssCSE's two-way max-margin
    "recall": RecallLoss,  # OssCSE's recall of the pre-trained weights
}

__all__ = [
    "OBJECTIVES",
    "AdversarialTuning",
    "DclrCodeLoss",
    "IncompleteSentenceFiltering",
    "InfoNCE",
    "MultiPositiveInfoNCE",
    "RecallLoss",
    "TwoWayMargin",
    "cosine_matrix",
    "two_way_margin",
]

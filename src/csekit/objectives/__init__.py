"""Loss terms. Each is a small `nn.Module` taking the `StepState` and returning named loss parts.

A recipe lists objectives with weights; the model sums weight * part over all of them. New methods
add their terms to `OBJECTIVES`.
"""

from __future__ import annotations

from torch import nn

from csekit.objectives.infonce import InfoNCE, cosine_matrix
from csekit.objectives.slt_fai import AdversarialTuning, IncompleteSentenceFiltering

OBJECTIVES: dict[str, type[nn.Module]] = {"infonce": InfoNCE}
OBJECTIVES["slt_fai_at"] = AdversarialTuning
OBJECTIVES["slt_fai_isf"] = IncompleteSentenceFiltering

__all__ = ["OBJECTIVES", "AdversarialTuning", "IncompleteSentenceFiltering", "InfoNCE", "cosine_matrix"]

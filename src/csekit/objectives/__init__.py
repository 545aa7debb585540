"""Loss terms. Each is a small `nn.Module` taking the `StepState` and returning named loss parts.

A recipe lists objectives with weights; the model sums weight * part over all of them. New methods
add their terms to `OBJECTIVES`.
"""

from __future__ import annotations

from torch import nn

from csekit.objectives.dclr_code import DclrCodeLoss
from csekit.objectives.infonce import InfoNCE, cosine_matrix

OBJECTIVES: dict[str, type[nn.Module]] = {"infonce": InfoNCE}
OBJECTIVES["dclr_code"] = DclrCodeLoss  # DCLR as the authors' code computes it (weights x logits, BCE)

__all__ = ["OBJECTIVES", "InfoNCE", "cosine_matrix"]

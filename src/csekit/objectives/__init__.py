"""Loss terms. Each is a small `nn.Module` taking the `StepState` and returning named loss parts.

A recipe lists objectives with weights; the model sums weight * part over all of them. New methods
add their terms to `OBJECTIVES`.
"""

from __future__ import annotations

from torch import nn

from csekit.objectives.infonce import InfoNCE, cosine_matrix
from csekit.objectives.multi_positive import MultiPositiveInfoNCE

OBJECTIVES: dict[str, type[nn.Module]] = {"infonce": InfoNCE}
OBJECTIVES["multi_positive"] = MultiPositiveInfoNCE  # WhitenedCSE, Eq. 7 (or 8)

__all__ = ["OBJECTIVES", "InfoNCE", "MultiPositiveInfoNCE", "cosine_matrix"]

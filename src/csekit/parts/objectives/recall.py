"""OssCSE's recall loss: an L2 pull towards the pre-trained weights against catastrophic forgetting."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from csekit.parts.step_state import StepState


class RecallLoss(nn.Module):
    """(gamma / 2) * sum over trainable backbone parameters of (theta - theta_0)^2 (Chen et al., 2020).

    theta_0 is copied when the part is built, i.e. from the backbone the recipe loads, before any step
    and before a checkpoint is restored, so a resumed run copies the same pre-trained weights again.
    The copies are plain tensors, not parameters or buffers: no optimizer, checkpoint, export or DDP
    buffer broadcast ever sees them. They move to the parameters' device on first use.
    """

    def __init__(self, encoder: nn.Module, gamma: float = 2e-3) -> None:
        super().__init__()
        if gamma < 0:
            raise ValueError("gamma must be >= 0")
        self.gamma = gamma
        backbone = encoder.backbone  # type: ignore[attr-defined]
        trainable = [(name, p) for name, p in backbone.named_parameters() if p.requires_grad]
        self.theta0: dict[str, Tensor] = {name: parameter.detach().clone() for name, parameter in trainable}

    def forward(self, state: StepState) -> dict[str, Tensor]:
        parameters = dict(state.encoder.backbone.named_parameters())
        total = torch.zeros((), device=state.features[0].device)
        for name, anchor in self.theta0.items():
            parameter = parameters[name]
            if anchor.device != parameter.device:
                anchor = self.theta0[name] = anchor.to(parameter.device)
            total = total + (parameter.float() - anchor.float()).pow(2).sum()
        return {"recall": 0.5 * self.gamma * total}

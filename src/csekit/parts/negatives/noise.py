"""DCLR's noise-based negatives (Zhou et al., ACL 2022, Eq. 2-4): `negatives: [{name: dclr_noise, ...}]`.

k = ratio x batch Gaussian vectors in the representation space (the head output the loss contrasts),
moved by a few normalised gradient ASCENT steps on the non-uniformity loss L_U. They are constants
for the model; every anchor contrasts them as extra negatives (`StepState.extra_negatives`). Usable
with any views, head, weighting and objectives; DCLR's other part is `weighting/complementary.py`.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from csekit.core.distributed import gather_no_grad, world
from csekit.parts.objectives.infonce import cosine_matrix
from csekit.parts.step_state import StepState


def non_uniformity_loss(anchors: Tensor, positives: Tensor, noise: Tensor, temperature: float) -> Tensor:
    """L_U of paper Eq. 2, averaged over anchors: -log(e^{s(h,h+)/tau_u} / sum_j e^{s(h,noise_j)/tau_u}).

    As in the paper, the denominator holds the noise vectors only (not the positive).
    """
    positive = (F.normalize(anchors.float(), dim=-1) * F.normalize(positives.float(), dim=-1)).sum(dim=-1)
    positive = positive / temperature
    against_noise = cosine_matrix(anchors, noise) / temperature
    return (torch.logsumexp(against_noise, dim=1) - positive).mean()


def improve_noise(
    noise: Tensor, anchors: Tensor, positives: Tensor, steps: int, step_size: float, temperature: float
) -> Tensor:
    """`steps` normalised gradient ascent steps on L_U: h <- h + beta * g / ||g||_2 (each vector's own norm).

    Anchors and positives are detached here, so the model gets no gradient from these steps; the
    result is a constant (no graph).
    """
    anchors, positives = anchors.detach().float(), positives.detach().float()
    noise = noise.detach().float()
    with torch.enable_grad(), torch.autocast(noise.device.type, enabled=False):
        for _ in range(steps):
            noise.requires_grad_(True)
            loss = non_uniformity_loss(anchors, positives, noise, temperature)
            (gradient,) = torch.autograd.grad(loss, noise)
            norm = gradient.norm(dim=-1, keepdim=True).clamp_min(1e-12)
            noise = (noise + step_size * gradient / norm).detach()
    return noise


def _broadcast(tensor: Tensor) -> Tensor:
    """Rank 0's tensor on every process, so all processes share the same noise vectors."""
    _, size = world()
    if size > 1:
        dist.broadcast(tensor, src=0)
    return tensor


class NoiseNegatives(nn.Module):
    """DCLR's noise-based negatives, shared by all anchors of the (global) batch.

    ratio: k = round(ratio x global batch size) vectors (may be fractional: 2.5 for RoBERTa-base);
    sigma: their standard deviation; steps (t): gradient ascent steps (0 = the "random noise" ablation);
    step_size (beta) and temperature (tau_u) of the ascent. The paper gives no value for tau_u; the
    default is the contrastive temperature, 0.05.
    """

    def __init__(
        self,
        ratio: float = 1.0,
        sigma: float = 1.0,
        steps: int = 4,
        step_size: float = 1e-3,
        temperature: float = 0.05,
        anchor_view: int = 0,
        positive_view: int = 1,
    ) -> None:
        super().__init__()
        if ratio <= 0:
            raise ValueError(f"option ratio must be positive (got {ratio}); drop the part for no noise")
        if sigma <= 0:
            raise ValueError(f"option sigma must be positive (got {sigma})")
        if steps < 0:
            raise ValueError(f"option steps must be >= 0 (got {steps})")
        if step_size < 0:
            raise ValueError(f"option step_size must be >= 0 (got {step_size})")
        if temperature <= 0:
            raise ValueError(f"option temperature must be positive (got {temperature})")
        self.ratio = float(ratio)
        self.sigma = float(sigma)
        self.steps = int(steps)
        self.step_size = float(step_size)
        self.temperature = float(temperature)
        self.anchor_view = anchor_view
        self.positive_view = positive_view

    def forward(self, state: StepState) -> None:
        # Every process ascends on the whole gathered batch from the same start, so the noise is the
        # one a single process would compute on the global batch.
        anchors = gather_no_grad(state.embeddings[self.anchor_view].detach())
        positives = gather_no_grad(state.embeddings[self.positive_view].detach())
        count = max(1, round(self.ratio * anchors.shape[0]))
        noise = torch.randn(count, anchors.shape[1], device=anchors.device, dtype=torch.float32) * self.sigma
        noise = improve_noise(_broadcast(noise), anchors, positives, self.steps, self.step_size, self.temperature)
        state.extra_negatives.append(noise)

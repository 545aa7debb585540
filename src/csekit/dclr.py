"""DCLR (Zhou et al., ACL 2022): noise-based negatives and instance weighting by a complementary model.

Two parts, usable separately or together with any views and objectives:

* `NoiseNegatives` (`negatives: [{name: dclr_noise, ...}]`) adds k = ratio x batch Gaussian vectors in
  the representation space (the head output the loss contrasts), moved by a few normalised gradient
  ASCENT steps on the non-uniformity loss L_U (paper Eq. 2-4). They are constants for the model.
* `ComplementaryWeighting` (`weighting: {name: dclr, model: ..., phi: ...}`) gives weight 0 to every
  in-batch negative whose cosine similarity to the anchor, measured by a frozen complementary encoder,
  is >= phi (Eq. 5). `model: self` uses the model's own (detached) representations instead.

InfoNCE applies the weights as in the paper (Eq. 6); `objectives/dclr_code.py` has the authors' code
behaviour (weights multiply the logits; binary cross-entropy) for reproducing their numbers.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from csekit.distributed import gather_no_grad, world
from csekit.encoder import SentenceEncoder
from csekit.errors import CsekitError
from csekit.objectives.infonce import cosine_matrix
from csekit.state import StepState


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
        state.extras["dclr_noise"] = noise


class ComplementaryWeighting(nn.Module):
    """DCLR's instance weighting: in-batch negatives too similar to the anchor get weight 0.

    model: path or hub name of a trained encoder (the paper uses unsupervised SimCSE), loaded with
    `SentenceEncoder.load(model, pooler=model_pooler)` (None: the pooler saved with it, else cls;
    `pooler_output` reads the checkpoint's pooler layer, which in SimCSE's hub checkpoints holds SimCSE's
    training MLP: how DCLR's code reads its complementary model); or
    `self` for the "self instance weighting" ablation, which uses the step's own detached
    representations (`representation`: embeddings = head output, features = pooled vectors).
    phi: the similarity threshold. dropout: keep the complementary model's dropout on (the authors'
    code does; the paper describes a frozen model). The complementary model encodes the batch's
    sentences with its own tokenizer, truncated to the recipe's `model.max_length`.

    The complementary model is frozen and is deliberately NOT a submodule: it is kept in a plain
    attribute, so it is in no `state_dict()`, no checkpoint, no optimizer and no saved model; it is
    moved to the training device on first use.
    """

    def __init__(
        self,
        model: str = "self",
        phi: float = 0.9,
        model_pooler: str | None = None,
        representation: str = "embeddings",
        dropout: bool = False,
        anchor_view: int = 0,
        positive_view: int = 1,
        max_length: int | None = None,
    ) -> None:
        super().__init__()
        if not -1.0 <= phi <= 1.0:
            raise ValueError(f"option phi is a cosine similarity threshold in [-1, 1] (got {phi})")
        if representation not in ("embeddings", "features"):
            raise ValueError(f'option representation must be embeddings or features (got "{representation}")')
        self.phi = float(phi)
        self.representation = representation
        self.dropout = bool(dropout)
        self.anchor_view = anchor_view
        self.positive_view = positive_view
        self.max_length = max_length
        self.model_name = str(model)
        complementary: SentenceEncoder | None = None
        if self.model_name != "self":
            try:
                complementary = SentenceEncoder.load(self.model_name, pooler=model_pooler)
            except CsekitError as error:
                raise CsekitError(f"recipe key weighting.model: {error}") from None
            complementary.requires_grad_(False)
            complementary.train(self.dropout)
        # object.__setattr__ bypasses nn.Module's registration of submodules (see the class docstring).
        object.__setattr__(self, "_complementary", complementary)

    @property
    def complementary(self) -> SentenceEncoder | None:
        """The frozen complementary encoder (None for self weighting)."""
        return self.__dict__["_complementary"]

    def similarities(self, state: StepState) -> Tensor:
        """Cosine similarity [n, N_global] of each local anchor to every in-batch candidate."""
        complementary = self.complementary
        if complementary is None:
            source = state.embeddings if self.representation == "embeddings" else state.features
            anchors = source[self.anchor_view].detach()
            candidates = gather_no_grad(source[self.positive_view].detach())
            return cosine_matrix(anchors, candidates)
        device = state.embeddings[0].device
        if complementary.device != device:
            complementary.to(device)
        inputs = complementary.tokenize(state.sentences, max_length=self.max_length)
        with torch.no_grad():
            vectors = complementary({key: value.to(device) for key, value in inputs.items()}, token_states=False).pooled
        vectors = vectors.float()
        return cosine_matrix(vectors, gather_no_grad(vectors))

    def forward(self, state: StepState) -> None:
        similarity = self.similarities(state)
        weights = (similarity < self.phi).to(torch.float32)
        rows = torch.arange(weights.shape[0], device=weights.device)
        weights[rows, state.positive_index().to(weights.device)] = 1.0  # the positive always keeps weight 1
        state.negative_weights = weights if state.negative_weights is None else state.negative_weights * weights
        state.extras["dclr_weights"] = weights

    def extra_repr(self) -> str:
        return f"model={self.model_name!r}, phi={self.phi}"

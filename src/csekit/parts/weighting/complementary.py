"""DCLR's instance weighting (Zhou et al., ACL 2022, Eq. 5): `weighting: {name: dclr, model: ..., phi: ...}`.

Every in-batch negative whose cosine similarity to the anchor, measured by a frozen complementary
encoder, is >= phi gets weight 0 (`StepState.negative_weights`); `model: self` uses the model's own
(detached) representations instead. InfoNCE applies the weights as in the paper (Eq. 6);
`objectives/weighted_logits.py` has the authors' code behaviour (weights multiply the logits; binary
cross-entropy) for reproducing their numbers.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from csekit.core.distributed import gather_no_grad
from csekit.core.errors import CsekitError
from csekit.encoding.encoder import SentenceEncoder
from csekit.parts.objectives.infonce import cosine_matrix
from csekit.parts.step_state import StepState


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

    The complementary model runs in float32 with autocast off, whatever the step's precision: under bf16
    its cosines move by about 1e-2 and decide phi differently from the authors' fp32 runs.

    The complementary model is frozen and is deliberately NOT a submodule: it is kept in a plain
    attribute, so it is in no `state_dict()`, no checkpoint, no optimizer and no saved model; it is
    moved to the training device on first use.
    """

    #: The options naming a model (a folder, an alias or a hub name): a folder is recorded absolute when a run starts
    #: (csekit.training.recipe_paths).
    model_options = ("model",)

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
        """Cosine similarity [n, N_global] of each local anchor to every in-batch candidate, in float32.

        Autocast is off here even inside a bf16/fp16 training step: phi is a threshold, and DCLR's
        authors decided it in fp32 (for self weighting the step's own vectors are compared in fp32).
        """
        device = state.embeddings[0].device
        with torch.no_grad(), torch.autocast(device.type, enabled=False):
            complementary = self.complementary
            if complementary is None:
                source = state.embeddings if self.representation == "embeddings" else state.features
                anchors = source[self.anchor_view].detach()
                candidates = gather_no_grad(source[self.positive_view].detach())
                return cosine_matrix(anchors, candidates)
            if complementary.device != device:
                complementary.to(device)
            inputs = complementary.tokenize(state.sentences, max_length=self.max_length)
            vectors = complementary({key: value.to(device) for key, value in inputs.items()}, token_states=False).pooled
            vectors = vectors.float()
            return cosine_matrix(vectors, gather_no_grad(vectors))

    def forward(self, state: StepState) -> None:
        similarity = self.similarities(state)
        weights = (similarity < self.phi).to(torch.float32)
        rows = torch.arange(weights.shape[0], device=weights.device)
        weights[rows, state.positive_index().to(weights.device)] = 1.0  # the positive always keeps weight 1
        state.negative_weights = weights if state.negative_weights is None else state.negative_weights * weights

    def extra_repr(self) -> str:
        return f"model={self.model_name!r}, phi={self.phi}"

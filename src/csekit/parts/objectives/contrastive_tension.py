"""Contrastive Tension with in-batch negatives (Carlsson et al., ICLR 2021; the in-batch form of sentence-transformers).

`objectives: [{name: contrastive_tension}]`, with `views: {name: single}`. Two encoders start from the same
weights and both train: this part's copy (sentence-transformers' `model1`) and the recipe's encoder (`model2`,
the one saved and evaluated, as in sentence-transformers). Both encode the batch's sentences; with
S_ij = scale x sim(copy(s_i), encoder(s_j)) the loss is the mean of the cross-entropies of the rows and of the
columns of S, each sentence's own pair being the positive:

    L = (CE(S, I) + CE(S^T, I)) / 2

as `ContrastiveTensionLossInBatchNegatives.forward` (sentence-transformers 6.2) computes it: `sim` is cosine
(or the dot product, `similarity: dot`, its STS-B example's `util.dot_score` with scale 1), and the scale
is a learned parameter, exp(logit_scale) with logit_scale = log(scale) at the start (`learn_scale: false`
holds it). The paper's own form (binary cross-entropy on K negatives per positive in specially built
batches) is not this part; sentence-transformers reports the in-batch form better (STS-B 78.5 against 75.7).

The copy is this module's parameter set: it trains (with the recipe's learning rate and decay, as
sentence-transformers' optimizer takes every parameter of the loss module), runs with dropout in training
as the encoder does, and is in the checkpoint, not in the saved model. It encodes in one padded pass, and
only the local batch: the negatives are this process's sentences, as in sentence-transformers.
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from csekit.core.errors import CsekitError
from csekit.encoding.encoder import SentenceEncoder
from csekit.parts.objectives.infonce import check_similarity, similarity_matrix
from csekit.parts.step_state import StepState


class ContrastiveTension(nn.Module):
    """Contrastive Tension's in-batch loss between a trained copy of the encoder and the encoder itself.

    scale: the similarities' starting multiplier (sentence-transformers' default 20; its STS-B example uses
    1 with the dot product); similarity: cosine or dot; learn_scale: whether the multiplier trains (it does
    in sentence-transformers); view: whose inputs both encoders read (the one view of `views: single`).
    `encoder` and `head` are build arguments; there is no head in Contrastive Tension, so one with
    parameters is refused.
    """

    #: The view options that index the step's inputs (not the training representations): checked at load.
    input_view_options = ("view",)

    def __init__(
        self,
        encoder: SentenceEncoder,
        head: nn.Module | None = None,
        scale: float = 20.0,
        similarity: str = "cosine",
        learn_scale: bool = True,
        view: int = 0,
    ) -> None:
        super().__init__()
        if not scale > 0:
            raise ValueError(f"option scale must be positive (got {scale})")
        if view < 0:
            raise ValueError(f"option view must be a view's index, 0 or more (got {view})")
        if head is not None and any(True for _ in head.parameters()):
            raise ValueError("contrastive_tension contrasts the two encoders' pooled vectors: set model.head to none")
        self.similarity = check_similarity(similarity)
        self.view = view
        #: sentence-transformers' model1: a copy of the encoder as it starts, trained too (not saved).
        self.copy_encoder = copy.deepcopy(encoder).requires_grad_(True)
        self.logit_scale = nn.Parameter(torch.tensor(math.log(scale)), requires_grad=bool(learn_scale))

    def scores(self, copy_vectors: Tensor, vectors: Tensor) -> Tensor:
        """S [n, n]: the copy's vector of sentence i against the encoder's of sentence j, scaled."""
        return similarity_matrix(copy_vectors, vectors, self.similarity) * self.logit_scale.exp()

    def forward(self, state: StepState) -> dict[str, Tensor]:
        if self.view >= state.num_views:
            raise CsekitError(
                f"objective contrastive_tension: option view {self.view}, but the recipe's views make {state.num_views}"
            )
        n = state.batch_size
        rows = slice(self.view * n, (self.view + 1) * n)
        output = state.encoder_output
        inputs = {"input_ids": output.input_ids[rows], "attention_mask": output.attention_mask[rows]}
        copy_vectors = self.copy_encoder(inputs, token_states=False).pooled
        scores = self.scores(copy_vectors, state.embeddings[self.view])
        labels = torch.arange(n, device=scores.device)
        loss = (F.cross_entropy(scores, labels) + F.cross_entropy(scores.T, labels)) / 2
        return {"contrastive_tension": loss}

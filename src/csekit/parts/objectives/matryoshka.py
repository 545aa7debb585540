"""Matryoshka representation learning (Kusupati et al., NeurIPS 2022) around any objective.

    objectives:
      - name: matryoshka
        objective: {name: infonce, temperature: 0.05}   # the inner objective's spec, any objective
        dims: [384, 256, 128, 64, 32]
        weights: [1, 1, 1, 1, 1]                         # optional: 1 for every dim
        normalize: true                                  # optional: the cut vectors at unit length

The inner objective is evaluated once per dim on the step's representations cut to their first `dim`
coordinates (pooled vectors, training representations, extra negatives and row contrasts, the gathered
views), and the loss is sum_dim weight_dim x inner(cut state), every part the inner objective returns
counted (the sum the model would make of them). With `normalize` (the default) every cut vector is scaled to
unit length before the inner objective reads it, as sentence-transformers' `shrink` does (`F.normalize` after
the cut, at every width, the full one included): a cosine objective (infonce's default) is unchanged by it, a
dot-product one (`infonce` with `similarity: dot`) then scores cosines of the cut vectors, as it does there.
`normalize: false` hands the inner objective the raw cut. This is sentence-transformers'
`MatryoshkaLoss(model, loss, matryoshka_dims, matryoshka_weights)` (6.2; `n_dims_per_step` -1, every dim
each step), which cuts the `sentence_embedding` each inner loss reads.

What is cut is what `StepState` holds; an inner objective that encodes further sentences itself (SNCSE's
negations) would meet full-width vectors, and is refused by the shapes. Weighting parts and negative sources
run once, on the full width. The cut vectors must be those the saved model outputs: a head that trains but
is not kept (`model.head_at_test: false` with a head with parameters) is refused.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch.nn.functional as F
from torch import Tensor, nn

from csekit.parts.hooks import reads_token_states
from csekit.parts.step_state import StepState


def cut(vectors: Tensor, dim: int, normalize: bool) -> Tensor:
    """`vectors`' first `dim` coordinates, at unit length with `normalize` (sentence-transformers' `shrink`)."""
    return F.normalize(vectors[..., :dim], p=2, dim=-1) if normalize else vectors[..., :dim]


def truncated_state(state: StepState, dim: int, normalize: bool = False) -> StepState:
    """The step's state with every vector cut to its first `dim` coordinates (the rest shared, not copied), each
    scaled to unit length with `normalize`."""
    return dataclasses.replace(
        state,
        features=[cut(vectors, dim, normalize) for vectors in state.features],
        embeddings=[cut(vectors, dim, normalize) for vectors in state.embeddings],
        extra_negatives=[cut(vectors, dim, normalize) for vectors in state.extra_negatives],
        extra_negative_weights=dict(state.extra_negative_weights),
        extra_row_contrasts=[
            (cut(q, dim, normalize), cut(c, dim, normalize), w) for q, c, w in state.extra_row_contrasts
        ],
        _gathered={view: cut(vectors, dim, normalize) for view, vectors in state._gathered.items()},
    )


class Matryoshka(nn.Module):
    """sum_dim weight_dim x `objective`(the state cut to dim): the inner objective at every Matryoshka width.

    objective: the inner objective (in a recipe its spec, built as a part of its own, key
    `objectives[i].objective`); dims: the widths, each from 1 to the representation's (`dim`, a build
    argument); weights: one per dim (default 1 each); normalize: scale each cut vector to unit length
    (sentence-transformers' `shrink`; default true). `head` and `head_at_test` are build arguments.
    """

    #: Options holding a part's spec, built by csekit as a part of the same kind (`training/part_building.py`).
    nested_parts = ("objective",)

    def __init__(
        self,
        objective: nn.Module,
        dims: Sequence[int],
        weights: Sequence[float] | None = None,
        normalize: bool = True,
        dim: int | None = None,
        head: nn.Module | None = None,
        head_at_test: bool = False,
    ) -> None:
        super().__init__()
        if not isinstance(objective, nn.Module):
            raise ValueError(
                f"option objective must be an objective's spec, e.g. {{name: infonce}} (got {objective!r})"
            )
        if not dims:
            raise ValueError("option dims must list at least one width")
        if weights is None:
            weights = [1.0] * len(dims)
        if len(weights) != len(dims):
            raise ValueError(f"option weights must give one weight per dim ({len(dims)} dims, {len(weights)} weights)")
        if any(not 0 < d <= (dim or d) for d in dims):
            raise ValueError(f"option dims must be widths from 1 to the representation's {dim} (got {list(dims)})")
        if any(not w >= 0 for w in weights):
            raise ValueError(f"option weights must be numbers >= 0 (got {list(weights)})")
        if head is not None and not head_at_test and any(True for _ in head.parameters()):
            raise ValueError(
                "matryoshka cuts the training representations, but a head that is not kept (model.head_at_test "
                "false) makes them differ from the saved model's vectors: use model.head none or head_at_test true"
            )
        ordered = sorted(zip(dims, weights, strict=True), key=lambda pair: -pair[0])  # widest first, as ST
        self.objective = objective
        self.dims = [int(d) for d, _ in ordered]
        self.weights = [float(w) for _, w in ordered]
        self.normalize = bool(normalize)
        self.reads_token_states = reads_token_states(objective)

    def forward(self, state: StepState) -> dict[str, Tensor]:
        total: Tensor | None = None
        for width, weight in zip(self.dims, self.weights, strict=True):
            for value in self.objective(truncated_state(state, width, self.normalize)).values():
                total = weight * value if total is None else total + weight * value
        assert total is not None
        return {"matryoshka": total}

"""The state of one training step, shared by every part of a recipe.

The model fills in the views' pooled vectors and head outputs; negative sources and weighting
parts add to it; objectives read it and return named loss terms. Parts communicate only through
this object, which is what lets a recipe combine parts of different papers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from csekit.core.distributed import gather_with_grad, world

if TYPE_CHECKING:
    from csekit.encoding.encoder import EncoderOutput, SentenceEncoder


@dataclass
class StepState:
    """Everything one step knows. Tensors are local to this process unless named `global`."""

    sentences: list[str]
    #: Per view, the pooled sentence vectors [n, d] (the test-time representation when no head is kept).
    features: list[Tensor]
    #: Per view, the training representations after the head [n, d]; objectives contrast these.
    embeddings: list[Tensor]
    #: The encoder's output for all views stacked ([V*n, ...]): token states, masks, ids.
    encoder_output: EncoderOutput
    #: The trained encoder; a part that encodes more sentences calls it (with `run.chunk_size` it is a
    #: stand-in that encodes in chunks, `csekit.training.chunked.ChunkedEncoder`, so parts must not bypass it).
    encoder: SentenceEncoder
    #: The training head that made `embeddings` from `features`, for objectives that encode more
    #: sentences in the step and contrast them with `embeddings` (SNCSE's negations); None outside a model.
    head: nn.Module | None = None
    #: Extra per-sentence fields from a `.jsonl` corpus (e.g. a paraphrase), by name.
    fields: dict[str, list[Any]] = field(default_factory=dict)
    #: Extra negatives [k, d] shared by all anchors (e.g. DCLR's noise); weight 1 unless weighted.
    extra_negatives: list[Tensor] = field(default_factory=list)
    #: Weights [n, k] of entry i of `extra_negatives` for each local anchor, by i (absent: all 1).
    extra_negative_weights: dict[int, Tensor] = field(default_factory=dict)
    #: Extra candidates scored from a stand-in for each anchor, appended to its row: (queries [n, d], one per
    #: local anchor, candidates [k, d], weights [n, k] or None); anchor i's row gets s(queries_i, c) for
    #: every candidate c (MixCSE's symmetric block: the mix of anchors i and i + 1 against the positives).
    extra_row_contrasts: list[tuple[Tensor, Tensor, Tensor | None]] = field(default_factory=list)
    #: Weights [n, N_global] of the in-batch candidates for each local anchor (None: all 1).
    negative_weights: Tensor | None = None
    #: Optimizer steps taken before this one (0 on the first step); parts with a warm-up read it.
    step: int = 0
    #: Batches in one epoch (None outside the trainer); with `step`, where the run is in epochs.
    steps_per_epoch: int | None = None
    _gathered: dict[int, Tensor] = field(default_factory=dict, repr=False)

    @property
    def batch_size(self) -> int:
        return self.embeddings[0].shape[0]

    @property
    def num_views(self) -> int:
        return len(self.embeddings)

    def global_view(self, view: int) -> Tensor:
        """View `view` of every process's batch [N_global, d], with gradients (cached per step)."""
        if view not in self._gathered:
            self._gathered[view] = gather_with_grad(self.embeddings[view])
        return self._gathered[view]

    def positive_index(self) -> Tensor:
        """For each local anchor, the column of its own positive among the global candidates."""
        rank, _ = world()
        n = self.batch_size
        return torch.arange(n, device=self.embeddings[0].device) + rank * n

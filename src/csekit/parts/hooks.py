"""The optional hooks a part may implement, declared as Protocols.

A part is a plain `nn.Module` (or, for views, a callable); these are the extra things the model,
the trainer and the exporter look for. Each check is `isinstance(part, Protocol)` (runtime-checkable),
so a user's part opts in by defining the attribute or method, without inheriting anything.
`ExportsAsDenseTanh` lives with the kept head it folds into (the encoder, a layer below, checks it).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from torch import Tensor

from csekit.encoding.kept_head import ExportsAsDenseTanh


@runtime_checkable
class ReadsTokenStates(Protocol):
    """A part that reads the last layer's token states (`StepState.encoder_output`), not just pooled vectors.

    Without it the encoder computes the last layer only at the positions the pooler reads (a speed-up),
    and the token states are not available. SLT-FAI's frequency objectives set it to True.
    """

    reads_token_states: bool


@runtime_checkable
class MakesViews(Protocol):
    """A head that makes the training views itself from the V pooled views (WhitenedCSE's m positives)."""

    def forward_views(self, features: list[Tensor]) -> list[Tensor]: ...


@runtime_checkable
class OwnLearningRate(Protocol):
    """A module whose parameters (and its submodules') train with their own AdamW learning rate (None: the recipe's)."""

    learning_rate: float | None


@runtime_checkable
class StartsLater(Protocol):
    """A part that does nothing before some step (SLT-FAI's adversary and filter, after their warm-up).

    `first_active_step` is the number of optimizer steps done before the part first trains (0: from the
    start). The trainer warns at the start of a run that ends before it: the part would never switch on.
    """

    def first_active_step(self, steps_per_epoch: int) -> int: ...


def reads_token_states(part: object) -> bool:
    return isinstance(part, ReadsTokenStates) and bool(part.reads_token_states)


def own_learning_rate(module: object) -> float | None:
    return (
        float(module.learning_rate)
        if isinstance(module, OwnLearningRate) and module.learning_rate is not None
        else None
    )


__all__ = [
    "ExportsAsDenseTanh",
    "MakesViews",
    "OwnLearningRate",
    "ReadsTokenStates",
    "StartsLater",
    "own_learning_rate",
    "reads_token_states",
]

"""Views: how the two (or more) inputs of each sentence are made for the contrastive loss."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from csekit.core.registry import Registry
from csekit.parts.views.consert import ConsertViews
from csekit.parts.views.cropping import CroppingViews
from csekit.parts.views.deletion import DeletionViews
from csekit.parts.views.dropout import DropoutViews
from csekit.parts.views.repetition import RepetitionViews
from csekit.parts.views.single import SingleView

BUILTIN: Mapping[str, Callable[..., Any]] = MappingProxyType(
    {
        "dropout": DropoutViews,  # SimCSE: the same ids twice, dropout makes the views differ
        "consert": ConsertViews,  # ConSERT's embedding-level augmentations (SLT-FAI's ConSERT variant)
        "repetition": RepetitionViews,  # ESimCSE: view 1 repeats some of the sentence's tokens
        "single": SingleView,  # one view: Contrastive Tension's second representation is a second encoder's
        "deletion": DeletionViews,  # TSDAE: one view, the sentence with each word deleted with p 0.6
        "cropping": CroppingViews,  # Contriever's random contiguous crops (the TMLR 2026 cropping study)
    }
)
"""`data.views` names; see `VIEWS`."""

VIEWS: Registry[Callable[..., Any]] = Registry("views", BUILTIN, "views")
"""`data.views`: how the inputs of each sentence's views are made."""

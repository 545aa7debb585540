"""Loss terms. Each is a small `nn.Module` taking the `StepState` and returning named loss parts.

A recipe lists objectives with weights; the model sums weight * part over all of them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from torch import nn

from csekit.core.registry import Registry
from csekit.parts.objectives.bidirectional_margin import BidirectionalMargin
from csekit.parts.objectives.contrastive_tension import ContrastiveTension
from csekit.parts.objectives.diffcse import ReplacedTokenDetection
from csekit.parts.objectives.infonce import InfoNCE, cosine_matrix
from csekit.parts.objectives.matryoshka import Matryoshka
from csekit.parts.objectives.mlm import MaskedLanguageModeling
from csekit.parts.objectives.mntp import MaskedNextTokenPrediction
from csekit.parts.objectives.multi_positive import MultiPositiveInfoNCE
from csekit.parts.objectives.nt_xent import NTXent
from csekit.parts.objectives.ranking import RankingConsistency, RankingDistillation
from csekit.parts.objectives.recall import RecallLoss
from csekit.parts.objectives.slt_fai import AdversarialTuning, IncompleteSentenceFiltering
from csekit.parts.objectives.tsdae import DenoisingReconstruction
from csekit.parts.objectives.two_way_margin import TwoWayMargin, two_way_margin
from csekit.parts.objectives.weighted_logits import WeightedLogitsLoss

BUILTIN: Mapping[str, Callable[..., nn.Module]] = MappingProxyType(
    {
        "infonce": InfoNCE,  # SimCSE (and DCLR's Eq. 6 with weights, any extra negatives)
        "nt_xent": NTXent,  # ConSERT's (and SLT-FAI's code's) symmetric loss with same-view negatives
        "dclr_code": WeightedLogitsLoss,  # DCLR as the authors' code computes it (weights x logits, BCE)
        "multi_positive": MultiPositiveInfoNCE,  # WhitenedCSE, Eq. 7 (or 8)
        "slt_fai_at": AdversarialTuning,  # SLT-FAI's frequency adversary through gradient reversal
        "slt_fai_isf": IncompleteSentenceFiltering,  # SLT-FAI's incomplete-sentence filtering
        "margin": TwoWayMargin,  # OssCSE's two-way max-margin
        "recall": RecallLoss,  # OssCSE's recall of the pre-trained weights
        "bml": BidirectionalMargin,  # SNCSE's bidirectional margin loss on negations (soft negatives)
        "rank_distill": RankingDistillation,  # RankCSE's listwise ranking distillation from frozen teachers
        "rank_consistency": RankingConsistency,  # RankCSE's JS divergence between the two views' ranking lists
        "contrastive_tension": ContrastiveTension,  # Contrastive Tension, in-batch (a trained copy of the encoder)
        "matryoshka": Matryoshka,  # Matryoshka: an inner objective at every truncated width
        "tsdae": DenoisingReconstruction,  # TSDAE: a decoder tied to the encoder rebuilds the sentence from its vector
        "mlm": MaskedLanguageModeling,  # SimCSE's MLM auxiliary objective (--do_mlm): masked tokens predicted
        "diffcse": ReplacedTokenDetection,  # DiffCSE: a discriminator told the sentence vector finds an MLM's edits
        "mntp": MaskedNextTokenPrediction,  # LLM2Vec's masked next-token prediction (a decoder's adaptation)
    }
)
"""`objectives` names; see `OBJECTIVES`."""

OBJECTIVES: Registry[Callable[..., nn.Module]] = Registry("objective", BUILTIN, "objective")
"""`objectives`: the loss terms, each returning named loss parts."""

__all__ = [
    "BUILTIN",
    "OBJECTIVES",
    "AdversarialTuning",
    "BidirectionalMargin",
    "ContrastiveTension",
    "DenoisingReconstruction",
    "IncompleteSentenceFiltering",
    "InfoNCE",
    "MaskedLanguageModeling",
    "MaskedNextTokenPrediction",
    "Matryoshka",
    "MultiPositiveInfoNCE",
    "NTXent",
    "RankingConsistency",
    "RankingDistillation",
    "RecallLoss",
    "ReplacedTokenDetection",
    "TwoWayMargin",
    "WeightedLogitsLoss",
    "cosine_matrix",
    "two_way_margin",
]

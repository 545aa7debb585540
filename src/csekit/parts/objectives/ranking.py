"""RankCSE's listwise ranking distillation (Liu et al., ACL 2023): `objectives: [{name: rank_distill, ...}]`.

Frozen teacher encoders rank each anchor's in-batch candidates; the student learns that ranking
from its own similarity list (the paper's listwise distillation). With s_ij = cos(h_i, h_j^+) / tau (the student's
InfoNCE logits) and t_ij = sum_k w_k cos(T_k(x_i), T_k(x_j)) / tau_2 (the teachers' cosines, weighted:
alpha and 1 - alpha for two teachers):

* ListNet: sum_i CE(softmax(t_i), softmax(s_i)) / N over the candidates j != i (the positive
  left out of both lists, as the public code fills the diagonal with -inf);
* ListMLE: the negative log-likelihood of the teacher's order pi_i of all candidates under the
  student's Plackett-Luce model, sum_j [log sum_{k >= j} e^{s_{i,pi(k)}} - s_{i,pi(j)}], mean over anchors;
  ties in the teacher's list are broken at random (the public code shuffles before sorting).

`rank_consistency` is the paper's ranking consistency between the two views: the Jensen-Shannon divergence
of softmax(s_i) (view 0 against view 1) and softmax(s'_i) (view 1 against view 0), averaged over anchors.

The teachers are frozen and, like DCLR's complementary model, kept out of every state dict, checkpoint,
optimizer and saved model; they encode the batch's sentences with their own tokenizers and poolers,
without dropout, in float32 with autocast off. Any saved csekit model or hub encoder can teach.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from csekit.core.distributed import gather_no_grad
from csekit.core.errors import CsekitError
from csekit.encoding.encoder import SentenceEncoder
from csekit.parts.objectives.infonce import cosine_matrix
from csekit.parts.step_state import StepState

LOSSES = ("listnet", "listmle")


def listnet(student: Tensor, teacher: Tensor, positives: Tensor) -> Tensor:
    """Mean over rows of the cross-entropy of softmax(teacher) to softmax(student), each row's positive left out."""
    is_positive = F.one_hot(positives, num_classes=student.shape[1]).bool()
    log_p = F.log_softmax(student.float().masked_fill(is_positive, float("-inf")), dim=1)
    q = F.softmax(teacher.float().masked_fill(is_positive, float("-inf")), dim=1)
    return -(q * log_p.masked_fill(is_positive, 0.0)).sum(dim=1).mean()


def listmle(student: Tensor, teacher: Tensor) -> Tensor:
    """Mean over rows of -log P(teacher's order | student's scores) under the Plackett-Luce model."""
    shuffle = torch.randperm(student.shape[1], device=student.device)  # random tie-breaking
    student, teacher = student.float()[:, shuffle], teacher.float()[:, shuffle]
    order = teacher.sort(dim=1, descending=True, stable=True).indices
    ranked = student.gather(1, order)
    # log sum_{k >= j} e^{s_k}: a log-cumulative-sum from the end of each ranked list.
    tails = torch.logcumsumexp(ranked.flip(dims=[1]), dim=1).flip(dims=[1])
    return (tails - ranked).sum(dim=1).mean()


class RankingDistillation(nn.Module):
    """RankCSE's ranking distillation from frozen teachers (ListNet or ListMLE), beside InfoNCE.

    teachers: saved models or hub names; teacher_poolers: their poolers (None: each one's own, else
    cls); teacher_weights: the weights of their similarity lists (RankCSE: alpha 0.33 and 0.67);
    loss: listnet or listmle; teacher_temperature: tau_2; temperature: tau of the student's list
    (the InfoNCE temperature, as the public code reuses InfoNCE's logits).
    """

    #: The options naming a model (a folder, an alias or a hub name): a folder is recorded absolute when a run starts
    #: (csekit.training.recipe_paths).
    model_options = ("teachers",)

    def __init__(
        self,
        teachers: list[str],
        teacher_poolers: list[str] | None = None,
        teacher_weights: list[float] | None = None,
        loss: str = "listnet",
        teacher_temperature: float = 0.05,
        temperature: float = 0.05,
        anchor_view: int = 0,
        positive_view: int = 1,
        max_length: int | None = None,
    ) -> None:
        super().__init__()
        if loss not in LOSSES:
            raise ValueError(f'option loss must be one of {", ".join(LOSSES)} (got "{loss}")')
        if not teachers:
            raise ValueError("option teachers must name at least one teacher model")
        poolers = teacher_poolers if teacher_poolers is not None else [None] * len(teachers)
        weights = teacher_weights if teacher_weights is not None else [1.0 / len(teachers)] * len(teachers)
        if len(poolers) != len(teachers) or len(weights) != len(teachers):
            raise ValueError("options teacher_poolers and teacher_weights need one entry per teacher")
        if teacher_temperature <= 0 or temperature <= 0:
            raise ValueError("temperatures must be positive")
        self.loss = loss
        self.teacher_weights = [float(weight) for weight in weights]
        self.teacher_temperature = float(teacher_temperature)
        self.temperature = float(temperature)
        self.anchor_view = anchor_view
        self.positive_view = positive_view
        self.max_length = max_length
        loaded = []
        for index, (name, pooler) in enumerate(zip(teachers, poolers, strict=True)):
            try:
                teacher = SentenceEncoder.load(name, pooler=pooler)
            except CsekitError as error:
                raise CsekitError(f"teachers[{index}]: {error}") from None
            loaded.append(teacher.requires_grad_(False).eval())
        # Plain attribute, not submodules: the teachers are in no state dict, checkpoint, optimizer or saved model.
        object.__setattr__(self, "_teachers", loaded)

    @property
    def teachers(self) -> list[SentenceEncoder]:
        return self.__dict__["_teachers"]

    def teacher_scores(self, state: StepState) -> Tensor:
        """t [n, N_global]: the teachers' weighted cosines of each local sentence to every sentence, / tau_2."""
        device = state.embeddings[0].device
        scores = None
        with torch.no_grad(), torch.autocast(device.type, enabled=False):
            for teacher, weight in zip(self.teachers, self.teacher_weights, strict=True):
                if teacher.device != device:
                    teacher.to(device)
                inputs = teacher.tokenize(state.sentences, max_length=self.max_length)
                vectors = teacher({k: v.to(device) for k, v in inputs.items()}, token_states=False).pooled.float()
                cosines = weight * cosine_matrix(vectors, gather_no_grad(vectors))
                scores = cosines if scores is None else scores + cosines
        assert scores is not None
        return scores / self.teacher_temperature

    def forward(self, state: StepState) -> dict[str, Tensor]:
        anchors = state.embeddings[self.anchor_view]
        student = cosine_matrix(anchors, state.global_view(self.positive_view)) / self.temperature
        teacher = self.teacher_scores(state)
        if self.loss == "listnet":
            return {"listnet": listnet(student, teacher, state.positive_index())}
        return {"listmle": listmle(student, teacher)}


def jensen_shannon(p_logits: Tensor, q_logits: Tensor) -> Tensor:
    """Mean over rows of JS(softmax(p), softmax(q)) = (KL(p || m) + KL(q || m)) / 2, m = (p + q) / 2."""
    log_p, log_q = F.log_softmax(p_logits.float(), dim=1), F.log_softmax(q_logits.float(), dim=1)
    log_m = torch.logsumexp(torch.stack([log_p, log_q]), dim=0) - math.log(2.0)
    kl_pm = (log_p.exp() * (log_p - log_m)).sum(dim=1)
    kl_qm = (log_q.exp() * (log_q - log_m)).sum(dim=1)
    return (0.5 * (kl_pm + kl_qm)).mean()


class RankingConsistency(nn.Module):
    """RankCSE's ranking consistency: the two views rank the batch alike (JS divergence of their lists).

    The lists are s_ij = cos(h_i, h_j^+) / tau and s'_ij = cos(h_i^+, h_j) / tau; the recipe weights the
    term with beta (1.0 in the public script).
    """

    def __init__(self, temperature: float = 0.05, anchor_view: int = 0, positive_view: int = 1) -> None:
        super().__init__()
        if temperature <= 0:
            raise ValueError("temperature must be positive")
        self.temperature = float(temperature)
        self.anchor_view = anchor_view
        self.positive_view = positive_view

    def forward(self, state: StepState) -> dict[str, Tensor]:
        forward_list = cosine_matrix(state.embeddings[self.anchor_view], state.global_view(self.positive_view))
        backward_list = cosine_matrix(state.embeddings[self.positive_view], state.global_view(self.anchor_view))
        return {"rank_consistency": jensen_shannon(forward_list / self.temperature, backward_list / self.temperature)}

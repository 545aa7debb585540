"""ESimCSE's momentum contrast (Wu et al., COLING 2022, section 3.2): `negatives: [{name: momentum_queue}]`.

A momentum encoder, a copy of the encoder updated as theta_m <- lambda theta_m + (1 - lambda) theta_e
(lambda 0.995) with no gradient, encodes each step's inputs of one view; its outputs of the preceding
steps wait in a first-in first-out queue (2.5 x the batch size) and are extra negatives of every anchor:

    l_i = -log e^{s(h_i, h_i^+)/tau} / (sum_j e^{s(h_i, h_j^+)/tau} + sum_m e^{s(h_i, h_m)/tau})

(the paper's loss; `infonce` appends `StepState.extra_negatives` to its candidates). The momentum
encoder runs without dropout, and the current batch enters the queue only after it has been used,
so an anchor never meets its own positive among the queued negatives.

Which view and which head: the authors' code (caskcsg/sentemb at 5eeec55, `ESimCSE/esimcse/models.py`
L123-139 and L186-192, `ESimCSE/esimcse/trainers.py` L619-636) encodes view 0 (the sentence itself)
and maps it with the *online* MLP head, without gradient (its momentum model copies the encoder only):
`view: 0, queue_head: online`, which the ESimCSE recipes use. The defaults, `view: 1, queue_head:
momentum` (the repeated sentence, through a momentum copy of the head as well), are this part's first
reading of the paper, kept so that runs made with it resume and reproduce.

The momentum weights and the queue are state kept across steps: they are this module's parameters
(frozen) and buffers, so they are in the checkpoint and a resumed run continues with the very same
values. They are not part of a saved model (only the encoder is exported).
"""

from __future__ import annotations

import copy
import math

import torch
from torch import Tensor, nn

from csekit.core.distributed import gather_no_grad
from csekit.core.errors import CsekitError
from csekit.encoding.encoder import SentenceEncoder
from csekit.parts.hooks import MakesViews
from csekit.parts.step_state import StepState

QUEUE_HEADS = ("momentum", "online")
"""`queue_head`: a momentum copy of the training head, or the training head itself (without gradient)."""
MAX_QUEUE_SIZE = 65536
"""The longest queue csekit builds (MoCo's; ESimCSE's is 160 vectors): queue_size 1e12 allocated terabytes."""


class MomentumQueue(nn.Module):
    """ESimCSE's negatives: a queue of a momentum encoder's outputs for the preceding batches' sentences.

    momentum (lambda): 0.995 in the paper; queue_ratio: the queue's length in (global) batches, 2.5 in
    the paper (queue_size, when given, is the length itself); view: whose inputs the momentum encoder
    encodes (0, the sentence, in the authors' code; 1, the repeated sentence); queue_head: what maps its
    outputs, `online` (the training head, in eval mode and without gradient, as the authors' code) or
    `momentum` (a momentum copy of the head, updated like the encoder). `encoder`, `head` and `batch_size`
    (`train.batch_size`, the global batch) are build arguments.
    """

    #: The view options that index the step's inputs (not the training representations): checked at load.
    input_view_options = ("view",)

    def __init__(
        self,
        encoder: SentenceEncoder,
        head: nn.Module,
        batch_size: int | None = None,
        momentum: float = 0.995,
        queue_ratio: float = 2.5,
        queue_size: int | None = None,
        view: int = 1,
        queue_head: str = "momentum",
    ) -> None:
        super().__init__()
        if not 0.0 <= momentum <= 1.0:
            raise ValueError(f"option momentum must be in [0, 1] (got {momentum})")
        if queue_head not in QUEUE_HEADS:
            raise ValueError(f"option queue_head must be one of {', '.join(QUEUE_HEADS)} (got {queue_head!r})")
        if view < 0:
            raise ValueError(f"option view must be a view's index, 0 or more (got {view})")
        if isinstance(head, MakesViews):
            raise ValueError("negatives momentum_queue needs a head that maps each vector on its own (mlp or none)")
        if queue_size is None:
            if batch_size is None:
                raise ValueError("give queue_size, or the batch_size that queue_ratio counts in")
            if not 0 < queue_ratio <= MAX_QUEUE_SIZE:  # NaN too
                raise ValueError(f"option queue_ratio must be a number in (0, {MAX_QUEUE_SIZE}] (got {queue_ratio})")
            queue_size = math.floor(queue_ratio * int(batch_size))
        if not 1 <= queue_size <= MAX_QUEUE_SIZE:
            raise ValueError(
                f"the queue must hold from 1 to {MAX_QUEUE_SIZE} vectors (queue_size {queue_size}; the paper's is "
                "2.5 batches)"
            )
        self.momentum = float(momentum)
        self.view = view
        self.queue_head = queue_head
        self.momentum_encoder = copy.deepcopy(encoder).requires_grad_(False)
        # With queue_head online there is no copy of the head: the training head maps the outputs.
        self.momentum_head = copy.deepcopy(head).requires_grad_(False) if queue_head == "momentum" else None
        # The trained encoder and head, kept as plain attributes (not submodules: they are the model's own,
        # checkpointed there; nn.Module.to moves their parameters in place, so these stay the trained ones).
        object.__setattr__(self, "_online", (encoder, head))
        self.register_buffer("queue", torch.zeros(queue_size, encoder.dim))
        self.register_buffer("queued", torch.zeros((), dtype=torch.long))  # vectors in the queue so far
        self.register_buffer("pointer", torch.zeros((), dtype=torch.long))  # where the next one goes
        self.train(True)

    def check_loaded_state(self) -> None:
        """The queue's counters as a checkpoint gave them: within the queue (a negative or oversized count would
        silently drop or repeat negatives). Called by the checkpoint loader."""
        size = self.queue.shape[0]
        if not 0 <= int(self.queued) <= size or not 0 <= int(self.pointer) < size:
            raise ValueError(
                f"the momentum queue's counters (queued {int(self.queued)}, pointer {int(self.pointer)}) do not fit "
                f"its {size} places"
            )

    def train(self, mode: bool = True) -> MomentumQueue:
        """The momentum encoder and head always run without dropout (eval mode)."""
        super().train(mode)
        self.momentum_encoder.eval()
        if self.momentum_head is not None:
            self.momentum_head.eval()
        return self

    @torch.no_grad()
    def update_momentum(self, encoder: nn.Module, head: nn.Module) -> None:
        """theta_m <- lambda theta_m + (1 - lambda) theta_e, for the encoder (and the head's copy if any)."""
        pairs = [(encoder, self.momentum_encoder)]
        if self.momentum_head is not None:
            pairs.append((head, self.momentum_head))
        for online, target in pairs:
            for theta_e, theta_m in zip(online.parameters(), target.parameters(), strict=True):
                theta_m.mul_(self.momentum).add_(theta_e.detach().to(theta_m.dtype), alpha=1.0 - self.momentum)

    @torch.no_grad()
    def enqueue(self, vectors: Tensor) -> None:
        """First in, first out: the newest vectors overwrite the oldest (a batch longer than the queue: its end)."""
        size = self.queue.shape[0]
        vectors = vectors.detach().to(self.queue.dtype)[-size:]  # fp32 under bf16 autocast
        positions = (self.pointer + torch.arange(vectors.shape[0], device=self.queue.device)) % size
        self.queue[positions] = vectors.to(self.queue.device)
        self.pointer.copy_((self.pointer + vectors.shape[0]) % size)
        self.queued.copy_(torch.clamp(self.queued + vectors.shape[0], max=size))

    def queued_vectors(self) -> Tensor:
        """The queue's vectors so far [min(steps x N, size), d] (a copy: later enqueues do not change it)."""
        return self.queue[: int(self.queued)].clone()

    def forward(self, state: StepState) -> None:
        if self.view >= state.num_views:
            raise CsekitError(
                f"negatives momentum_queue: option view {self.view}, but the recipe's views make {state.num_views}"
            )
        if self.training:
            self.update_momentum(*self.__dict__["_online"])
        if int(self.queued) > 0:
            state.extra_negatives.append(self.queued_vectors())
        if self.training:
            self.enqueue(gather_no_grad(self.momentum_outputs(state)))

    @torch.no_grad()
    def momentum_outputs(self, state: StepState) -> Tensor:
        """The momentum encoder's vectors [n, d] for this step's view-`view` inputs, through `queue_head`."""
        output = state.encoder_output
        n = state.batch_size
        rows = slice(self.view * n, (self.view + 1) * n)
        inputs = {"input_ids": output.input_ids[rows], "attention_mask": output.attention_mask[rows]}
        pooled = self.momentum_encoder(inputs, token_states=False).pooled
        if self.momentum_head is not None:
            return self.momentum_head(pooled).float()
        head = self.__dict__["_online"][1]
        was_training = head.training
        head.eval()  # the authors' code runs this pass with model.eval()
        try:
            return head(pooled).float()
        finally:
            head.train(was_training)

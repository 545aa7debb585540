"""Cached contrastive steps (GradCache, Gao et al., 2021): any batch in the memory of a chunk, with the same update.

A contrastive step's memory is the encoder's activations for every row of the batch; its negatives
are the whole batch. With `run.chunk_size: c` a step keeps the whole batch's negatives but only c
rows of activations at a time, in three phases:

1. The model's forward runs as without chunks, except that every pass of the trained encoder (the
   model's own and any a part makes through `StepState.encoder`) goes through a `ChunkedEncoder`: it
   encodes c rows at a time keeping no activations, notes the random state each chunk starts from,
   and returns the representations (pooled vectors, and the last layer's token states where a part
   reads them) as leaf tensors. Everything after the encoder (head, negative sources, weighting,
   objectives, the cross-process gather) runs on the whole batch's representations as without chunks.
2. The loss is back-propagated. The head's and the objectives' parameters, and parameter terms (OssCSE's
   recall), get their gradients as without chunks; the representations' gradients stop at the leaves.
3. Each chunk is encoded again, with gradients, from the random state its first pass started from
   (dropout draws the same masks), and the cached gradients of its representations are back-propagated.

Rows of the encoder are independent, so the loss, every loss part and every gradient are those of the
unchunked step with the same random draws. The draws themselves follow the chunks (a dropout mask is
drawn per pass), so a chunked run is not bit-for-bit the unchunked run with the same seed, as a run on
another number of processes is not; it is the same training. The first pass runs with gradients on
(only the tensors autograd would save are dropped), so that code which branches on the grad mode (csekit's
CPU attention, PyTorch's choice of an attention kernel) runs the same way in both passes.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.distributed as dist
from accelerate import Accelerator
from torch import Tensor, nn
from torch.utils.checkpoint import get_device_states, set_device_states

from csekit.core.errors import CsekitError
from csekit.encoding.encoder import EncoderOutput, SentenceEncoder
from csekit.encoding.packed import split_layout
from csekit.encoding.passes import plan_of
from csekit.training.compute_copies import ComputeCopies

GRADIENT_BUCKET = 1 << 22
"""Gradient elements all-reduced in one message when several processes average a chunked step's gradients."""


def check_chunk_size(chunk_size: int | None, per_process_batch: int, processes: int) -> None:
    """A chunk must divide each process's share of the batch (so every chunk of the main pass is full)."""
    if chunk_size is None or per_process_batch % chunk_size == 0:
        return
    share = f"train.batch_size {per_process_batch * processes} over {processes} processes"
    divisors = [d for d in range(1, per_process_batch + 1) if per_process_batch % d == 0 and d <= chunk_size]
    raise CsekitError(
        f"recipe key run.chunk_size: {chunk_size} does not divide the per-process batch of {per_process_batch} "
        f"({share if processes > 1 else 'train.batch_size'}); choose a divisor, e.g. {divisors[-1]}"
    )


@dataclass
class RandomState:
    """The CPU and GPU generators' states at one moment, to replay what was drawn from there on."""

    cpu: Tensor
    devices: list[int]
    device_states: list[Tensor]

    @classmethod
    def capture(cls, tensors: Sequence[Tensor]) -> RandomState:
        """The state now, on the CPU and on the GPUs `tensors` live on."""
        devices, states = get_device_states(*tensors)
        return cls(torch.get_rng_state(), devices, states)

    @contextlib.contextmanager
    def replayed(self) -> Iterator[None]:
        """Inside the block the generators start from this state; afterwards they are as before it."""
        with torch.random.fork_rng(devices=self.devices):
            torch.set_rng_state(self.cpu)
            set_device_states(self.devices, self.device_states)
            yield


def _no_saved_tensor(tensor: Tensor) -> None:
    return None


def _no_backward(saved: None) -> Tensor:
    raise RuntimeError("a chunked step's first encoder pass keeps no activations; it cannot be back-propagated")


@dataclass
class CachedPass:
    """One call of the encoder in a step's first phase: its inputs, chunks, random states and leaf outputs."""

    inputs: dict[str, Tensor]
    chunks: list[Tensor]  # row indices of each chunk
    random_states: list[RandomState]
    pooled: Tensor  # leaf [B, d]; its .grad is the cached gradient
    token_states: Tensor | None  # leaf [B, L, d] when the caller asked for token states

    @property
    def has_gradient(self) -> bool:
        """Whether some part's loss depends on this pass (else it need not be encoded again)."""
        return self.pooled.grad is not None or (self.token_states is not None and self.token_states.grad is not None)

    def outputs_and_gradients(self, output: EncoderOutput, rows: Tensor) -> tuple[list[Tensor], list[Tensor]]:
        """The chunk's re-encoded outputs that received a gradient in phase 2, and those gradients."""
        tensors, grads = [], []
        if self.pooled.grad is not None:
            tensors.append(output.pooled)
            grads.append(self.pooled.grad[rows])
        if self.token_states is not None and self.token_states.grad is not None:
            tensors.append(output.token_states)
            grads.append(self.token_states.grad[rows])
        return tensors, grads


class ChunkedEncoder:
    """Stands in for the trained encoder during one chunked step: called, it encodes in chunks (phase 1);
    `backward()` re-encodes each chunk with gradients and back-propagates the cached gradients (phase 3).

    Parts see it as `StepState.encoder`; any other attribute (`backbone`, `tokenize`, ...) is the encoder's.
    A call with gradients off is passed straight to the encoder (nothing to back-propagate).
    """

    def __init__(
        self,
        encoder: SentenceEncoder,
        chunk_size: int,
        autocast: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
        after_backward: Callable[[], None] | None = None,
    ) -> None:
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be at least 1, got {chunk_size}")
        self.encoder = encoder
        self.chunk_size = chunk_size
        self.autocast = autocast  # phase 3 runs outside the model's forward: the same mixed precision again
        self.after_backward = after_backward  # compute copies fold each backward's gradients into fp32 masters
        self.passes: list[CachedPass] = []
        self.encoding = False  # inside one of this object's own encoder calls (see `only_chunked_encoding`)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.encoder, name)

    def __call__(self, inputs: dict[str, Tensor], token_states: bool = True) -> EncoderOutput:
        if not torch.is_grad_enabled():
            return self.encoder(inputs, token_states=token_states)
        inputs, _ = split_layout(inputs)  # it describes the whole batch, not a chunk's rows
        rows = inputs["attention_mask"].shape[0]
        _check_per_row(inputs, rows)
        chunks = list(self._row_order(inputs).split(self.chunk_size))
        states, pooled, token = [], [], []
        for index in chunks:
            part = {key: value[index] for key, value in inputs.items()}
            states.append(RandomState.capture(list(part.values())))
            with self._first_pass():
                output = self.encoder(part, token_states=token_states)
            pooled.append(output.pooled.detach())
            if token_states:
                token.append(output.token_states.detach())
        restore = torch.argsort(torch.cat(chunks))
        cached = CachedPass(
            inputs,
            chunks,
            states,
            torch.cat(pooled)[restore].requires_grad_(),
            torch.cat(token)[restore].requires_grad_() if token_states else None,
        )
        self.passes.append(cached)
        return EncoderOutput(cached.pooled, cached.token_states, inputs["attention_mask"], inputs["input_ids"])

    def _row_order(self, inputs: dict[str, Tensor]) -> Tensor:
        """Rows by token length when the encoder's passes run in length groups (chunks then carry little padding)."""
        mask = inputs["attention_mask"]
        if plan_of(self.encoder).length_group_size <= 0:
            return torch.arange(mask.shape[0], device=mask.device)
        return torch.argsort(mask.sum(dim=1), stable=True)

    @contextlib.contextmanager
    def _first_pass(self) -> Iterator[None]:
        """Gradients on (as in the second pass), but autograd keeps none of the tensors it would save."""
        self.encoding = True
        try:
            with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(_no_saved_tensor, _no_backward):
                yield
        finally:
            self.encoding = False

    def backward(self) -> None:
        """Phase 3: re-encode every chunk with its first pass's random state; back-propagate the cached gradients."""
        for cached in self.passes:
            if not cached.has_gradient:
                continue
            for rows, state in zip(cached.chunks, cached.random_states, strict=True):
                part = {key: value[rows] for key, value in cached.inputs.items()}
                with state.replayed(), self.autocast():
                    output = self.encoder(part, token_states=cached.token_states is not None)
                tensors, grads = cached.outputs_and_gradients(output, rows)
                torch.autograd.backward(tensors, grads)
                if self.after_backward is not None:
                    self.after_backward()
        self.passes.clear()

    @contextlib.contextmanager
    def only_chunked_encoding(self, model: nn.Module) -> Iterator[None]:
        """Inside the block, a pass of the trained encoder with gradients that does not come through this
        object (a part calling the encoder it was built with) is refused: it would hold the whole batch's
        activations, and its gradient would reach the encoder outside the chunks."""

        def refuse(module: nn.Module, args: Any, kwargs: Any) -> None:
            if torch.is_grad_enabled() and not self.encoding:
                culprit = _calling_part(model, self.encoder)
                raise CsekitError(
                    f"recipe key run.chunk_size: {culprit} runs the trained encoder itself with gradients, which "
                    "a chunked step cannot split; such a part must encode through StepState.encoder, "
                    "or train without run.chunk_size"
                )

        handle = self.encoder.register_forward_pre_hook(refuse, with_kwargs=True)
        try:
            yield
        finally:
            handle.remove()


def _check_per_row(inputs: dict[str, Tensor], rows: int) -> None:
    """Every input is per row (split into chunks along its first dimension) and a constant."""
    for key, value in inputs.items():
        if value.dim() == 0 or value.shape[0] != rows:
            raise CsekitError(
                f'run.chunk_size: the encoder input "{key}" ({list(value.shape)}) does not have one entry per '
                f"row ({rows} rows), so it cannot be split into chunks"
            )
        if value.requires_grad:
            raise CsekitError(
                f'run.chunk_size: the encoder input "{key}" carries gradients from before the encoder, which '
                "a chunked step cannot pass back; train this recipe without run.chunk_size"
            )


def _calling_part(model: nn.Module, encoder: nn.Module) -> str:
    """The recipe part whose forward is running now (for an error message), found on the call stack."""
    inside_encoder = {id(module) for module in encoder.modules()}
    names = {
        id(module): name.removeprefix("module.")  # DDP's wrapper adds "module."
        for name, module in model.named_modules()
        if name not in ("", "module") and id(module) not in inside_encoder
    }
    frame = inspect.currentframe()
    while frame is not None:
        owner = frame.f_locals.get("self")
        if id(owner) in names:
            return f"the part {names[id(owner)]} ({type(owner).__name__})"
        frame = frame.f_back
    return "a recipe part"


def cached_step(
    model: nn.Module,
    encoder: SentenceEncoder,
    batch: dict[str, Any],
    chunk_size: int,
    step: int = 0,
    steps_per_epoch: int | None = None,
    backward: Callable[[Tensor], None] = Tensor.backward,
    autocast: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
    after_backward: Callable[[], None] | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """One chunked step's loss and parts, back-propagated into the parameters' `.grad` (all three phases).

    `model` is the `ContrastiveModel` (possibly wrapped, e.g. by DDP) and `encoder` its trained encoder;
    `backward` back-propagates the loss (accelerate's, which scales an fp16 loss) and `autocast` gives the
    mixed precision the model's forward runs in; `after_backward` runs after each backward (phase 2's and each
    chunk's). `batch` is what `TrainCollator` makes.
    """
    chunked = ChunkedEncoder(encoder, chunk_size, autocast, after_backward)
    with chunked.only_chunked_encoding(model):
        loss, parts = model(
            batch["inputs"],
            batch["sentences"],
            batch["fields"],
            step=step,
            steps_per_epoch=steps_per_epoch,
            encoder=cast(SentenceEncoder, chunked),
        )
    backward(loss)
    if after_backward is not None:
        after_backward()
    chunked.backward()
    return loss, parts


def average_gradients(parameters: Sequence[nn.Parameter], processes: int) -> None:
    """Each gradient becomes its mean over the processes: DDP's all-reduce, done once after the whole step.

    DDP reduces a parameter's gradient when its backward pass produces it, and a chunked step produces
    it once per chunk, so the step runs under `no_sync` and averages here. Every process holds the same
    parameters in the same order; a missing gradient counts as zeros (as DDP's reduction would send).
    """
    trainable = [p for p in parameters if p.requires_grad]
    for parameter in trainable:
        if parameter.grad is None:
            parameter.grad = torch.zeros_like(parameter)
    bucket: list[nn.Parameter] = []
    size = 0
    for index, parameter in enumerate(trainable):
        bucket.append(parameter)
        size += parameter.numel()
        if size >= GRADIENT_BUCKET or index == len(trainable) - 1:
            flat = torch.cat([p.grad.reshape(-1) for p in bucket])  # type: ignore[union-attr]
            dist.all_reduce(flat)
            flat /= processes
            for p, values in zip(bucket, flat.split([p.numel() for p in bucket]), strict=True):
                p.grad.copy_(values.view_as(p))  # type: ignore[union-attr]
            bucket, size = [], 0


def chunked_forward_backward(
    accelerator: Accelerator,
    model: nn.Module,
    batch: dict[str, Any],
    chunk_size: int,
    step: int = 0,
    steps_per_epoch: int | None = None,
    copies: ComputeCopies | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The training loop's chunked step: `cached_step` under accelerate, gradients averaged over processes.

    With `copies` (`run.compute_copies`) the step runs on them, their gradients folded into the fp32 masters after
    each backward: the chunks' gradients add up in fp32, as autocast's do.
    """
    encoder = accelerator.unwrap_model(model).training_encoder()
    in_use = copies.in_use() if copies is not None else contextlib.nullcontext()
    fold = copies.fold if copies is not None else None
    with accelerator.no_sync(model), in_use:
        loss, parts = cached_step(
            model, encoder, batch, chunk_size, step, steps_per_epoch, accelerator.backward, accelerator.autocast, fold
        )
    if accelerator.num_processes > 1:
        average_gradients(list(model.parameters()), accelerator.num_processes)
    return loss, parts

"""Checks that the tests of several parts make alike, written once: gradients against a reference, a training step's
gradients against the same step's loss written out by hand, and views drawn from each batch's own generator."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import Tensor

from csekit.encoding.encoder import SentenceEncoder
from csekit.parts.views.dropout import DropoutViews
from csekit.training.model import ContrastiveModel


def gradients(parameters: Iterable[tuple[str, Tensor]]) -> dict[str, Tensor | None]:
    """Each named parameter's gradient (None where it has none), for `assert_same_gradients`."""
    return {name: parameter.grad for name, parameter in parameters}


def assert_same_gradients(
    ours: Iterable[tuple[str, Tensor]],
    theirs: Mapping[str, Tensor | None],
    rtol: float | None = None,
    atol: float | None = None,
    zero_is_none: bool = False,
) -> int:
    """Each of our named parameters has the gradient its name has in `theirs` to `rtol` and `atol` (torch's
    defaults when not given), and has one exactly where `theirs` has one; with `zero_is_none`, theirs may be all
    zeros where ours has none (a reference that fills unused gradients with zeros). Returns how many gradients
    were compared, for the caller to check that the comparison saw enough."""
    compared = 0
    for name, parameter in ours:
        their_grad = theirs[name]
        if parameter.grad is None:
            assert their_grad is None or (zero_is_none and not their_grad.any()), name
            continue
        assert their_grad is not None, name
        torch.testing.assert_close(parameter.grad, their_grad, rtol=rtol, atol=atol, msg=name)
        compared += 1
    return compared


def step_gradients(model: ContrastiveModel, sentences: list[str]) -> tuple[dict[str, Tensor | None], dict[str, Any]]:
    """One training step of `model` on dropout views of `sentences` after torch.manual_seed(1): the gradients it
    gives (copies), and the views; the model's gradients are zeroed after. A test then seeds 1 again, so that a state
    it makes from the same views draws the same dropout masks, and computes the step's loss by hand."""
    model.train()
    inputs = DropoutViews(model.encoder.tokenizer, model.encoder.pooler, 16)(sentences)
    torch.manual_seed(1)
    loss, _ = model(inputs, sentences)
    loss.backward()
    step = {name: None if p.grad is None else p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    assert any(grad is not None for grad in step.values()), "the model received gradients"
    return step, inputs


def assert_views_come_from_the_batch(
    views_class: Callable[..., Callable[[list[str]], dict[str, Tensor]]],
    encoder: SentenceEncoder,
    sentences: list[str],
    other_seed: int,
) -> None:
    """Views of `views_class` (on `encoder`, 32 tokens) draw a batch's views from the batch's own generator: the
    same views whatever the global generator's state, which they neither read nor advance; with `other_seed`,
    other views."""
    views = views_class(encoder.tokenizer, encoder.pooler, 32)
    torch.manual_seed(0)
    first = views(sentences)
    torch.manual_seed(1)
    before = torch.get_rng_state()
    again = views(sentences)
    assert torch.equal(before, torch.get_rng_state())  # the global generator is neither read nor advanced
    assert all(torch.equal(first[key], again[key]) for key in first)
    other = views_class(encoder.tokenizer, encoder.pooler, 32, seed=other_seed)
    assert not torch.equal(first["input_ids"], other(sentences)["input_ids"])

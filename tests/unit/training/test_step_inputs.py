"""A GPU step's inputs made without waiting for the device (issue #47, "Speed IV"), checked on a CPU.

The collator pads each key in one tensor, tokenises every sentence once for all views and sends the packing
layout along; the training pass gives the backbone a ready 4-D mask (transformers then never asks the host
whether a batch has padding); and on a CUDA device the loader pins, copies without a wait and collates in
worker processes. The step's host reads as a whole, loader included, are counted in tests/test_sync_free.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import WORDS, make_corpus, make_tiny_encoder, tiny_recipe
from torch import Tensor, nn

from csekit.data.corpus import TrainCollator
from csekit.encoding.encoder import SentenceEncoder
from csekit.encoding.packed import PACKING_LAYOUT, PackingLayout
from csekit.encoding.passes import PassPlan
from csekit.encoding.pooling import pad_ids
from csekit.encoding.ready_mask import ready_attention_mask
from csekit.parts.views.consert import ConsertViews
from csekit.parts.views.dropout import DropoutViews
from csekit.training import loading
from csekit.training.loading import LoaderOptions, loader_options

SENTENCES = [" ".join(WORDS[i : i + 1 + i % 7]) for i in range(12)]
"""Sentences of 1 to 7 words: rows of many lengths."""


def per_row_pad_ids(ids: dict[str, list[list[int]]], pad_token_id: int) -> dict[str, Tensor]:
    """`pad_ids` as it was: one tensor per row and key (the reference for its values)."""
    length = max((len(row) for row in ids["input_ids"]), default=0)
    batch = {}
    for key, values in ids.items():
        tensor = torch.full((len(values), length), pad_token_id if key == "input_ids" else 0, dtype=torch.long)
        for i, row in enumerate(values):
            tensor[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        batch[key] = tensor
    return batch


@contextlib.contextmanager
def counting_calls(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> Iterator[list[tuple[Any, ...]]]:
    """Inside the block every call of `owner.name` is recorded (its arguments), then passed on."""
    calls: list[tuple[Any, ...]] = []
    original = getattr(owner, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return original(*args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(owner, name, counted)
        yield calls


@pytest.mark.parametrize("rows", [[[5, 6, 7], [8], [], [9, 10, 11, 12, 13], [14, 15]], [[1, 2]], []])
def test_pad_ids_makes_one_tensor_a_key_with_the_per_row_forms_values(
    rows: list[list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = {
        "input_ids": rows,
        "attention_mask": [[1] * len(row) for row in rows],
        "token_type_ids": [[row_number % 2] * len(row) for row_number, row in enumerate(rows)],
    }
    with counting_calls(monkeypatch, torch, "tensor") as made:
        padded = pad_ids(ids, pad_token_id=3)
    expected = per_row_pad_ids(ids, pad_token_id=3)
    assert padded.keys() == expected.keys()
    for key, tensor in expected.items():
        assert padded[key].dtype == torch.long and torch.equal(padded[key], tensor), key
    assert len(made) <= 2 * len(ids)  # the rows' lengths and their values, per key: never one per row


def views_of(kind: str, encoder: SentenceEncoder) -> DropoutViews | ConsertViews:
    if kind == "dropout":
        return DropoutViews(encoder.tokenizer, encoder.pooler, max_length=12)
    return ConsertViews(encoder.tokenizer, encoder.pooler, 12, encoder.dim, encoder, augmentations=("none", "none"))


@pytest.mark.parametrize("pooler", ["cls", "mask"])
@pytest.mark.parametrize("kind", ["dropout", "consert"])
def test_views_tokenise_each_sentence_once_for_all_views(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, pooler: str
) -> None:
    encoder = make_tiny_encoder(tmp_path / "tokenizer", pooler=pooler)
    views = views_of(kind, encoder)
    views(SENTENCES[:2])  # the mask pooler tokenises its templates once, on its first batch
    with counting_calls(monkeypatch, type(encoder.tokenizer), "__call__") as calls:
        inputs = views(SENTENCES)
    assert [args[1] for args in calls] == [SENTENCES]  # one call, on the batch's sentences
    # The same ids as each view tokenised on its own (the prompt pooler's templates differ per view).
    tokenizer, view_dependent = encoder.tokenizer, encoder.pooler.view_dependent
    each = [encoder.pooler.encode_ids(tokenizer, SENTENCES, 12, view=v if view_dependent else 0) for v in range(2)]
    expected = pad_ids({key: each[0][key] + each[1][key] for key in each[0]}, tokenizer.pad_token_id or 0)
    for key, tensor in expected.items():
        assert torch.equal(inputs[key], tensor), key


def test_the_collator_sends_the_packing_layout_and_the_packed_pass_finds_nothing_on_the_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    encoder = make_tiny_encoder(tmp_path / "tokenizer")
    for module in encoder.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
    batch = TrainCollator(DropoutViews(encoder.tokenizer, encoder.pooler, max_length=12))(SENTENCES)
    inputs = batch["inputs"]
    layout = inputs[PACKING_LAYOUT]
    expected = PackingLayout.of(inputs["attention_mask"])
    assert torch.equal(layout.index, expected.index)
    assert torch.equal(layout.cumulative_lengths, expected.cumulative_lengths)
    assert layout.cumulative_lengths.dtype == torch.int32
    encoder.train()
    packed = PassPlan(packed=True, packed_required=True)
    with counting_calls(monkeypatch, torch.Tensor, "nonzero") as found, counting_calls(monkeypatch, torch, "nonzero"):
        pooled = encoder(inputs, token_states=False, plan=packed).pooled
    assert found == []  # the pass took the collator's layout
    without = {key: value for key, value in inputs.items() if key != PACKING_LAYOUT}
    torch.testing.assert_close(pooled, encoder(without, token_states=False, plan=packed).pooled, rtol=0, atol=0)
    assert layout.to("cpu", non_blocking=True).index is layout.index  # how accelerate moves it


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_the_training_pass_gives_the_backbone_a_ready_mask_and_never_asks_the_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, attention: str
) -> None:
    encoder = make_tiny_encoder(tmp_path / "tokenizer")
    encoder.backbone.set_attn_implementation(attention)
    for module in encoder.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
    encoder.train()
    inputs = encoder.tokenize(SENTENCES, max_length=12)
    with counting_calls(monkeypatch, torch.Tensor, "all") as asked, counting_calls(monkeypatch, torch, "all"):
        pooled = encoder(inputs).pooled
    assert asked == []  # transformers' `padding_mask.all()`: a wait for the device on a GPU
    mask = ready_attention_mask(encoder.backbone, inputs["attention_mask"])
    assert mask.dim() == 4 and mask.shape[0] == len(SENTENCES)
    theirs = encoder.backbone(**inputs).last_hidden_state[:, 0]  # transformers' mask from the 2-D one
    torch.testing.assert_close(pooled, theirs, rtol=0, atol=0)  # the same vectors, bit for bit


def test_a_backbone_without_a_known_mask_path_keeps_its_2d_mask(tmp_path: Path) -> None:
    encoder = make_tiny_encoder(tmp_path / "tokenizer", model_type="mpnet")
    mask = torch.ones(2, 3, dtype=torch.long)
    assert ready_attention_mask(encoder.backbone, mask) is mask


def test_on_a_gpu_the_loader_pins_copies_without_a_wait_and_collates_in_persistent_workers() -> None:
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert loader_options("auto", cuda, cores=16) == LoaderOptions(
        loading.AUTO_WORKERS, pin_memory=True, persistent_workers=True, non_blocking=True
    )
    assert loader_options("auto", cuda, cores=1) == LoaderOptions(0, True, False, True)  # no core to spare
    assert loader_options(3, cuda, cores=16) == LoaderOptions(3, True, True, True)
    # On a CPU, as before: batches in the main process, nothing pinned, the (no-op) copies as accelerate's default.
    assert loader_options("auto", cpu, cores=16) == LoaderOptions(0, False, False, False)
    assert loader_options(2, cpu, cores=16) == LoaderOptions(2, False, False, False)


def test_the_trainer_builds_its_loader_from_the_loader_options(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from test_sync_free import started_trainer

    corpus = make_corpus(tmp_path / "corpus.txt", lines=64)
    gpu_like = LoaderOptions(2, pin_memory=False, persistent_workers=True, non_blocking=True)  # no pinning on a CPU
    monkeypatch.setattr("csekit.training.execution.loader_options", lambda workers, device: gpu_like)
    with started_trainer(tiny_recipe(tiny_model_dir, corpus, "train.max_steps=2"), tmp_path / "run") as trainer:
        assert trainer.accelerator.dataloader_config.non_blocking
        base = trainer.loader.base_dataloader
        assert (base.num_workers, base.persistent_workers, base.pin_memory) == (2, True, False)


@pytest.mark.parametrize("scale", [1.0, float("inf")], ids=["finite", "infinite"])
def test_with_clipping_off_the_step_computes_the_norm_and_leaves_the_gradients_as_clipping_at_infinity(
    monkeypatch: pytest.MonkeyPatch, scale: float
) -> None:
    from accelerate import Accelerator

    from csekit.training.optimization import gradient_norm

    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    layers = [nn.Linear(8, 4), nn.Linear(8, 4)]
    layers[1].load_state_dict(layers[0].state_dict())
    for layer in layers:
        layer(torch.ones(3, 8)).sum().mul(scale).backward()
    old = accelerator.clip_grad_norm_(list(layers[0].parameters()), float("inf"))  # how the step clipped when off
    with counting_calls(monkeypatch, accelerator, "clip_grad_norm_") as clipped:
        new = gradient_norm(accelerator, list(layers[1].parameters()), None)
    assert clipped == []  # no pass that multiplies every gradient by 1.0
    torch.testing.assert_close(new, old, rtol=0, atol=0, equal_nan=True)
    if scale == 1.0:  # an infinite norm made clipping at infinity multiply by NaN; the step is skipped either way
        for before, after in zip(layers[0].parameters(), layers[1].parameters(), strict=True):
            torch.testing.assert_close(after.grad, before.grad, rtol=0, atol=0)
    with counting_calls(monkeypatch, accelerator, "clip_grad_norm_") as clipped:
        gradient_norm(accelerator, list(layers[1].parameters()), 1.0)
    assert len(clipped) == 1  # clipping on: as before

"""Chunked (cached) steps (`run.chunk_size`) give the unchunked step's loss, loss parts and gradients.

Each family is a shipped recipe run on the tiny stand-ins of `recipe_trace.tiny_overrides` (fp32, one thread).
Two references:

* without dropout, the plain unchunked step (`model(...)` then `loss.backward()`): the chunked step must
  give its loss, parts and gradients, so everything after the encoder runs as without chunks;
* with dropout, the unchunked step whose encoder passes are cut into the same chunks, all kept in one graph
  (one backward): the same masks are drawn in the same order, so if the chunked step's second pass did
  not replay its first pass's masks, its gradients would differ (`test_without_replay_...` shows they do).

Tolerance: loss and parts to 1e-5 relative or 1e-6 absolute (float32 rounding of logits of order
1/temperature = 20, where a loss near 0 is a small difference of such terms); every gradient element to
1e-4 relative plus 1e-5 of the largest gradient element (float32 products summed in another order; a
gradient that is zero in exact arithmetic, such as an attention key bias's, is float noise in both).

Where the loss is near 0 (views that differ only by whitening: WhitenedCSE's losses of about 1e-4) the
gradients are differences of nearly equal terms, and their float32 rounding error is itself about 1e-5 of
the largest element, larger on a CPU whose kernels sum in another order (AVX-512 against AVX2). So the
no-dropout comparison also measures that error: the same plain step in float64 (`float64_gradients`) is
the exact value to float32's eyes, the plain float32 step's largest deviation from it per parameter is
its rounding error e, and the chunked step, another float32 evaluation of the same function, may differ
from the plain one by its own error plus e. Per parameter each order's largest error varied up to 3x
between the two (measured over every family here, on a Zen 3 and a Zen 4), so the bound is
ROUNDING_MULTIPLE = 4 times e, used where it is larger than the fixed 1e-5 of the largest element.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import assert_one_line_error, make_corpus, read_metrics, run_cli, run_cli_in_this_process, tiny_recipe
from recipe_trace import RECIPES, TinyInputs, make_tiny_inputs, one_thread, tiny_overrides
from safetensors.torch import load_file
from torch import Tensor, nn

import csekit
from csekit.core.errors import CsekitError
from csekit.encoding.encoder import EncoderOutput, SentenceEncoder
from csekit.encoding.passes import ONE_PADDED_PASS, PassPlan
from csekit.parts.objectives import OBJECTIVES
from csekit.parts.step_state import StepState
from csekit.training.chunked import cached_step, chunked_forward_backward
from csekit.training.execution import build_run_model
from csekit.training.model import ContrastiveModel, load_encoder
from csekit.training.recipe import Recipe, load_recipe
from csekit.training.trainer import train

FAMILIES = {
    "simcse": "simcse-bert-base.yaml",
    "simcse-roberta": "simcse-roberta-base.yaml",
    "dclr": "dclr-bert-base.yaml",
    "dclr-authors-code": "dclr-bert-base-authors-code.yaml",
    "dclr-self-weighting": "dclr-ablation-self-weighting.yaml",
    "whitenedcse": "whitenedcse-bert-base.yaml",
    "whitenedcse-group": "whitenedcse-bert-base-group.yaml",
    "whitenedcse-pca": "whitenedcse-bert-base-pca.yaml",
    "whitenedcse-zca": "whitenedcse-bert-base-zca.yaml",
    "whitenedcse-positives": "whitenedcse-bert-base-positives.yaml",
    "slt-fai": "slt-fai-simcse.yaml",
    "slt-fai-consert": "slt-fai-consert-sts.yaml",
    "consert-views": "consert-views-minilm.yaml",
    "osscse": "osscse-bert-base.yaml",
    "combined": "combined-minilm.yaml",
    "esimcse": "esimcse-bert-base.yaml",
    "esimcse-roberta": "esimcse-roberta-base.yaml",
    "sncse": "sncse-bert-base.yaml",
    "sncse-roberta": "sncse-roberta-base.yaml",
    "promptbert": "promptbert-bert-base.yaml",
    "promptbert-roberta": "promptbert-roberta-base.yaml",
    "mixcse": "mixcse-bert-base.yaml",
    "rankcse": "rankcse-bert-base.yaml",
    "rankcse-listnet": "rankcse-listnet-bert-base.yaml",
}
BATCH = 8
ROUNDING_SENSITIVE = {"whitenedcse-pca"}
"""Families whose unchunked step is discontinuous in its rounding: PCA whitening of all 32 channels as one
group, whose running covariance after one batch (0.9 I + 0.1 of 8 rows' covariance) has one eigenvalue
repeated over 16 or more dimensions, takes the eigenvectors as the solver returns them (signs, and any basis
of the repeated eigenvalue), and the linear layer after it sees that basis: the float64 step gives another
loss (0.105 against 0.112), so there is no exact reference to bound the rounding by. It is compared with
chunks only against the reference that encodes in the same chunks (`test_chunked_step_replays_dropout`),
whose rounding is the same. (ZCA, whose matrix does not depend on the basis, is compared like the others.)"""
CHUNK = 3  # rows: 16 to 32 rows (2 to 4 views) in 6 to 11 chunks, the last one shorter
LOSS_RTOL, LOSS_ATOL = 1e-5, 1e-6
GRAD_RTOL, GRAD_ATOL_OF_LARGEST = 1e-4, 1e-5
ROUNDING_MULTIPLE = 4.0
ROUNDING_BOUND_OF_LARGEST = 2e-4
"""The largest rounding bound accepted: 3x the largest measured (6e-5 of the largest element, WhitenedCSE
and PromptBERT), so a bound from the float64 step can never grow to pass a step that really differs."""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TinyInputs:
    return make_tiny_inputs(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(autouse=True)
def single_thread() -> Iterator[None]:
    with one_thread():
        yield


def family_recipe(tiny: TinyInputs, family: str, *extra: str) -> Recipe:
    path = RECIPES / FAMILIES[family]
    return load_recipe(path, [*tiny_overrides(load_recipe(path), tiny), *extra])


def build(recipe: Recipe, seed: int = 0) -> tuple[ContrastiveModel, Any]:
    """The recipe's model, its backbone moved off its initial (recall's theta_0) weights so recall is not 0."""
    torch.manual_seed(seed)
    encoder = load_encoder(recipe)
    model, views = build_run_model(recipe, encoder)
    with torch.no_grad():
        for parameter in encoder.backbone.parameters():
            parameter.add_(0.02 * torch.randn_like(parameter))
    return model.train(), views


def make_batch(tiny: TinyInputs, views: Any, rows: slice = slice(0, BATCH), seed: int = 1) -> dict[str, Any]:
    """Sentences with a paraphrase and a negation each (OssCSE's margin reads them), through the recipe's views."""
    records = [json.loads(line) for line in tiny.osscse_corpus.read_text(encoding="utf-8").splitlines()]
    records = [record for record in records if record["paraphrase"] is not None][rows]
    sentences = [record["text"] for record in records]
    fields = {name: [record[name] for record in records] for name in ("paraphrase", "negation")}
    torch.manual_seed(seed)
    return {"inputs": views(sentences), "sentences": sentences, "fields": fields}


def plain_step(model: nn.Module, batch: dict[str, Any]) -> tuple[Tensor, dict[str, Tensor]]:
    loss, parts = model(batch["inputs"], batch["sentences"], batch["fields"])
    loss.backward()
    return loss, parts


def encode_in_chunks_with_one_graph(encoder: SentenceEncoder, chunk: int) -> None:
    """The reference: every training pass of `encoder` runs on `chunk` rows at a time, all in one autograd graph."""
    whole = encoder.forward

    def forward(inputs: dict[str, Tensor], token_states: bool = True, plan: PassPlan = ONE_PADDED_PASS):  # type: ignore[no-untyped-def]
        rows = inputs["attention_mask"].shape[0]
        outputs = [
            whole(
                {key: value[start : start + chunk] for key, value in inputs.items()},
                token_states=token_states,
                plan=plan,
            )
            for start in range(0, rows, chunk)
        ]
        states = [output.last_layer_states for output in outputs]
        return EncoderOutput(
            torch.cat([output.pooled for output in outputs]),
            torch.cat(states) if token_states else None,  # type: ignore[arg-type]
            inputs["attention_mask"],
            inputs["input_ids"],
        )

    encoder.forward = forward  # type: ignore[method-assign]


def gradients(model: nn.Module) -> dict[str, Tensor]:
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def assert_same_step(
    expected: tuple[Tensor, dict[str, Tensor]], actual: tuple[Tensor, dict[str, Tensor]], grads: tuple[dict, ...]
) -> None:
    (loss, parts), (chunked_loss, chunked_parts) = expected, actual
    assert chunked_loss.item() == pytest.approx(loss.item(), rel=LOSS_RTOL, abs=LOSS_ATOL)
    assert set(chunked_parts) == set(parts)
    for name, value in parts.items():
        assert chunked_parts[name].item() == pytest.approx(value.item(), rel=LOSS_RTOL, abs=LOSS_ATOL), name
    assert_same_gradients(*grads)


def assert_same_gradients(
    expected: dict[str, Tensor], actual: dict[str, Tensor], exact: dict[str, Tensor] | None = None
) -> None:
    """`actual` within rounding of `expected`; with `exact` (float64) gradients, of expected's own rounding too."""
    assert set(actual) == set(expected)
    largest = max(grad.abs().max().item() for grad in expected.values())
    assert largest > 0
    for name, grad in expected.items():
        atol = GRAD_ATOL_OF_LARGEST * largest
        if exact is not None:
            rounding = ROUNDING_MULTIPLE * (grad.double() - exact[name]).abs().max().item()
            assert rounding <= ROUNDING_BOUND_OF_LARGEST * largest, f"{name}: float32 rounding {rounding:.3g}"
            atol = max(atol, rounding)
        torch.testing.assert_close(actual[name], grad, rtol=GRAD_RTOL, atol=atol, msg=name)


def float64_gradients(tiny: TinyInputs, family: str, batch: dict[str, Any], loss: Tensor) -> dict[str, Tensor]:
    """The plain step's gradients computed in float64, the same draws made: the float32 steps' exact value.

    Its loss must equal the float32 loss to float32 rounding, else it is not the same computation (a draw
    or a discontinuity that went another way) and cannot bound the rounding.
    """
    recipe = family_recipe(tiny, family, "model.dropout=0.0")
    if recipe.model.head.get("name") == "whitening":  # its eigendecomposition would run in float32
        recipe = family_recipe(tiny, family, "model.dropout=0.0", "model.head.eigh_dtype=float64")
    model, _ = build(recipe)
    model.double()
    torch.manual_seed(2)
    exact_loss, _ = plain_step(model, batch)
    assert exact_loss.item() == pytest.approx(loss.item(), rel=LOSS_RTOL, abs=LOSS_ATOL)
    return gradients(model)


@pytest.mark.parametrize("family", [family for family in FAMILIES if family not in ROUNDING_SENSITIVE])
def test_chunked_step_equals_the_unchunked_step(tiny: TinyInputs, family: str) -> None:
    """No dropout: the chunked step against the plain one (the encoder in one pass, one backward)."""
    recipe = family_recipe(tiny, family, "model.dropout=0.0")
    plain, views = build(recipe)
    chunked, _ = build(recipe)
    batch = make_batch(tiny, views)
    torch.manual_seed(2)  # the parts' own draws (noise, channel permutations, masked words) alike
    expected = plain_step(plain, batch)
    torch.manual_seed(2)
    actual = cached_step(chunked, chunked.training_encoder(), batch, CHUNK)
    exact = float64_gradients(tiny, family, batch, expected[0])
    assert_same_step(expected, actual, (gradients(plain), gradients(chunked), exact))
    assert all(value.item() != 0 for value in expected[1].values())  # every part takes part (recall included)


def test_the_rounding_bound_fails_a_step_that_differs(tiny: TinyInputs) -> None:
    """The float64 bound lets rounding pass, not a difference of 5e-4 of the largest element in one gradient."""
    family = "whitenedcse-positives"  # the family with the widest rounding bound
    plain, views = build(family_recipe(tiny, family, "model.dropout=0.0"))
    batch = make_batch(tiny, views)
    torch.manual_seed(2)
    loss, _ = plain_step(plain, batch)
    expected, exact = gradients(plain), float64_gradients(tiny, family, batch, loss)
    largest = max(grad.abs().max().item() for grad in expected.values())
    changed = {name: grad.clone() for name, grad in expected.items()}
    changed["encoder.backbone.embeddings.token_type_embeddings.weight"][0, 0] += 5e-4 * largest
    assert_same_gradients(expected, {name: grad.clone() for name, grad in expected.items()}, exact)
    with pytest.raises(AssertionError, match="token_type_embeddings"):
        assert_same_gradients(expected, changed, exact)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_chunked_step_replays_dropout(tiny: TinyInputs, family: str) -> None:
    """With the recipe's dropout: the second pass of each chunk draws its first pass's masks."""
    recipe = family_recipe(tiny, family, "run.length_group_size=0", "model.dropout=0.1")
    reference, views = build(recipe)
    chunked, _ = build(recipe)
    encode_in_chunks_with_one_graph(reference.encoder, CHUNK)
    batch = make_batch(tiny, views)
    torch.manual_seed(2)
    expected = plain_step(reference, batch)
    torch.manual_seed(2)
    actual = cached_step(chunked, chunked.training_encoder(), batch, CHUNK)
    assert_same_step(expected, actual, (gradients(reference), gradients(chunked)))


PACKED_FAMILIES = ["simcse", "simcse-roberta", "slt-fai", "consert-views", "osscse", "combined"]
"""Every kind of encoder reader: cls and mask poolers, token states (SLT-FAI), ConSERT's embedding mask and
position ids, BERT and RoBERTa."""


def ran_packed(encoder: SentenceEncoder) -> tuple[list[int], torch.utils.hooks.RemovableHandle]:
    """The rank of what the first layer's feed-forward sees, a pass: 2 when packed ([T, d]), 3 when padded."""
    ranks: list[int] = []
    feed_forward = encoder.backbone.encoder.layer[0].intermediate
    return ranks, feed_forward.register_forward_pre_hook(lambda module, args: ranks.append(args[0].dim()))


def assert_packed_chunked_step_equals(
    tiny: TinyInputs, reference: ContrastiveModel, chunked: ContrastiveModel, views: Any
) -> None:
    """`chunked`'s cached step (packed passes seen) gives `reference`'s plain step: loss, parts, gradients."""
    batch = make_batch(tiny, views)
    torch.manual_seed(2)
    expected = plain_step(reference, batch)
    ranks, handle = ran_packed(chunked.encoder)
    torch.manual_seed(2)
    try:
        actual = cached_step(chunked, chunked.training_encoder(), batch, CHUNK)
    finally:
        handle.remove()
    assert 2 in ranks
    assert_same_step(expected, actual, (gradients(reference), gradients(chunked)))


@pytest.mark.parametrize("family", PACKED_FAMILIES)
def test_a_packed_chunked_step_equals_the_padded_unchunked_step(tiny: TinyInputs, family: str) -> None:
    """run.packed in a chunked step, no dropout: the padded unchunked step's loss, parts and gradients."""
    plain, views = build(family_recipe(tiny, family, "model.dropout=0.0", "run.packed=false"))
    chunked, _ = build(family_recipe(tiny, family, "model.dropout=0.0", "run.packed=true"))
    assert_packed_chunked_step_equals(tiny, plain, chunked, views)


@pytest.mark.parametrize("family", PACKED_FAMILIES)
def test_a_packed_chunked_step_replays_dropout(tiny: TinyInputs, family: str) -> None:
    """run.packed with dropout: each chunk's second packed pass draws its first pass's masks."""
    recipe = family_recipe(tiny, family, "run.length_group_size=0", "model.dropout=0.1", "run.packed=true")
    reference, views = build(recipe)
    chunked, _ = build(recipe)
    encode_in_chunks_with_one_graph(reference.encoder, CHUNK)
    assert_packed_chunked_step_equals(tiny, reference, chunked, views)


def test_without_replay_the_gradients_differ(tiny: TinyInputs, monkeypatch: pytest.MonkeyPatch) -> None:
    """The replay test can fail: with the second pass drawing new masks, the gradients are another step's."""
    from csekit.training import chunked as chunked_module

    recipe = family_recipe(tiny, "simcse", "run.length_group_size=0", "model.dropout=0.1")
    reference, views = build(recipe)
    chunked, _ = build(recipe)
    encode_in_chunks_with_one_graph(reference.encoder, CHUNK)
    batch = make_batch(tiny, views)
    torch.manual_seed(2)
    plain_step(reference, batch)
    monkeypatch.setattr(chunked_module.RandomState, "replayed", lambda self: torch.random.fork_rng())
    torch.manual_seed(2)
    cached_step(chunked, chunked.training_encoder(), batch, CHUNK)
    with pytest.raises(AssertionError):
        assert_same_gradients(gradients(reference), gradients(chunked))


@pytest.mark.parametrize("family", ["simcse", "dclr-authors-code", "whitenedcse", "slt-fai", "osscse", "combined"])
def test_weights_agree_after_optimizer_steps(tiny: TinyInputs, family: str) -> None:
    """Three steps with dropout on: the random streams stay in step too (the replay leaves them as it found them).

    SGD with momentum, whose update is linear in the gradients, so the weights agree as the gradients do.
    (AdamW divides each gradient by its own running size: where the exact gradient is 0, e.g. an attention
    key bias's, it turns float noise into steps of lr, in any two runs that round differently.)
    """
    recipe = family_recipe(tiny, family, "run.length_group_size=0", "model.dropout=0.1")
    reference, views = build(recipe)
    chunked, _ = build(recipe)
    encode_in_chunks_with_one_graph(reference.encoder, CHUNK)
    batches = [make_batch(tiny, views, slice(i * BATCH, (i + 1) * BATCH), seed=i) for i in range(3)]
    before = {name: p.detach().clone() for name, p in chunked.named_parameters()}
    for model, step in ((reference, plain_step), (chunked, None)):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        torch.manual_seed(2)
        for batch in batches:
            if step is not None:
                step(model, batch)
            else:
                cached_step(model, model.training_encoder(), batch, CHUNK)
            optimizer.step()
            optimizer.zero_grad()
    after = dict(chunked.named_parameters())
    # Whitening's inverse square root of the batch covariance amplifies float noise: 1.5e-6 after 3 steps
    # (an embedding weight of 0.018) with the authors' head initialisation, so the families with a
    # whitening head (the combined recipe has one) get 1e-5 here; 1.26e-6 was measured for the combined
    # family on a Zen 3 (AVX2).
    atol = 1e-5 if family in ("whitenedcse", "combined") else 1e-6
    for name, parameter in reference.named_parameters():
        torch.testing.assert_close(after[name], parameter, rtol=1e-5, atol=atol, msg=name)
    moved = [name for name, parameter in after.items() if not torch.equal(parameter, before[name])]
    assert "encoder.backbone.encoder.layer.0.attention.self.query.weight" in moved  # the steps did train


# --- 2 processes against 1 on the global batch (tests/test_distributed.py's pattern) ---------------------

DISTRIBUTED = ["simcse", "dclr", "whitenedcse", "osscse"]  # their parts draw the same on 2 processes as on 1


def distributed_worker(rank: int, world: int, port: int, tiny: TinyInputs, out: Path) -> None:
    """Every family of DISTRIBUTED on this rank's share, chunked, gradients averaged; rank 0 saves each family's
    mean loss and gradients (one pair of processes for all families: a process start costs seconds of imports)."""
    from csekit.training.chunked import average_gradients

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    results = {}
    for family in DISTRIBUTED:
        model, views = build(family_recipe(tiny, family, "model.dropout=0.0"))
        share = BATCH // world
        batch = make_batch(tiny, views, slice(rank * share, (rank + 1) * share))
        torch.manual_seed(2)
        loss, _ = cached_step(model, model.training_encoder(), batch, share // 2)
        average_gradients(list(model.parameters()), world)
        losses = [torch.zeros(1) for _ in range(world)]
        dist.all_gather(losses, loss.detach().reshape(1))
        results[family] = {"loss": torch.cat(losses).mean().item(), "grads": gradients(model)}
    if rank == 0:
        torch.save(results, out)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_chunked_processes(tmp_path_factory: pytest.TempPathFactory, tiny: TinyInputs) -> dict[str, Any]:
    """DISTRIBUTED's families on 2 chunked processes (distributed_worker), once for the module."""
    out = tmp_path_factory.mktemp("two-processes") / "two.pt"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.spawn(distributed_worker, args=(2, port, tiny, out), nprocs=2, join=True)
    return torch.load(out)


@pytest.mark.slow
@pytest.mark.parametrize("family", DISTRIBUTED)
def test_two_chunked_processes_equal_one_unchunked_process(
    tiny: TinyInputs, two_chunked_processes: dict[str, Any], family: str
) -> None:
    model, views = build(family_recipe(tiny, family, "model.dropout=0.0"))
    batch = make_batch(tiny, views)
    torch.manual_seed(2)
    loss, _ = plain_step(model, batch)
    two = two_chunked_processes[family]
    assert two["loss"] == pytest.approx(loss.item(), rel=LOSS_RTOL)
    assert_same_gradients(gradients(model), two["grads"])


# --- the training loop ----------------------------------------------------------------------------------


def train_in_a_fresh_process(recipe: Recipe, output: Path) -> tuple[list[float], dict[str, Tensor]]:
    """`csekit train` in its own interpreter (accelerate's precision is set once a process): losses, weights."""
    recipe_file = output.parent / f"{output.name}.yaml"
    recipe_file.write_text(recipe.to_yaml(), encoding="utf-8")
    result = run_cli("train", str(recipe_file), "--output", str(output), "--no-progress", cwd=output.parent)
    assert result.returncode == 0, result.stderr[-2000:]
    losses = [record["loss"] for record in read_metrics(output) if "loss" in record]
    return losses, load_file(output / "checkpoint" / "model.safetensors")


def test_training_with_chunks_follows_training_without(tmp_path: Path, tiny_model_dir: Path) -> None:
    """`csekit train` with run.chunk_size, through the loop's own step (accelerate, clipping, AdamW).

    The first step's loss is the same; AdamW then steps each weight by up to lr in the direction of its
    gradient's sign, which for gradients that are 0 in exact arithmetic is float noise: the weights agree
    to steps x lr (the model-level tests above compare gradients, and weights under SGD, tightly).
    """
    corpus = make_corpus(tmp_path / "corpus.txt", lines=64)
    common = ("train.max_steps=3", "train.precision=fp32", "model.dropout=0.0", "train.max_grad_norm=0.5")
    plain = train_in_a_fresh_process(tiny_recipe(tiny_model_dir, corpus, *common), tmp_path / "plain")
    chunked_recipe = tiny_recipe(tiny_model_dir, corpus, *common, "run.chunk_size=4")
    chunked = train_in_a_fresh_process(chunked_recipe, tmp_path / "chunked")
    assert len(chunked[0]) == len(plain[0]) == 3
    assert chunked[0] == pytest.approx(plain[0], rel=1e-4)
    assert chunked[0][0] == pytest.approx(plain[0][0], rel=LOSS_RTOL)
    assert set(chunked[1]) == set(plain[1])
    for name, weight in plain[1].items():
        torch.testing.assert_close(chunked[1][name], weight, rtol=0, atol=3 * chunked_recipe.train.lr, msg=name)


def test_resume_with_another_chunk_size_is_allowed_and_recorded(tmp_path: Path, tiny_model_dir: Path) -> None:
    """The chunk size changes a step's memory and time, not its update: no --allow-changes needed.

    Each run in its own interpreter: accelerate takes one precision a process, and other tests' differ.
    """
    corpus = make_corpus(tmp_path / "corpus.txt", lines=64)
    common = ("train.eval_every=1", "train.max_steps=2")
    run = tmp_path / "run"
    train_in_a_fresh_process(tiny_recipe(tiny_model_dir, corpus, "run.chunk_size=8", *common), run)

    def resume(*overrides: str) -> subprocess.CompletedProcess[str]:
        settings = [item for override in (*common, *overrides) for item in ("--set", override)]
        return run_cli("train", "--output", str(run), "--resume", "--no-progress", *settings, cwd=tmp_path)

    refused = resume("run.chunk_size=4", "train.max_steps=3")  # other keys are still refused
    assert refused.returncode == 2 and "recipe key train.max_steps" in refused.stderr
    resumed = resume("run.chunk_size=4")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    changed = [record for record in read_metrics(run) if record.get("event") == "recipe_changed"]
    assert changed == [{"event": "recipe_changed", "step": 2, "changes": {"run.chunk_size": [8, 4]}}]


# --- clear errors ---------------------------------------------------------------------------------------


def test_a_chunk_that_does_not_divide_the_batch_is_refused(tmp_path: Path, tiny_model_dir: Path) -> None:
    recipe = tiny_recipe(tiny_model_dir, make_corpus(tmp_path / "corpus.txt", lines=64), "run.chunk_size=6")
    path = tmp_path / "recipe.yaml"
    path.write_text(recipe.to_yaml(), encoding="utf-8")
    result = run_cli_in_this_process("train", str(path), "--output", str(tmp_path / "out"), cwd=tmp_path)
    assert_one_line_error(
        result.returncode, result.stderr, "run.chunk_size: 6 does not divide the per-process batch of 16", "e.g. 4"
    )
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("value", [0, 32])
def test_a_chunk_size_out_of_range_is_refused(tmp_path: Path, tiny_model_dir: Path, value: int) -> None:
    expected = r"--set run.chunk_size: recipe key run.chunk_size must be at least 1 and at most .*batch_size \(16\)"
    with pytest.raises(CsekitError, match=expected):
        tiny_recipe(tiny_model_dir, tmp_path / "corpus.txt", f"run.chunk_size={value}")


class EncodesByItself(nn.Module):
    """A part that runs the encoder it was built with, not `state.encoder`: a chunked step cannot split that."""

    def __init__(self, encoder: SentenceEncoder) -> None:
        super().__init__()
        self.held = [encoder]  # not a submodule

    def forward(self, state: StepState) -> dict[str, Tensor]:
        inputs = self.held[0].tokenize(state.sentences)
        return {"own_pass": self.held[0](inputs, token_states=False).pooled.pow(2).mean()}


@pytest.fixture
def encodes_by_itself() -> Iterator[None]:
    csekit.register_part("objective", "encodes_by_itself", EncodesByItself)
    yield
    OBJECTIVES.unregister("encodes_by_itself")


def test_a_part_that_runs_the_encoder_itself_is_refused_by_name(tiny: TinyInputs, encodes_by_itself: None) -> None:
    objectives = "[{name: infonce}, {name: encodes_by_itself}]"
    recipe = family_recipe(tiny, "simcse", f"objectives={objectives}")
    model, views = build(recipe)
    batch = make_batch(tiny, views)
    plain_step(model, batch)  # fine without chunks
    with pytest.raises(CsekitError, match=r"the part objectives\.1 \(EncodesByItself\) runs the trained encoder"):
        cached_step(model, model.training_encoder(), batch, CHUNK)


@pytest.mark.slow
def test_torchrun_trains_with_chunks_on_two_cpu_processes(tmp_path: Path, tiny_model_dir: Path) -> None:
    """The chunked step under DDP (no_sync, then one gradient average) in a real 2-process run."""
    from test_distributed import free_port, launch, logged_steps

    corpus = make_corpus(tmp_path / "corpus.txt", lines=64)
    recipe = tiny_recipe(tiny_model_dir, corpus, "train.max_steps=3", "run.chunk_size=4")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    torchrun += ["--master_port", str(free_port())]
    result = launch(torchrun, recipe, tmp_path / "out")
    assert result.returncode == 0, result.stderr[-2000:]
    assert logged_steps(tmp_path / "out") == (2, [1, 2, 3])


SINGULAR_BY_DESIGN = {"whitenedcse-bert-base-pca.yaml", "whitenedcse-bert-base-zca.yaml"}
"""One-group whitening of a tiny batch: its unchunked step alone moves by 3e-4 to 1e-3 when the batch's
row order changes (test_chunked_step_equals_the_unchunked_step leaves them out for the same reason)."""


@pytest.mark.parametrize(
    "recipe_file", sorted(p.name for p in RECIPES.glob("*.yaml") if p.name not in SINGULAR_BY_DESIGN)
)
def test_every_shipped_recipe_trains_the_same_with_chunks(
    tiny: TinyInputs, recipe_file: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Any recipe, the ones added after the chunked step included: 3 AdamW steps through the real training
    loop, in chunks of 4 rows, log the losses of the unchunked run (dropout off, LoRA's too: the float noise of a
    different summation order stays at rounding level)."""
    import csekit.training.optimization as optimization

    chunked_steps: list[int] = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        chunked_steps.append(1)
        return chunked_forward_backward(*args, **kwargs)

    monkeypatch.setattr(optimization, "chunked_forward_backward", counted)
    losses = {}
    for chunk in (None, 4):
        path = RECIPES / recipe_file
        extra = ["train.max_steps=3", "model.dropout=0.0", *([f"run.chunk_size={chunk}"] if chunk else [])]
        if load_recipe(path).model.lora:  # LoRA's adapters have a dropout of their own (0.05 in the llm2vec recipes)
            extra.append("model.lora.dropout=0.0")
        recipe = load_recipe(path, [*tiny_overrides(load_recipe(path), tiny), *extra])
        train(recipe, tmp_path / str(chunk), show_progress=False)
        losses[chunk] = [r["loss"] for r in read_metrics(tmp_path / str(chunk)) if "loss" in r]
    assert len(losses[4]) == 3 and len(chunked_steps) == 3  # the second run did take chunked steps
    assert losses[4] == pytest.approx(losses[None], rel=1e-4, abs=1e-6)

"""The padding-free encoder pass (`run.packed`, csekit/encoding/packed.py) against the padded pass.

Dropout off: every pooler's vectors, the token states and every parameter's gradient equal the padded
pass's (float32 sums in another order: 1e-5 on values, 1e-4 relative plus 1e-6 absolute on gradients), on
tiny BERT and RoBERTa models, and the feed-forward products saw real tokens only (so a pass that silently
ran padded fails). Dropout on: every dropout site drops a fraction p of what it sees (binomial tolerance).
The chunked (GradCache) step with packing is tested in tests/test_chunked.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import WORDS, make_tiny_encoder
from torch import Tensor, nn

import csekit.encoding.packed as packed_module
from csekit.core.errors import CsekitError
from csekit.encoding.encoder import SentenceEncoder
from csekit.encoding.fast_dropout import enable_fast_dropout
from csekit.encoding.packed import packing_refusal
from csekit.encoding.passes import EMBEDDING_MASK, PassPlan, PlannedEncoder
from csekit.training.execution import build_run_model, decide_execution
from csekit.training.recipe import load_recipe

POOLERS = ["cls", "mean", "first_last_avg", "mask", "mask_denoised", "pooler_output"]


def tiny_encoder(tmp_path: Path, model_type: str, pooler: str, dropout: float = 0.0) -> SentenceEncoder:
    """A tiny encoder of `model_type` with weights far enough from their start that rows differ."""
    encoder = make_tiny_encoder(tmp_path / model_type, pooler=pooler, model_type=model_type, initializer_range=0.2)
    for module in encoder.modules():
        if isinstance(module, nn.Dropout):
            module.p = dropout
    return encoder.train()


def mixed_inputs(encoder: SentenceEncoder, rows: int = 11, seed: int = 0) -> dict[str, Tensor]:
    rng = np.random.default_rng(seed)
    sentences = [" ".join(rng.choice(WORDS, size=int(rng.integers(1, 14)))) for _ in range(rows)]
    inputs = encoder.tokenize(sentences, max_length=40)
    assert inputs["attention_mask"].sum(dim=1).unique().numel() > 3  # rows of many lengths
    return inputs


def positions_of(feed_forward: torch.nn.Module) -> tuple[list[int], torch.utils.hooks.RemovableHandle]:
    """The number of positions `feed_forward` computes, one entry a pass (until the handle is removed)."""
    seen: list[int] = []
    handle = feed_forward.register_forward_pre_hook(lambda module, args: seen.append(args[0].shape[:-1].numel()))
    return seen, handle


def feed_forward_positions(encoder: SentenceEncoder) -> tuple[list[int], torch.utils.hooks.RemovableHandle]:
    """The number of positions the first layer's feed-forward computes, one entry a pass."""
    return positions_of(encoder.backbone.encoder.layer[0].intermediate)


def training_then_evaluation_positions(
    model: PlannedEncoder, feed_forward: torch.nn.Module, inputs: dict[str, Tensor]
) -> list[int]:
    """The positions `feed_forward` computes in a training pass of `model`, then in an evaluation pass (the
    encoder put in eval mode: one padded pass whatever the plan)."""
    seen, handle = positions_of(feed_forward)
    try:
        model(inputs)
        model.encoder.eval()
        model(inputs)
    finally:
        handle.remove()
    return seen


PACKED = PassPlan(packed=True, packed_required=True)
"""The packed pass, attention in one group."""


def run(
    encoder: SentenceEncoder, inputs: dict[str, Tensor], packed: bool, token_states: bool, group_rows: int = 0
) -> tuple[Tensor, Tensor | None, dict[str, Tensor], list[int]]:
    """Pooled vectors, real tokens' states, gradients of a loss on both, positions the feed-forward computed:
    one padded pass, or the packed pass (its attention in groups of `group_rows` rows; 0: one group)."""
    plan = PassPlan(packed=True, packed_required=True, length_group_size=group_rows) if packed else PassPlan()
    encoder.zero_grad(set_to_none=True)
    positions, handle = feed_forward_positions(encoder)
    try:
        output = encoder(inputs, token_states=token_states, plan=plan)
    finally:
        handle.remove()
    # Drawn on the CPU (the same weights on every device), then moved to the pass's device.
    weights = torch.randn(output.pooled.shape, generator=torch.Generator().manual_seed(1)).to(output.pooled.device)
    loss = (output.pooled * weights).sum()
    states = None
    if token_states:
        states = output.token_states * inputs["attention_mask"][..., None]
        loss = loss + states.pow(2).sum()
        states = states.detach()
    loss.backward()
    grads = {name: p.grad.clone() for name, p in encoder.named_parameters() if p.grad is not None}
    return output.pooled.detach(), states, grads, positions


def same_outputs_and_gradient_pairs(expected: tuple, actual: tuple) -> list[tuple[str, Tensor, Tensor]]:
    """Two `run` results: their vectors and token states agree to 1e-5 and they have gradients for the same
    parameters; each parameter's (name, expected gradient, actual gradient), for the caller's tolerance."""
    (pooled, states, grads, _), (other_pooled, other_states, other_grads, _) = expected, actual
    torch.testing.assert_close(other_pooled, pooled, rtol=1e-5, atol=1e-5)
    if states is not None:
        torch.testing.assert_close(other_states, states, rtol=1e-5, atol=1e-5)
    assert other_grads.keys() == grads.keys()
    return [(name, grad, other_grads[name]) for name, grad in grads.items()]


def assert_same(padded: tuple, packed: tuple, grad_atol: float = 1e-6) -> None:
    for name, grad, packed_grad in same_outputs_and_gradient_pairs(padded, packed):
        torch.testing.assert_close(packed_grad, grad, rtol=1e-4, atol=grad_atol, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("model_type", ["bert", "roberta"])
@pytest.mark.parametrize("pooler", POOLERS)
@pytest.mark.parametrize("token_states", [True, False])
def test_packed_pass_equals_the_padded_pass(tmp_path: Path, model_type: str, pooler: str, token_states: bool) -> None:
    """Same vectors, token states and gradients; the feed-forward computed real tokens only."""
    encoder = tiny_encoder(tmp_path, model_type, pooler)
    inputs = mixed_inputs(encoder)
    real, width = int(inputs["attention_mask"].sum()), inputs["input_ids"].numel()
    padded = run(encoder, inputs, packed=False, token_states=token_states)
    packed = run(encoder, inputs, packed=True, token_states=token_states)
    assert_same(padded, packed)
    assert padded[3][0] == width and packed[3][0] == real < width
    encoder.eval()  # evaluation and encode: the same vectors
    with torch.no_grad():
        expected = encoder(inputs, token_states=False).pooled
        packed_eval = encoder(inputs, token_states=False, plan=PACKED).pooled
        torch.testing.assert_close(packed_eval, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("model_type", ["bert", "roberta"])
@pytest.mark.parametrize("view", ["token_cutoff", "feature_cutoff", "shuffle"])
def test_consert_views_reach_the_packed_pass(tmp_path: Path, model_type: str, view: str) -> None:
    """An embedding mask ([B, L, 1] or [B, 1, d]) and shuffled position ids act as in the padded pass."""
    encoder = tiny_encoder(tmp_path, model_type, "mean")
    inputs = mixed_inputs(encoder)
    batch, width = inputs["input_ids"].shape
    generator = torch.Generator().manual_seed(3)
    if view == "token_cutoff":
        inputs[EMBEDDING_MASK] = (torch.rand(batch, width, 1, generator=generator) > 0.2).float()
    elif view == "feature_cutoff":
        inputs[EMBEDDING_MASK] = (torch.rand(batch, 1, encoder.dim, generator=generator) > 0.2).float()
    else:
        first = encoder.backbone.embeddings.padding_idx + 1 if model_type == "roberta" else 0
        lengths = inputs["attention_mask"].sum(dim=1)
        positions = torch.full((batch, width), first, dtype=torch.long)
        for row, length in enumerate(lengths.tolist()):
            positions[row, :length] = first + torch.randperm(length, generator=generator)
        inputs["position_ids"] = positions
    padded = run(encoder, inputs, packed=False, token_states=True)
    packed = run(encoder, inputs, packed=True, token_states=True)
    assert_same(padded, packed)
    assert packed[3] == [int(inputs["attention_mask"].sum())]
    plain = run(encoder, {key: inputs[key] for key in ("input_ids", "attention_mask")}, packed=True, token_states=True)
    assert not torch.allclose(plain[0], packed[0], atol=1e-4)  # the view changed the vectors


def test_positions_restart_in_every_row(tmp_path: Path) -> None:
    """A row's vector does not depend on the rows packed before it (RoBERTa numbers from padding_idx + 1)."""
    encoder = tiny_encoder(tmp_path, "roberta", "mean").eval()
    inputs = mixed_inputs(encoder)
    with torch.no_grad():
        together = encoder(inputs, plan=PACKED).pooled
        rows = [encoder({k: v[row : row + 1] for k, v in inputs.items()}, plan=PACKED).pooled for row in range(11)]
        alone = torch.cat(rows)
    torch.testing.assert_close(together, alone, rtol=1e-5, atol=1e-5)


def dropped_fraction(sites: list[tuple[Tensor, Tensor]]) -> tuple[float, int]:
    """Over (input, output) pairs of a dropout site: the fraction of non-zero inputs it zeroed, and their count."""
    seen = sum(int((before != 0).sum()) for before, _ in sites)
    dropped = sum(int(((before != 0) & (after == 0)).sum()) for before, after in sites)
    return dropped / seen, seen


@pytest.mark.parametrize("model_type", ["bert", "roberta"])
@pytest.mark.parametrize("pooler", ["cls", "mean"])
def test_attention_in_length_groups_equals_the_padded_pass(
    tmp_path: Path, model_type: str, pooler: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a CPU the packed pass attends in groups of `length_group_size` rows sorted by length (11 rows in
    groups of 4: three groups, the last one short): the padded pass's vectors, states and gradients."""
    encoder = tiny_encoder(tmp_path, model_type, pooler)
    inputs = mixed_inputs(encoder)
    widths: list[list[int]] = []
    gather = packed_module.AttentionGroups.gather

    def recording_gather(self: packed_module.AttentionGroups, packed: Tensor) -> list[Tensor]:
        grouped = gather(self, packed)
        widths.append([tensor.shape[1] for tensor in grouped])
        return grouped

    monkeypatch.setattr(packed_module.AttentionGroups, "gather", recording_gather)
    padded = run(encoder, inputs, packed=False, token_states=True)
    packed = run(encoder, inputs, packed=True, token_states=True, group_rows=4)
    assert_same(padded, packed, grad_atol=1e-5)  # other score-matrix shapes: other float rounding
    lengths = sorted(inputs["attention_mask"].sum(dim=1).tolist())
    assert widths and all(w == [lengths[3], lengths[7], lengths[10]] for w in widths)  # each group's longest row


@pytest.mark.parametrize("model_type", ["bert", "roberta"])
@pytest.mark.parametrize("fast", [False, True])
@pytest.mark.parametrize("group_rows", [0, 16])
def test_every_dropout_site_drops_p_in_the_packed_pass(
    tmp_path: Path, model_type: str, fast: bool, group_rows: int
) -> None:
    """Hidden dropout (module sites) and attention-probability dropout each drop a fraction p.

    Attention's site is read through its output: with zero query weights every real key gets weight 1/n and
    with values all 1, a context element is (kept keys / n) / (1 - p), so its mean is (1 - dropped) / (1 - p).
    Tolerance: 5 binomial standard deviations of the count measured (or of the rows' keys for attention).
    """
    p = 0.25
    encoder = tiny_encoder(tmp_path, model_type, "mean", dropout=p)
    if fast:
        assert enable_fast_dropout(encoder.backbone)  # csekit's CPU masks and attention function
    attention = encoder.backbone.encoder.layer[0].attention.self
    with torch.no_grad():
        attention.query.weight.zero_()
        attention.query.bias.zero_()
        attention.value.weight.zero_()
        attention.value.bias.fill_(1.0)
    sites: dict[str, list[tuple[Tensor, Tensor]]] = {}
    contexts: list[Tensor] = []
    handles = [
        module.register_forward_hook(lambda m, args, out, n=name: sites.setdefault(n, []).append((args[0], out)))
        for name, module in encoder.backbone.named_modules()
        if isinstance(module, nn.Dropout) and name != "encoder.layer.0.attention.self.dropout"
    ]
    output_block = encoder.backbone.encoder.layer[0].attention.output
    handles.append(output_block.register_forward_pre_hook(lambda m, args: contexts.append(args[0].detach())))
    inputs = mixed_inputs(encoder, rows=64, seed=4)
    real = int(inputs["attention_mask"].sum())
    try:
        with torch.no_grad():  # the sites' rates do not depend on gradients; hooks then keep no graph
            # attention in one padded group, or in length groups of 16 rows
            encoder(inputs, plan=PassPlan(packed=True, packed_required=True, length_group_size=group_rows))
    finally:
        for handle in handles:
            handle.remove()
    assert len(sites) == 1 + 2 * encoder.backbone.config.num_hidden_layers  # embeddings, two a layer
    for name, recorded in sites.items():
        fraction, count = dropped_fraction(recorded)
        assert abs(fraction - p) < 5 * (p * (1 - p) / count) ** 0.5, (name, fraction)
        if not name.startswith("embeddings"):
            assert recorded[0][0].shape[0] == real  # hidden dropout on real tokens only
    (context,) = contexts
    heads = attention.num_attention_heads
    draws = float((inputs["attention_mask"].sum(dim=1) ** 2).sum()) * heads  # one mask element per query and key
    dropped = 1 - float(context.mean()) * (1 - p)
    assert context.shape[0] == real
    assert abs(dropped - p) < 5 * (p * (1 - p) / draws) ** 0.5 + 0.01, dropped


def test_auto_runs_packed_only_where_measured_faster_and_supported(tmp_path: Path) -> None:
    """run.packed: auto packs CPU training passes only (measured faster there), never evaluation's, and true
    refuses an input the packed pass does not know where auto runs it padded."""
    encoder = tiny_encoder(tmp_path, "bert", "mean")
    inputs = mixed_inputs(encoder)
    plans = {
        (value, kind): decide_execution(load_recipe(None, [f"run.packed={value}"]), device_type=kind).pass_plan(
            encoder.backbone
        )
        for value in ("auto", "true", "false")
        for kind in ("cpu", "cuda")
    }
    assert plans["auto", "cpu"].packs(inputs) and not plans["auto", "cuda"].packs(inputs)  # not measured on a GPU
    assert plans["true", "cuda"].packs(inputs) and not plans["false", "cpu"].packs(inputs)
    assert not plans["auto", "cpu"].packs({**inputs, "labels": inputs["input_ids"]})  # runs padded
    with pytest.raises(CsekitError, match=r"run\.packed"):
        plans["true", "cpu"].packs({**inputs, "labels": inputs["input_ids"]})
    encoder.train()
    model = PlannedEncoder(encoder, plans["auto", "cpu"])
    widths = training_then_evaluation_positions(model, encoder.backbone.encoder.layer[0].intermediate, inputs)
    real, width = int(inputs["attention_mask"].sum()), inputs["attention_mask"].numel()
    assert widths == [real, width]


@pytest.mark.parametrize("model_type", ["mpnet", "distilbert", "electra"])
def test_other_architectures_are_refused_under_true_and_run_padded_under_auto(
    tmp_path: Path, tiny_model_dir: Path, model_type: str
) -> None:
    encoder = make_tiny_encoder(tmp_path / model_type, pooler="mean", model_type=model_type).train()
    assert packing_refusal(encoder.backbone) is not None
    auto = decide_execution(load_recipe(None, ["run.packed=auto"]), device_type="cpu")
    assert not auto.pass_plan(encoder.backbone).packed  # auto would pack a BERT here
    recipe = load_recipe(None, [f"model.backbone={tiny_model_dir}", "run.packed=true"])
    with pytest.raises(CsekitError, match=r"recipe key run\.packed: true: .*supports bert and roberta"):
        build_run_model(recipe, encoder)


def test_the_recipe_key_takes_auto_true_or_false(tiny_model_dir: Path) -> None:
    for value, expected in (("auto", "auto"), ("true", True), ("false", False)):
        recipe = load_recipe(None, [f"model.backbone={tiny_model_dir}", f"run.packed={value}"])
        assert recipe.run.packed == expected
        model, _ = build_run_model(recipe, SentenceEncoder.load(tiny_model_dir))
        assert model.plan.packed == (expected is not False)  # auto: on for CPU training
    with pytest.raises(CsekitError, match=r"run\.packed must be auto, true or false"):
        load_recipe(None, [f"model.backbone={tiny_model_dir}", "run.packed=always"])


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the flash kernel's variable-length form needs CUDA")
@pytest.mark.parametrize("model_type", ["bert", "roberta"])
def test_on_cuda_the_flash_pass_equals_the_padded_pass_and_drops_attention_at_p(
    tmp_path: Path, model_type: str
) -> None:
    """bf16 under autocast (the flash kernel's precision): values and gradients to bf16 rounding, then the
    attention-probability dropout rate read as in `test_every_dropout_site_drops_p_in_the_packed_pass`."""
    encoder = tiny_encoder(tmp_path, model_type, "mean").cuda()
    inputs = {key: value.cuda() for key, value in mixed_inputs(encoder).items()}
    with torch.autocast("cuda", dtype=torch.bfloat16):
        padded = run(encoder, inputs, packed=False, token_states=True)
        packed = run(encoder, inputs, packed=True, token_states=True)
    torch.testing.assert_close(packed[0], padded[0], rtol=2e-2, atol=2e-2)
    for name, grad in padded[2].items():
        scale = float(grad.abs().max()) + 1e-6
        torch.testing.assert_close(packed[2][name], grad, rtol=5e-2, atol=5e-2 * scale, msg=name)
    p = 0.25
    attention = encoder.backbone.encoder.layer[0].attention.self
    attention.dropout.p = p
    with torch.no_grad():
        attention.query.weight.zero_()
        attention.query.bias.zero_()
        attention.value.weight.zero_()
        attention.value.bias.fill_(1.0)
    contexts: list[Tensor] = []
    output_block = encoder.backbone.encoder.layer[0].attention.output
    handle = output_block.register_forward_pre_hook(lambda m, args: contexts.append(args[0].float()))
    inputs = {key: value.cuda() for key, value in mixed_inputs(encoder, rows=256, seed=4).items()}
    try:
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            encoder(inputs)
    finally:
        handle.remove()
    dropped = 1 - float(contexts[0].mean()) * (1 - p)
    assert abs(dropped - p) < 0.02, dropped

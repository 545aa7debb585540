"""One fused query/key/value product (`run.fused_qkv`) and the packed pass on fixed shapes (`run.packed_bucket`).

Both must change nothing but float rounding: against the unfused, unbucketed packed pass (which
tests/test_packed.py checks against the padded pass), dropout off, fp32, the vectors, token states and every
parameter's gradient agree to 1e-5 (values) and 1e-5 of each gradient's largest entry plus 1e-6 (sums
in another order). The bucketed pass's layer stack sees token counts that are multiples of the bucket, few of
them over many random batches, and the aot_eager compile of that stack (the capture `run.compile` makes, run
by eager kernels, as tests/test_compiled.py does on a CPU) runs without a graph break and equals eager.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import WORDS, TinyTrainer
from pass_reference import pass_results
from test_packed import POOLERS, mixed_inputs, same_outputs_and_gradient_pairs, tiny_encoder
from torch import Tensor

import csekit.training.compiled as compiled
from csekit.core.errors import CsekitError
from csekit.encoding.encoder import SentenceEncoder
from csekit.encoding.packed_fixed import bucket_tokens, padding_rows, run_layer_stack
from csekit.encoding.passes import PassPlan
from csekit.training.execution import decide_execution
from csekit.training.recipe import load_recipe

UNFUSED = PassPlan(packed=True, packed_required=True)
FUSED = PassPlan(packed=True, packed_required=True, fused_qkv=True)


def bucketed(bucket: int = 16, width_bound: int = 40, fused: bool = False, stack=None) -> PassPlan:  # type: ignore[no-untyped-def]
    return PassPlan(
        packed=True, packed_required=True, fused_qkv=fused, token_bucket=bucket, width_bound=width_bound,
        layer_stack=stack,
    )  # fmt: skip


def assert_same(expected: tuple, actual: tuple) -> None:
    for name, grad, other_grad in same_outputs_and_gradient_pairs(expected, actual):
        if name.endswith("key.bias"):  # zero in exact arithmetic (softmax ignores a shift of every score): noise
            continue
        # A bias's gradient sums one term a token (about 350 here), with cancellation: the two passes add them in
        # other orders, so fp32 rounding reaches 4e-5 of the largest on an AVX2-only Zen 3 (1e-5 held on a Zen 4).
        scale = float(grad.abs().max())
        torch.testing.assert_close(other_grad, grad, rtol=0, atol=1e-4 * scale + 1e-6, msg=name)


@pytest.mark.parametrize("model_type", ["bert", "roberta"])
@pytest.mark.parametrize("token_states", [True, False])
def test_the_fused_product_gives_the_unfused_vectors_and_gradients(
    tmp_path: Path, model_type: str, token_states: bool
) -> None:
    encoder = tiny_encoder(tmp_path, model_type, "cls")
    names_before = list(encoder.state_dict())
    inputs = mixed_inputs(encoder)
    layer = encoder.backbone.encoder.layer[0].attention.self
    calls: list[str] = []
    handles = [
        getattr(layer, name).register_forward_pre_hook(lambda module, args, name=name: calls.append(name))
        for name in ("query", "key", "value")
    ]
    unfused = pass_results(encoder, inputs, UNFUSED, token_states)
    assert calls == ["query", "key", "value"]
    fused = pass_results(encoder, inputs, FUSED, token_states)
    for handle in handles:
        handle.remove()
    assert calls == ["query", "key", "value"]  # the fused pass called no projection module: one product instead
    assert_same(unfused, fused)
    for name in ("query", "key", "value"):  # gradients reach the original parameters, which the optimizer steps
        assert f"backbone.encoder.layer.0.attention.self.{name}.weight" in fused[2]
        assert f"backbone.encoder.layer.1.attention.self.{name}.bias" in fused[2]
    assert list(encoder.state_dict()) == names_before  # saved weights keep BERT's layout


@pytest.mark.parametrize("model_type", ["bert", "roberta"])
@pytest.mark.parametrize("pooler", POOLERS)
@pytest.mark.parametrize("token_states", [True, False])
def test_the_bucketed_pass_gives_the_unbucketed_vectors_and_gradients(
    tmp_path: Path, model_type: str, pooler: str, token_states: bool
) -> None:
    encoder = tiny_encoder(tmp_path, model_type, pooler)
    inputs = mixed_inputs(encoder)
    real = int(inputs["attention_mask"].sum())
    plain = pass_results(encoder, inputs, UNFUSED, token_states)
    for bucket, width_bound, fused in ((17, 40, False), (64, 8, True), (real, 40, False)):
        fixed = pass_results(encoder, inputs, bucketed(bucket, width_bound, fused), token_states)
        assert_same(plain, fixed)
        assert fixed[3][0] == (bucket_tokens(real, bucket), encoder.dim) and fixed[3][0][0] % bucket == 0
    assert plain[3][0][0] == real and (real % 17 or real % 64)  # a bucket padded something


def random_batch(encoder: SentenceEncoder, rng: np.random.Generator, rows: int = 24) -> dict[str, Tensor]:
    sentences = [" ".join(rng.choice(WORDS, size=int(rng.integers(1, 14)))) for _ in range(rows)]
    return encoder.tokenize(sentences, max_length=16)


def test_random_batches_fall_in_few_buckets_and_the_compiled_stack_equals_eager(tmp_path: Path) -> None:
    """Over 12 random batches the unbucketed pass sees about as many token counts as batches, the bucketed one
    a few multiples of the bucket; the row layout's shape never changes; the aot_eager-compiled stack captures
    the whole stack (no graph break), compiles once a bucket and gives eager's vectors and gradients."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    encoder = tiny_encoder(tmp_path, "bert", "cls")
    bucket, rng = 64, np.random.default_rng(0)
    batches = [random_batch(encoder, rng) for _ in range(12)]
    torch._dynamo.reset()
    counters.clear()
    frames: list[int] = []

    def counting_backend(graph, example_inputs):  # type: ignore[no-untyped-def]
        frames.append(1)
        return torch._dynamo.backends.registry.lookup_backend("aot_eager")(graph, example_inputs)

    stack = compiled.compile_layer_stack("default", backend=counting_backend)
    layouts: set[tuple[int, ...]] = set()

    def recording_stack(layers, hidden, rows, *rest):  # type: ignore[no-untyped-def]
        layouts.add(tuple(rows.cumulative_lengths.shape))
        return run_layer_stack(layers, hidden, rows, *rest)

    plain_counts, bucket_counts = set(), set()
    for inputs in batches:
        plain = pass_results(encoder, inputs, UNFUSED, False)
        eager = pass_results(encoder, inputs, bucketed(bucket, 16, stack=recording_stack), False)
        ours = pass_results(encoder, inputs, bucketed(bucket, 16, stack=stack), False)
        assert_same(eager, ours)
        assert_same(plain, eager)
        plain_counts.add(plain[3][0][0])
        bucket_counts.add(eager[3][0][0])
    assert len(plain_counts) >= 8 and len(bucket_counts) <= 3
    assert all(count % bucket == 0 for count in bucket_counts)
    assert layouts == {(24 + padding_rows(bucket, 16) + 1,)}  # 24 rows, the padding rows, the start
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert 1 <= len(frames) <= len(bucket_counts)


def test_the_recipe_keys_reach_the_plan_and_compile_captures_a_bucketed_packed_pass(tiny_model_dir: Path) -> None:
    defaults = decide_execution(load_recipe(None), device_type="cpu").pass_plan(torch.nn.Module())
    assert not defaults.fused_qkv and defaults.token_bucket == 0 and defaults.layer_stack is None  # off on a CPU
    with pytest.raises(CsekitError, match=r"run\.fused_qkv"):
        load_recipe(None, ["run.fused_qkv=1"])
    recipe = load_recipe(None, ["run.fused_qkv=true", "run.packed_bucket=256", "model.max_length=24"])
    encoder = SentenceEncoder.load(tiny_model_dir)
    plan = decide_execution(recipe, device_type="cpu").pass_plan(encoder.backbone, recipe.model.max_length)
    assert plan.packed and plan.fused_qkv and (plan.token_bucket, plan.width_bound) == (256, 24)
    assert plan.layer_stack is None
    compiled_recipe = load_recipe(None, ["run.packed=true", "run.compile=default", "run.packed_bucket=256"])
    plan = decide_execution(compiled_recipe, device_type="cpu").pass_plan(encoder.backbone, 32)
    assert plan.packed and plan.layer_stack is not None
    auto = load_recipe(None, ["run.compile=default", "run.packed_bucket=256"])
    assert decide_execution(auto, device_type="cpu").pass_plan(encoder.backbone, 32).packed  # auto packs too
    with pytest.raises(CsekitError, match=r"run\.packed_bucket"):
        load_recipe(None, ["run.packed=true", "run.compile=default"])
    with pytest.raises(CsekitError, match=r"run\.packed_bucket"):
        load_recipe(None, ["run.packed_bucket=-1"])


def test_a_compiled_bucketed_packed_run_gives_the_eager_losses(
    train_tiny: TinyTrainer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trainer's real loop: run.compile (aot_eager) on the bucketed packed pass, against the same pass
    eager and the unbucketed packed pass (dropout off, so the three draw no masks)."""
    monkeypatch.setattr(compiled, "COMPILE_BACKEND", "aot_eager")
    base = ("model.dropout=0.0", "run.packed=true", "run.fused_qkv=true")
    runs = {
        "packed": (),
        "bucketed": ("run.packed_bucket=64",),
        "compiled": ("run.packed_bucket=64", "run.compile=default"),
    }
    losses = {}
    for name, extra in runs.items():
        losses[name] = [r["loss"] for r in train_tiny(*base, *extra, name=name).losses]
    assert len(losses["packed"]) == 3
    assert losses["bucketed"] == pytest.approx(losses["packed"], rel=1e-5)
    assert losses["compiled"] == pytest.approx(losses["bucketed"], rel=1e-5)

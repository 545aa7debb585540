"""The compiled encoder pass (run.compile): length buckets, eager losses, exact resume, fused layers.

Inductor builds C++ for each graph, which takes minutes for a whole model on the 2-core development
machine; the training tests use the aot_eager backend (the same TorchDynamo capture and AOT autograd
graphs, run by eager kernels), and one test compiles a layer's position-wise blocks with inductor.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import TinyTrainer, make_tiny_encoder
from resumed_runs import crashed_and_resumed
from transformers import BertConfig
from transformers.models.bert.modeling_bert import BertLayer

import csekit.training.compiled as compiled
from csekit.core.errors import CsekitError
from csekit.training.compiled import CompiledTrainingForward, bucket_width, pad_to_bucket
from csekit.training.recipe import load_recipe


def test_buckets_bound_the_widths() -> None:
    assert [bucket_width(n) for n in (16, 32, 64, 65, 512)] == [8, 8, 8, 16, 64]
    for max_length in (32, 128, 512):
        widths = {-w % bucket_width(max_length) + w for w in range(1, max_length + 1)}
        assert len(widths) <= compiled.MAX_BUCKETS and max(widths) == max_length


def test_padded_to_a_bucket_and_cut_back_the_states_are_the_unpadded_ones(tmp_path: Path) -> None:
    encoder = make_tiny_encoder(tmp_path / "tokenizer", pooler="mean")
    backbone = encoder.backbone.train()
    for module in backbone.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    inputs = encoder.tokenize(["a man plays the guitar", "a dog"])
    assert inputs["attention_mask"].shape[1] % 8 != 0
    padded, width = pad_to_bucket(dict(inputs), 8, 0)
    assert width == inputs["attention_mask"].shape[1] and padded["input_ids"].shape[1] % 8 == 0
    wrapper = CompiledTrainingForward(backbone, "default", 8, backend="eager")
    wrapper.compiled = wrapper.eager  # the bucketing alone, without the compiler
    plain = backbone(**inputs, output_hidden_states=True)
    bucketed = wrapper(**inputs, output_hidden_states=True)
    assert bucketed.last_hidden_state.shape == plain.last_hidden_state.shape
    for ours, theirs in zip(bucketed.hidden_states, plain.hidden_states, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])  # a boolean and an additive 4-D mask
def test_a_ready_4d_mask_is_padded_to_the_bucket_with_its_positions(tmp_path: Path, attention: str) -> None:
    """The training pass gives the backbone a ready 4-D mask [B, 1, L, L] (encoding/ready_mask.py): its width
    is read from the ids, its new keys are masked and the states of the real positions are the unpadded ones."""
    from csekit.encoding.ready_mask import ready_attention_mask

    encoder = make_tiny_encoder(tmp_path / "tokenizer", pooler="mean")
    backbone = encoder.backbone.train()
    backbone.config._attn_implementation = attention
    for module in backbone.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    inputs = encoder.tokenize(["a man plays the guitar", "a dog"])
    inputs["attention_mask"] = ready_attention_mask(backbone, inputs["attention_mask"])
    assert inputs["attention_mask"].dim() == 4
    padded, width = pad_to_bucket(dict(inputs), 8, 0)
    assert width == inputs["input_ids"].shape[1] and padded["input_ids"].shape[1] % 8 == 0
    assert padded["attention_mask"].shape[1:] == (1, padded["input_ids"].shape[1], padded["input_ids"].shape[1])
    wrapper = CompiledTrainingForward(backbone, "default", 8, backend="eager")
    wrapper.compiled = wrapper.eager  # the bucketing alone, without the compiler
    plain = backbone(**inputs).last_hidden_state
    bucketed = wrapper(**inputs).last_hidden_state
    real = encoder.tokenize(["a man plays the guitar", "a dog"])["attention_mask"].bool()
    assert bucketed.shape == plain.shape and torch.isfinite(bucketed).all()
    torch.testing.assert_close(bucketed[real], plain[real], rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_compiled_steps_give_the_eager_losses_and_resume_exactly(
    train_tiny: TinyTrainer, test_parts: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(compiled, "COMPILE_BACKEND", "aot_eager")
    compiled_passes: list[int] = []
    original_call = CompiledTrainingForward.__call__

    def counting_call(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        compiled_passes.append(1)
        return original_call(self, *args, **kwargs)

    # Every training pass must go through the compiled forward (a packed pass would bypass it).
    monkeypatch.setattr(CompiledTrainingForward, "__call__", counting_call)
    # Dropout off: a pass padded to its bucket draws its dropout masks over more positions than the
    # unpadded pass, so with dropout the two draw different masks (the same training, not the same numbers).
    eager, ours = (
        [r["loss"] for r in train_tiny("model.dropout=0.0", f"run.compile={mode}", eval_every=2, name=mode).losses]
        for mode in ("none", "default")
    )
    assert len(compiled_passes) >= 3  # a pass a step at least (both views in one batch), three steps
    assert len(eager) == 3 and ours == pytest.approx(eager, rel=1e-5)
    crashed_and_resumed(train_tiny, "run.compile=default", steps=3, eval_every=2)


def test_compile_choices() -> None:
    with pytest.raises(CsekitError, match=r"run\.compile must be one of none, auto, default"):
        load_recipe(None, ["run.compile=fast"])
    assert load_recipe(None, ["run.compile=reduce-overhead"]).run.compile == "reduce-overhead"
    with pytest.raises(CsekitError, match=r"run\.packed cannot be true with run\.compile"):
        load_recipe(None, ["run.compile=default", "run.packed=true"])
    assert load_recipe(None, ["run.compile=default", "run.packed=auto"]).run.packed == "auto"


def test_inductor_fuses_a_layers_position_wise_blocks_to_the_eager_values() -> None:
    """Bias and GELU, dropout, residual and LayerNorm as inductor fuses them: the eager layer's values and gradients."""
    config = BertConfig(hidden_size=32, num_attention_heads=2, intermediate_size=64, hidden_dropout_prob=0.1)
    torch.manual_seed(0)
    layer = BertLayer(config).train()
    attention_output = torch.randn(4, 8, 32)
    blocks = (layer.intermediate, layer.output)

    def position_wise(states: torch.Tensor) -> torch.Tensor:
        return blocks[1](blocks[0](states), states)

    fused = torch.compile(position_wise, backend="inductor", dynamic=False)
    results = []
    for function in (position_wise, fused):
        states = attention_output.clone().requires_grad_()
        torch.manual_seed(1)
        with torch._inductor.config.patch(fallback_random=True):  # eager's dropout masks
            out = function(states)
        out.square().sum().backward()
        grads = [states.grad, *(p.grad for block in blocks for p in block.parameters())]
        results.append((out.detach(), grads))
        layer.zero_grad()
    (eager_out, eager_grads), (fused_out, fused_grads) = results
    torch.testing.assert_close(fused_out, eager_out, rtol=1e-5, atol=1e-5)
    for ours, theirs in zip(fused_grads, eager_grads, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5)

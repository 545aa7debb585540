"""The padding-free pass for decoder LLMs (`run.packed`, csekit/encoding/packed_decoder.py) against the padded pass.

Every family of tests/tiny_decoders.py (Llama, Mistral, Qwen2, Gemma), causal and bidirectional, plain and with
LoRA adapters (peft): the pooled vectors, the real tokens' states and the gradient of every trainable parameter
equal the padded pass's on a batch of very different lengths, padded on the right or on the left; the decoder
poolers read the packed output; and the feed-forward saw real tokens only (a pass that silently ran padded fails).
Tolerances (float32, sums in another order): 1e-5 absolute on values (which reach 3.5 here); on gradients 1e-4
relative plus 1e-5 of the parameter's largest gradient. Largest differences measured over every family, both
attentions, with and without LoRA, right- and left-padded (torch 2.13 CPU, transformers 5.24): values 2.4e-6 and
gradients 4.9e-6 of the largest on the CPU path (one attention group or groups of 2 rows); 3.2e-6 and 1.2e-5
through the flash kernel's call with a CPU reference in the kernel's place (its layout, lengths, causal flag and
grouped heads; the kernel itself runs on CUDA only, in bf16, not tested here).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from conftest import TinyTrainer
from test_packed import training_then_evaluation_positions
from tiny_decoders import DECODER_TYPES, make_decoder_tokenizer, make_tiny_decoder, tiny_decoder_dir
from torch import Tensor

import csekit.encoding.packed_decoder as packed_decoder
from csekit.core.errors import CsekitError
from csekit.encoding.encoder import SentenceEncoder
from csekit.encoding.lora import add_lora
from csekit.encoding.packed import packing_refusal
from csekit.encoding.passes import PassPlan, PlannedEncoder
from csekit.training.execution import decide_execution, enable_gradient_checkpointing
from csekit.training.recipe import load_recipe

ATTENTIONS = ("causal", "bidirectional")

SENTENCES = [
    "a man plays the guitar slowly in the park with a red ball and the dog runs quickly on the big blue house",
    "the dog",
    "she eats food quickly .",
    "a",
    "they are playing music in the small house and he sits with the cat , not the dog !",
    "it is red",
]
"""One sentence of 1 word, one of 23: a batch of very different lengths."""

PACKED = PassPlan(packed=True, packed_required=True)
PADDED = PassPlan()


def tiny(model_type: str, attention: str, pooler: str = "mean", lora: bool = False) -> SentenceEncoder:
    """A tiny random decoder in training mode; with LoRA, adapters of rank 4 whose B is random (peft starts it at 0,
    which would leave A's gradient 0) and no adapter dropout (the passes draw masks of other shapes)."""
    encoder = make_tiny_decoder(model_type, pooler=pooler, attention=attention)
    if lora:
        encoder.backbone = add_lora(encoder.backbone, {"r": 4, "alpha": 8, "dropout": 0.0})
        with torch.no_grad():
            for name, parameter in encoder.backbone.named_parameters():
                if "lora_B" in name:
                    parameter.normal_(0, 0.2)
    return encoder.train()


def left_padded(inputs: dict[str, Tensor], pad: int) -> dict[str, Tensor]:
    """The right-padded `inputs` with each row's padding moved to its left."""
    mask = inputs["attention_mask"]
    width = mask.shape[1]
    shift = (width - mask.sum(dim=1))[:, None]
    source = (torch.arange(width)[None] - shift) % width  # slot j takes the right-padded row's slot j - shift
    ids = torch.where(torch.arange(width)[None] >= shift, inputs["input_ids"].gather(1, source), pad)
    return {"input_ids": ids, "attention_mask": mask.gather(1, source)}


def run(encoder: SentenceEncoder, inputs: dict[str, Tensor], plan: PassPlan) -> tuple[Tensor, Tensor, dict, list[int]]:
    """Pooled vectors, the real tokens' states (in the right-padded layout), the trainable parameters' gradients of
    a loss on both, and the positions the first layer's feed-forward computed."""
    encoder.zero_grad(set_to_none=True)
    model = encoder.backbone.get_base_model() if hasattr(encoder.backbone, "peft_config") else encoder.backbone
    seen: list[int] = []
    handle = model.layers[0].mlp.register_forward_pre_hook(lambda m, args: seen.append(args[0].shape[:-1].numel()))
    try:
        output = encoder(inputs, plan=plan)
    finally:
        handle.remove()
    mask = inputs["attention_mask"]
    weights = torch.randn(output.pooled.shape, generator=torch.Generator().manual_seed(1)).to(output.pooled.device)
    states = output.token_states * mask[..., None]
    (output.pooled * weights).sum().add(states.pow(2).sum()).backward()
    real = torch.stack([torch.cat([row[m.bool()], row[~m.bool()]]) for row, m in zip(states, mask, strict=True)])
    grads = {name: p.grad.clone() for name, p in encoder.named_parameters() if p.grad is not None}
    return output.pooled.detach(), real.detach(), grads, seen


def differences(padded: tuple, packed: tuple) -> tuple[float, float]:
    """The largest value difference, and the largest gradient difference relative to its parameter's largest
    gradient; asserts both within the module's tolerances."""
    (pooled, states, grads, _), (packed_pooled, packed_states, packed_grads, _) = padded, packed
    torch.testing.assert_close(packed_pooled, pooled, rtol=0, atol=1e-5)
    torch.testing.assert_close(packed_states, states, rtol=0, atol=1e-5)
    assert packed_grads.keys() == grads.keys() and grads
    worst = 0.0
    for name, grad in grads.items():
        scale = float(grad.abs().max()) or 1.0
        torch.testing.assert_close(packed_grads[name], grad, rtol=1e-4, atol=1e-5 * scale, msg=name)
        worst = max(worst, float((packed_grads[name] - grad).abs().max()) / scale)
    value = max(float((packed_pooled - pooled).abs().max()), float((packed_states - states).abs().max()))
    return value, worst


@pytest.mark.parametrize("lora", [False, True], ids=["plain", "lora"])
@pytest.mark.parametrize("attention", ATTENTIONS)
@pytest.mark.parametrize("model_type", DECODER_TYPES)
def test_packed_decoders_equal_the_padded_pass(model_type: str, attention: str, lora: bool) -> None:
    encoder = tiny(model_type, attention, lora=lora)
    right = encoder.tokenize(SENTENCES)
    left = left_padded(right, encoder.tokenizer.pad_token_id)
    assert not torch.equal(left["attention_mask"], right["attention_mask"])
    padded = run(encoder, right, PADDED)
    real, width = int(right["attention_mask"].sum()), right["attention_mask"].numel()
    assert real < width / 2  # mostly padding: a pass that attends across sentences or to padding is far off
    for inputs in (right, left):
        packed = run(encoder, inputs, PACKED)
        differences(padded, packed)
        assert packed[3] == [real]  # the feed-forward computed real tokens only, in one packed row
    if lora:  # only the adapters train, and both of each pair got a gradient
        assert {name.split(".")[-3] for name in padded[2]} == {"lora_A", "lora_B"}
        assert all(grad.abs().max() > 0 for grad in padded[2].values())


@pytest.mark.parametrize("attention", ATTENTIONS)
@pytest.mark.parametrize("pooler", ["mean", "last_token", "weighted_mean", "first_last_avg", "mean_padded"])
def test_every_decoder_pooler_reads_the_packed_output(pooler: str, attention: str) -> None:
    """Right- and left-padded, in one attention group and in groups of 2 rows (the CPU path's length groups)."""
    encoder = tiny("qwen2", attention, pooler=pooler)
    right = encoder.tokenize(SENTENCES)
    if pooler == "last_token":
        assert (right["input_ids"][torch.arange(len(SENTENCES)), right["attention_mask"].sum(1) - 1] == 2).all()
    padded = run(encoder, right, PADDED)
    for inputs in (right, left_padded(right, encoder.tokenizer.pad_token_id)):
        for groups in (0, 2):
            differences(padded, run(encoder, inputs, PassPlan(packed=True, length_group_size=groups)))


def reference_flash_kernel(calls: list[dict]) -> Callable[..., tuple[Tensor | None, ...]]:
    """A CPU stand-in for `aten::_flash_attention_forward` with its variable-length contract: q [T, H, d],
    k and v [T, H_kv, d] (H a multiple of H_kv), int32 cumulative lengths, a causal flag applied per sentence;
    it returns (output [T, H, d], ...)."""

    def kernel(
        q: Tensor, k: Tensor, v: Tensor, cum_q: Tensor, cum_k: Tensor, max_q: int, max_k: int, dropout: float,
        causal: bool, debug: bool, *, scale: float | None = None,
    ) -> tuple[Tensor | None, ...]:  # fmt: skip
        assert q.dim() == k.dim() == 3 and q.shape[1] % k.shape[1] == 0 and cum_q.dtype == torch.int32
        assert torch.equal(cum_q, cum_k) and int((cum_q[1:] - cum_q[:-1]).max()) <= max_q == max_k
        calls.append({"causal": causal, "heads": (q.shape[1], k.shape[1]), "dtype": q.dtype, "dropout": dropout})
        out = []
        for start, end in zip(cum_q[:-1].tolist(), cum_q[1:].tolist(), strict=True):
            qs, ks, vs = (t[start:end].transpose(0, 1) for t in (q, k, v))  # [heads, n, d]
            out.append(
                torch.nn.functional.scaled_dot_product_attention(
                    qs, ks, vs, is_causal=causal, scale=scale, enable_gqa=True
                ).transpose(0, 1)
            )
        return (torch.cat(out), None, None, None, None)

    return kernel


@pytest.mark.parametrize("attention", ATTENTIONS)
@pytest.mark.parametrize("model_type", DECODER_TYPES)
def test_the_flash_kernels_call_equals_the_padded_pass(
    monkeypatch: pytest.MonkeyPatch, model_type: str, attention: str
) -> None:
    """The CUDA path's call on the CPU: the kernel replaced by a reference with its contract, in fp32."""
    calls: list[dict] = []
    monkeypatch.setattr(packed_decoder, "flash_attention_runs", lambda head_size, device, dtype: True)
    monkeypatch.setattr(packed_decoder, "_flash_kernel", reference_flash_kernel(calls))
    encoder = tiny(model_type, attention, lora=True)
    right = encoder.tokenize(SENTENCES)
    padded = run(encoder, right, PADDED)
    differences(padded, run(encoder, left_padded(right, encoder.tokenizer.pad_token_id), PACKED))
    layers = encoder.backbone.get_base_model().config.num_hidden_layers
    expected = {"causal": attention == "causal", "heads": (4, 2), "dtype": torch.float32, "dropout": 0.0}
    assert calls == [expected] * layers  # grouped-query heads as they are, causal per sentence where causal


def first_layer_rows(encoder: SentenceEncoder) -> tuple[list[int], Callable[[], None]]:
    """The token counts the first layer's feed-forward is called with, forward and backward alike (a checkpoint's
    recomputation too), and the hook's remover."""
    seen: list[int] = []
    mlp = encoder.backbone.get_base_model().layers[0].mlp
    handle = mlp.register_forward_pre_hook(lambda m, args: seen.append(args[0].shape[:-1].numel()))
    return seen, handle.remove


@pytest.mark.parametrize("attention", ATTENTIONS)
@pytest.mark.parametrize("model_type", DECODER_TYPES)
def test_packed_with_gradient_checkpointing_gives_the_padded_gradients(model_type: str, attention: str) -> None:
    """With LoRA and run.gradient_checkpointing's (non-reentrant) checkpointing, the backward re-runs each layer
    after the pass has put the model's attention name back; its recomputation must attend within each sentence as
    the packed forward did (it once ran the model's own attention over the whole packed row, which torch's
    checkpoint stopped at: a different number of tensors saved in the recomputation)."""
    encoder = tiny(model_type, attention, lora=True)
    right = encoder.tokenize(SENTENCES)
    padded = run(encoder, right, PADDED)
    enable_gradient_checkpointing(encoder.backbone)
    seen, remove = first_layer_rows(encoder)
    try:
        packed = run(encoder, left_padded(right, encoder.tokenizer.pad_token_id), PACKED)
    finally:
        remove()
    differences(padded, packed)
    real = int(right["attention_mask"].sum())
    assert seen == [real, real]  # the forward and the backward's recomputation, both on the packed row
    assert encoder.backbone.get_base_model().config._attn_implementation == "sdpa"  # its own name after both
    assert packing_refusal(encoder.backbone) is None  # so `auto` and `true` pack it


def test_the_recomputation_draws_the_forwards_dropout() -> None:
    """SimCSE's positives are dropout: with attention dropout and LoRA's dropout on, a checkpointed packed step's
    gradients equal an uncheckpointed packed step's from the same seed (the recomputation replays the masks)."""
    grads = []
    for checkpointing in (False, True):
        encoder = make_tiny_decoder("llama", attention="bidirectional")
        encoder.backbone.config.attention_dropout = 0.3
        encoder.backbone = add_lora(encoder.backbone, {"r": 4, "alpha": 8, "dropout": 0.1})
        with torch.no_grad():
            for name, parameter in encoder.backbone.named_parameters():
                if "lora_B" in name:
                    parameter.normal_(0, 0.2, generator=torch.Generator().manual_seed(3))
        encoder.train()
        if checkpointing:
            enable_gradient_checkpointing(encoder.backbone)
        torch.manual_seed(5)
        encoder(encoder.tokenize(SENTENCES), plan=PACKED).pooled.square().sum().backward()
        grads.append({n: p.grad.clone() for n, p in encoder.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, rtol=1e-5, atol=1e-6, msg=name)


def test_reentrant_checkpointing_is_refused_by_name() -> None:
    """Reentrant checkpointing takes no context for its recomputation: refused, never run with wrong gradients."""
    encoder = tiny("qwen2", "bidirectional", lora=True)
    model = encoder.backbone.get_base_model()
    enable = getattr(model, "activation_checkpointing_enable", None)  # transformers 5.24's name; 5.17 has the other
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": True})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    expected = "the padding-free pass runs with non-reentrant gradient checkpointing only"
    assert packing_refusal(encoder.backbone).startswith(expected)
    with pytest.raises(CsekitError, match=expected):
        encoder(encoder.tokenize(SENTENCES), plan=PACKED)


def test_a_batch_wider_than_the_sliding_window_runs_padded() -> None:
    """The packed pass does not apply a sliding window; a batch whose rows may exceed it runs the padded pass."""
    encoder = tiny("mistral", "causal")
    encoder.backbone.config.sliding_window = 4
    inputs = encoder.tokenize(SENTENCES)
    padded, packed = run(encoder, inputs, PADDED), run(encoder, inputs, PACKED)
    assert packed[3] == [inputs["attention_mask"].numel()]  # padded
    assert torch.equal(packed[0], padded[0])


def test_the_refusal_is_gone_for_these_families_and_names_another() -> None:
    for model_type in DECODER_TYPES:
        for attention in ATTENTIONS:
            assert packing_refusal(tiny(model_type, attention).backbone) is None
            assert packing_refusal(tiny(model_type, attention, lora=True).backbone) is None
    from transformers import AutoConfig

    tokenizer = make_decoder_tokenizer()
    config = AutoConfig.for_model("gpt2", vocab_size=len(tokenizer), n_embd=32, n_layer=1, n_head=2, n_positions=64)
    gpt2 = SentenceEncoder.from_config(config, tokenizer, pooler="mean")
    refusal = packing_refusal(gpt2.backbone)
    assert refusal == "the padding-free pass runs llama, mistral, qwen2 and gemma decoders, not gpt2"
    with pytest.raises(CsekitError, match=r"^recipe key run\.packed: true: .*not gpt2; use auto") as error:
        decide_execution(load_recipe(None, ["run.packed=true"]), device_type="cpu").pass_plan(gpt2.backbone)
    assert "\n" not in str(error.value)
    flex = make_tiny_decoder("llama")
    flex.backbone.config._attn_implementation = "flex_attention"
    expected = "the padding-free pass runs a decoder's eager or sdpa attention, not flex_attention"
    assert packing_refusal(flex.backbone) == expected


def test_auto_packs_decoders_on_cuda_where_the_flash_kernel_runs_and_not_on_a_cpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import csekit.training.execution as execution

    monkeypatch.setattr(execution, "flash_packing_runs", lambda device, dtype: True)
    decoder = tiny("llama", "bidirectional", lora=True)
    inputs = decoder.tokenize(SENTENCES)

    def plan(kind: str, *overrides: str) -> PassPlan:
        recipe = load_recipe(None, ["train.precision=bf16", *overrides])
        return decide_execution(recipe, device_type=kind).pass_plan(decoder.backbone)

    assert plan("cuda").packed and not plan("cuda").fused_qkv  # fused q/k/v is the BERT pass's
    assert not plan("cpu").packed and plan("cpu", "run.packed=true").packed
    assert plan("cuda", "run.gradient_checkpointing=true").packed  # the recomputation re-enters packed attention
    assert not plan("cuda", "run.packed_bucket=64").packed
    with pytest.raises(CsekitError, match=r"run\.packed_bucket\) runs bert and roberta backbones only"):
        plan("cuda", "run.packed=true", "run.packed_bucket=64")
    model = PlannedEncoder(decoder, plan("cpu", "run.packed=true"))
    seen = training_then_evaluation_positions(model, decoder.backbone.get_base_model().layers[0].mlp, inputs)
    assert seen == [int(inputs["attention_mask"].sum()), inputs["attention_mask"].numel()]


def test_the_attention_name_is_put_back_even_when_the_pass_fails() -> None:
    encoder = tiny("gemma", "causal")
    inputs = encoder.tokenize(SENTENCES)
    inputs["input_ids"][0, 0] = 10_000  # out of the vocabulary: the embedding lookup fails inside the pass
    with pytest.raises(IndexError):
        encoder(inputs, plan=PACKED)
    assert encoder.backbone.config._attn_implementation == "sdpa"
    with pytest.raises(CsekitError, match="packed decoder pass only"):
        packed_decoder.packed_attention(encoder, *(torch.zeros(1, 1, 2, 8),) * 3, None)


def test_a_lora_decoder_trains_packed_through_the_trainer(tmp_path: Path, train_tiny: TinyTrainer) -> None:
    """The whole run: the collator's packing layout, the planned encoder, peft's adapters: with dropout off, each
    step's loss is the padded run's."""
    model = tiny_decoder_dir(tmp_path / "model", "llama", attention="bidirectional")
    losses = {}
    for packed in ("true", "false"):
        settings = ["model.dropout=0.0", "model.lora={r: 4, alpha: 8, dropout: 0.0}", "train.batch_size=8"]
        run = train_tiny(
            *settings, "train.precision=fp32", f"run.packed={packed}", steps=2, lines=32, model=model, name=packed
        )
        losses[packed] = [record["loss"] for record in run.losses]
    assert len(losses["true"]) == 2
    assert losses["true"] == pytest.approx(losses["false"], rel=1e-5)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the flash kernel's variable-length form needs CUDA")
@pytest.mark.parametrize("attention", ATTENTIONS)
@pytest.mark.parametrize("model_type", DECODER_TYPES)
def test_on_cuda_the_flash_pass_equals_the_padded_pass(
    monkeypatch: pytest.MonkeyPatch, model_type: str, attention: str
) -> None:
    """bf16 under autocast (the flash kernel's precision), LoRA on: values and gradients to bf16 rounding, and every
    layer's attention ran the kernel."""
    calls: list[int] = []
    kernel = packed_decoder._flash_kernel
    monkeypatch.setattr(packed_decoder, "_flash_kernel", lambda *a, **k: calls.append(1) or kernel(*a, **k))
    encoder = tiny(model_type, attention, lora=True).cuda()
    inputs = {key: value.cuda() for key, value in encoder.tokenize(SENTENCES).items()}
    with torch.autocast("cuda", dtype=torch.bfloat16):
        padded = run(encoder, inputs, PADDED)
        packed = run(encoder, inputs, PACKED)
    assert len(calls) == encoder.backbone.get_base_model().config.num_hidden_layers
    torch.testing.assert_close(packed[0], padded[0], rtol=2e-2, atol=2e-2)
    for name, grad in padded[2].items():
        scale = float(grad.abs().max()) + 1e-6
        torch.testing.assert_close(packed[2][name], grad, rtol=5e-2, atol=5e-2 * scale, msg=name)

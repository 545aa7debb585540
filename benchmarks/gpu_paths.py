"""The checks stage's correctness checks: every path `run: auto` takes or may take, against an fp32 padded pass.

Each path's pooled vectors and gradients (of a fixed random loss on them; dropout off) are compared with those
of the same weights in one padded fp32 pass by `tests/pass_reference.py`, the helper the CPU tests compare the
packed pass's forms with, and judged against `TOLERANCES` at the precision the path ran in. On CUDA a path runs
as auto trains there (bf16 autocast); in the CPU mode (tests/runs/test_gpu_check.py) the same code runs on tiny
models in fp32, and in bf16 where a path needs it (bf16 weights), so the tests exercise every check.

* BERT (the stage's random BERT, [CLS], the corpus's sentences at max length 32), each with `run.fast_dropout`
  on as in training: the plan `auto` picks for the quickstart recipe on this device, padded, packed, packed with
  the fused QKV product, packed on fixed shapes (`run.packed_bucket`, with the fused product, as run.compile
  captures it), and packed on a bucket of exactly the batch's tokens, where every padding row is empty.
* A random Llama-layout decoder (tests/tiny_decoders.py; on CUDA 4 layers of width 512, heads of 64), built as
  a recipe builds it (`load_encoder`, `Execution.prepare_backbone`): bidirectional attention through SDPA
  over right-padded rows, checked first against each row run alone (the padding mask, fp32), then at the
  training precision, with LoRA adapters and gradient checkpointing (the llm2vec recipes), padded and packed (the
  checkpoint's recomputation re-entering the packed attention; on CUDA its flash kernel), and with LoRA on bf16
  base weights (`model.weights_dtype`).
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # pass_reference, tiny_decoders: the CPU tests' own helpers

from pass_reference import PassResults, drift, loss_weights, pass_results  # noqa: E402

TOLERANCES: dict[str, dict[str, float]] = {
    "fp32": {"pooled_max_relative": 1e-4, "grad_relative": 1e-4},
    "bf16": {"pooled_max_relative": 3e-2, "grad_relative": 5e-2},
}
"""Largest allowed drift from the fp32 padded reference: the pooled vectors' largest difference over their largest
entry, and the gradients' relative L2 distance. fp32: float sums in another order (about 1e-6 seen on a CPU).
bf16: its rounding (8 significant bits); the H200 run of 2026-11-27 measured 0.007 and 0.007 for the packed pass
of a random BERT-base; a wrong mask, a dropped adapter or a lost row moves them by tenths or more."""

LORA = "{r: 8, alpha: 16, dropout: 0.0}"
DECODER_SIZE = {
    "hidden_size": 512,
    "intermediate_size": 1376,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "initializer_range": 0.02,
}
"""The decoder on CUDA: heads of 64 as real decoders have (the tiny one's heads of 8 would try other kernels)."""


def judged(figures: dict[str, float], precision: str) -> dict[str, Any]:
    """`figures` with the tolerance they are held to and whether they are within it (NaN is not)."""
    tolerance = TOLERANCES[precision]
    within = all(figures[key] <= bound for key, bound in tolerance.items())
    return {**figures, "precision": precision, "tolerance": tolerance, "within": within}


def autocast(device: str, precision: str) -> Any:
    return torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=precision == "bf16")


def measured(name: str, checks: dict[str, Any], run: Callable[[], dict[str, Any]]) -> None:
    """`checks[name]` = what `run` measured, or its error (a path that fails to run is out of tolerance)."""
    try:
        checks[name] = run()
    except Exception as error:
        checks[name] = {"error": f"{type(error).__name__}: {str(error)[:400]}", "within": False}


def bert_checks(bert: Path, sentences: list[str], device: str, precision: str, bucket: int) -> dict[str, Any]:
    """The encoder paths on `bert` (a BERT folder), each against its fp32 padded pass."""
    from csekit.encoding.encoder import SentenceEncoder
    from csekit.encoding.packed import flash_packing_runs
    from csekit.encoding.packed_fixed import bucket_tokens, padding_rows
    from csekit.encoding.passes import PassPlan
    from csekit.training.execution import decide_execution
    from csekit.training.recipe import load_recipe

    overrides = [f"model.backbone={bert}", "model.dropout=0.0", f"train.precision={precision}"]
    recipe = load_recipe(REPO / "recipes" / "quickstart.yaml", overrides)
    execution = decide_execution(recipe, device_type=torch.device(device).type)
    width = recipe.model.max_length
    reference_encoder = SentenceEncoder.load(bert, "cls", dropout=0.0).to(device).train()
    encoder = SentenceEncoder.load(bert, "cls", dropout=0.0).to(device).train()
    execution.prepare_backbone(encoder.backbone, recipe)  # fast dropout, as a run has it
    inputs = {k: v.to(device) for k, v in encoder.tokenize(sentences, max_length=width).items()}
    tokens = int(inputs["attention_mask"].sum())
    reference = pass_results(reference_encoder, inputs)
    auto = execution.pass_plan(encoder.backbone, width)
    packed = PassPlan(packed=True, packed_required=True)
    plans = {
        f"auto (packed {auto.packed}, fused QKV {auto.fused_qkv}, groups of {auto.length_group_size})": auto,
        "padded": PassPlan(),
        "packed": packed,
        "packed, fused QKV": PassPlan(packed=True, packed_required=True, fused_qkv=True),
        f"packed, bucket {bucket}, fused QKV": PassPlan(
            packed=True, packed_required=True, fused_qkv=True, token_bucket=bucket, width_bound=width
        ),
        f"packed, bucket {tokens} (the batch's tokens: every padding row empty)": PassPlan(
            packed=True, packed_required=True, token_bucket=tokens, width_bound=width
        ),
    }
    checks: dict[str, Any] = {}
    for name, plan in plans.items():

        def run(plan: PassPlan = plan) -> dict[str, Any]:
            with autocast(device, precision):
                figures = judged(drift(reference, pass_results(encoder, inputs, plan)), precision)
            if plan.token_bucket:
                rows = padding_rows(plan.token_bucket, width)
                filled = -(-(bucket_tokens(tokens, plan.token_bucket) - tokens) // width)
                figures.update(padding_rows=rows, empty_padding_rows=rows - filled)
            return figures

        measured(name, checks, run)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    facts = {"rows": len(sentences), "tokens": tokens, "flash": flash_packing_runs(torch.device(device), dtype)}
    return {"facts": facts, **checks}


def decoder_folder(folder: Path, tiny: bool) -> Path:
    """A random Llama-layout decoder saved with the decoder tokenizer of tests/tiny_decoders.py."""
    from tiny_decoders import decoder_config, make_decoder_tokenizer

    from csekit.encoding.encoder import SentenceEncoder

    tokenizer = make_decoder_tokenizer()
    config = decoder_config("llama", len(tokenizer), "bidirectional")
    if not tiny:
        config.update(DECODER_SIZE)
    torch.manual_seed(0)
    SentenceEncoder.from_config(config, tokenizer, pooler="mean").save(folder)
    return folder


def decoder_encoder(folder: Path, device: str, precision: str, lora: bool, weights: str, prepared: bool) -> Any:
    """The decoder as a recipe builds it: bidirectional, mean pooling, dropout off, optionally LoRA (adapters set
    to fixed random values, so that every build holds the same ones) on `weights` ("fp32" or "bf16") base
    weights, and `prepared`: with the run's fast dropout and, with LoRA, gradient checkpointing (as llm2vec)."""
    from csekit.training.execution import decide_execution
    from csekit.training.model import load_encoder
    from csekit.training.recipe import load_recipe

    overrides = [
        f"model.backbone={folder}",
        "model.pooler=mean",
        "model.attention=bidirectional",
        "model.dropout=0.0",
        "model.max_length=32",
        f"model.weights_dtype={weights}",
        f"train.precision={precision}",
        f"run.gradient_checkpointing={str(lora and prepared).lower()}",
        *([f"model.lora={LORA}"] if lora else []),
    ]
    recipe = load_recipe(REPO / "recipes" / "quickstart.yaml", overrides)
    execution = decide_execution(recipe, device_type=torch.device(device).type)
    encoder = load_encoder(recipe, execution.weights_dtype)
    if lora:
        generator = torch.Generator().manual_seed(2)
        with torch.no_grad():
            for name, parameter in sorted(encoder.named_parameters()):
                if "lora_" in name:
                    parameter.copy_(0.05 * torch.randn(parameter.shape, generator=generator))
    if prepared:
        execution.prepare_backbone(encoder.backbone, recipe)
    return encoder.to(device).train()


def alone_results(encoder: Any, inputs: dict[str, torch.Tensor]) -> PassResults:
    """`pass_results`'s loss with each row run alone, unpadded: what a correct padding mask gives."""
    encoder.zero_grad(set_to_none=True)
    lengths = inputs["attention_mask"].sum(dim=1).tolist()
    rows, weights = [], None
    for row, length in enumerate(lengths):
        pooled = encoder({key: value[row : row + 1, :length] for key, value in inputs.items()}).pooled.float()
        if weights is None:
            weights = loss_weights((len(lengths), pooled.shape[1]), pooled.device)
        (pooled * weights[row]).sum().backward()
        rows.append(pooled.detach())
    grads = {name: p.grad.float().clone() for name, p in encoder.named_parameters() if p.grad is not None}
    return torch.cat(rows), None, grads, []


def decoder_sentences(rows: int) -> list[str]:
    """`rows` sentences of 1 to 24 words of the decoder tokenizer's vocabulary: many lengths, so much padding."""
    from tiny_decoders import DECODER_WORDS

    draw = random.Random(0)
    return [" ".join(draw.choices(DECODER_WORDS, k=draw.randint(1, 24))) for _ in range(rows)]


def decoder_checks(work: Path, device: str, precision: str, tiny: bool, rows: int) -> dict[str, Any]:
    """The decoder paths, each against the plain fp32 decoder's (or, with LoRA, the fp32 LoRA decoder's) padded
    pass; the padding mask against the rows run alone."""
    from csekit.encoding.passes import PassPlan

    folder = work / "decoder-random"
    if not folder.exists():
        decoder_folder(folder, tiny)
    plain = decoder_encoder(folder, device, "fp32", False, "fp32", False)
    inputs = {k: v.to(device) for k, v in plain.tokenize(decoder_sentences(rows), max_length=32).items()}
    lengths = inputs["attention_mask"].sum(dim=1)
    facts = {
        "rows": rows,
        "lengths": [int(lengths.min()), int(lengths.max())],
        "attention": plain.backbone.config._attn_implementation,
        "padding_side": plain.tokenizer.padding_side,
    }
    reference = pass_results(plain, inputs)
    checks: dict[str, Any] = {"facts": facts}
    measured(
        "bidirectional padded mask (SDPA) vs each row alone, fp32",
        checks,
        lambda: judged(drift(alone_results(plain, inputs), reference), "fp32"),
    )

    def path(encoder: Any, expected: PassResults, at: str, plan: Any = None) -> dict[str, Any]:
        with autocast(device, at):
            return judged(drift(expected, pass_results(encoder, inputs, plan)), at)

    prepared = decoder_encoder(folder, device, precision, False, "fp32", True)
    measured(f"padded, {precision}, fast dropout", checks, lambda: path(prepared, reference, precision))
    lora_reference = pass_results(decoder_encoder(folder, device, "fp32", True, "fp32", False), inputs)
    lora = decoder_encoder(folder, device, precision, True, "fp32", True)
    measured(f"LoRA, gradient checkpointing, {precision}", checks, lambda: path(lora, lora_reference, precision))
    packed = PassPlan(packed=True, packed_required=True)  # the recomputation re-enters the packed attention
    measured(
        f"LoRA, gradient checkpointing, packed, {precision}",
        checks,
        lambda: path(lora, lora_reference, precision, packed),
    )

    def bf16_weights() -> dict[str, Any]:
        encoder = decoder_encoder(folder, device, "bf16", True, "bf16", True)
        dtypes = sorted({str(p.dtype) for n, p in encoder.named_parameters() if "lora_" not in n})
        return {**path(encoder, lora_reference, "bf16"), "base_dtypes": dtypes}

    measured("LoRA on bf16 weights, gradient checkpointing, bf16", checks, bf16_weights)
    return checks


def path_checks(
    bert: Path, sentences: list[str], work: Path, device: str, precision: str, tiny: bool, bucket: int
) -> dict[str, Any]:
    """Every path's figures under "bert" and "decoder", and "failed": the names of those out of tolerance."""
    results: dict[str, Any] = {}
    for name, run in (
        ("bert", lambda: bert_checks(bert, sentences, device, precision, bucket)),
        ("decoder", lambda: decoder_checks(work, device, precision, tiny, 8 if tiny else 16)),
    ):
        try:
            results[name] = run()
        except Exception as error:  # the model could not even be built: every path of it unchecked
            results[name] = {"error": {"error": f"{type(error).__name__}: {str(error)[:400]}", "within": False}}
    results["failed"] = [
        f"{group}: {name}"
        for group in ("bert", "decoder")
        for name, figures in results[group].items()
        if name != "facts" and not figures.get("within", False)
    ]
    return results

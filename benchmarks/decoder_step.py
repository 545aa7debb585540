"""csekit's SimCSE step at LLM2Vec's 7B shape, padded and packed: seconds a step, peak memory, FLOP against the bound.

    PYTHONPATH=src python benchmarks/decoder_step.py --device cuda          # the 7B shape (a GPU of 40 GB or more)
    PYTHONPATH=src python benchmarks/decoder_step.py --device cpu --tiny   # the same code on a toy model (tests)

LLM2Vec (BehnamGhader et al., 2024) reports 10.8 s a SimCSE step for a 7B model on one A100-80GB (batch 128,
128 tokens, LoRA r 16). This is csekit's step at that shape (the GPU command's `decoder` stage runs it):

* a random model of Mistral-7B's configuration (`MISTRAL_7B`: 32 layers, width 4,096, 32 query and 8 key/value
  heads, MLP 14,336, 32,000 tokens, rope theta 1e6 as v0.2's, sliding window 4,096 as v0.1's config; 7.11B
  parameters without the LM head), built where it trains directly in bf16 (`model.weights_dtype: bf16`): no
  weights are downloaded, read or written. At 128 tokens the window never binds (the packed pass runs);
* set up as recipes/llm2vec-simcse-sheared-llama.yaml sets a decoder up: bidirectional attention, mean pooling
  (the recipe's mean_padded less its one-token padding pass a step, csekit.encoding.padding_state),
  attention dropout 0.3, LoRA r 16 (alpha 32, dropout 0.05) on q, k, v, o, gate, up and down, gradient
  checkpointing, bf16 autocast, SimCSE's two dropout views, InfoNCE at temperature 0.05, fused AdamW over the
  adapters, gradients clipped at 1.0: csekit's own model, views, collator and optimizer (`build_run_model`,
  `TrainCollator`, `make_optimizer`), the trainer's step without its DataLoader (batches made beforehand);
* batches of 128 real sentences, in order, from corpus/wiki1m_for_simcse.head11913.txt (the Wikipedia sentences
  LLM2Vec trains on, their own lengths, cut at 128 tokens), tokenised with all-MiniLM-L6-v2's WordPiece tokenizer
  (uncased, 30,522 ids, used as they are: each is an id of the 32,000-entry table; [CLS] and [SEP] around a
  sentence where Mistral's puts <s> before it): it works offline and cuts English about as finely (about 25
  tokens a sentence here); the token counts are not Mistral's tokenizer's;
* padded (`run.packed: false`: each step's batch padded to its longest row) then packed (`run.packed: true`: the
  real tokens only, through PyTorch's flash kernel on CUDA) on the same batches: `warmup` steps, then `steps`
  timed ones (a device sync after each); the peak over them (`torch.cuda.max_memory_allocated`; on a CPU the
  peak resident size), and the tokens the first layer's feed-forward saw in the first step (the forward and the
  checkpoint's recomputation: which pass ran).

FLOP a step (matrix products only, `step_flop`). A frozen weight of P parameters costs 2 P T forward on T tokens,
and its backward computes the activations' gradient only, another 2 P T (the usual 6 P T assumes a weight
gradient too, which LoRA's frozen base has not); gradient checkpointing runs the forward once more in the
backward. With P the frozen projections (6.98B), P_lora the adapters (41.9M), n the layers, H the query width
(4,096) and L_i each row's length:

    flop = 3 * 2 P T  +  4 * 2 P_lora T  +  4 * 4 n H sum(L_i^2)      (3, 4, 4 are 2, 3, 3 without checkpointing)

(the adapters' backward has their weight gradients too; attention's QK^T and AV cost 4 n H L^2 forward and twice
that backward). `flop_per_step` counts the real tokens, the work any pass must do: the same count for padded and
packed, so the faster step rates higher; `padded_flop_per_step` counts the padded batch (rows x width, width^2 a
row), what the padded pass computes. Embedding lookups, norms, rotary, softmax, SiLU, the loss and AdamW are not
counted (`computed_bound_fraction` rates what the pass multiplied, padding included). The bound is the device's
dense bf16 datasheet figure (`NOMINAL_BF16_TFLOPS`: A100 312, H100 and H200 989 TFLOP/s), else a measured bf16
product; `bound_seconds` = flop / bound, `bound_fraction` = bound_seconds / seconds a step. LLM2Vec's 10.8 s is
rated the same way on the A100's 312 with this run's counts (`padded_bound_fraction`: with its padded batches').
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "llm2vec-simcse-sheared-llama.yaml"
DECODER_CORPUS = "corpus/wiki1m_for_simcse.head11913.txt"
"""The data folder's Wikipedia sample (LLM2Vec's SimCSE corpus, wiki1m, its first 11,913 lines)."""

MISTRAL_7B: dict[str, Any] = {
    "vocab_size": 32_000,
    "hidden_size": 4096,
    "intermediate_size": 14_336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 32_768,
    "rms_norm_eps": 1e-5,
    "rope_theta": 1e6,
    "sliding_window": 4096,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
"""Mistral-7B's configuration (v0.1's window; rope theta 1e6 as v0.2's, which LLM2Vec trained)."""

TINY_MISTRAL = {
    **MISTRAL_7B,
    **{"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "head_dim": 16},
    **{"num_attention_heads": 4, "num_key_value_heads": 2},
}
"""`--tiny`: the same code on a toy Mistral (its vocabulary: the tokenizer's)."""

LLM2VEC = {"seconds_per_step": 10.8, "device": "A100-80GB", "bound_tflops": 312.0}
"""LLM2Vec's reported SimCSE step for a 7B model (batch 128, 128 tokens, LoRA r 16)."""

TARGET_SECONDS = 4.4
"""The issue's target for this step on an H200."""

NOMINAL_BF16_TFLOPS = {"A100": 312.0, "H100": 989.0, "H200": 989.0}
"""Dense bf16 TFLOP/s of the datasheets, by a substring of the device's name."""


@dataclass(frozen=True)
class Shape:
    """The step's size: sentences a step (two views each), their token cap, timed and warm-up steps."""

    batch: int = 128
    max_length: int = 128
    steps: int = 3
    warmup: int = 2


LLM2VEC_SHAPE = Shape()
TINY_SHAPE = Shape(batch=4, max_length=32, steps=2, warmup=1)


def nominal_bound(device_name: str) -> float | None:
    """The datasheet's dense bf16 TFLOP/s of a device named `device_name`, or None for another device."""
    return next((tflops for name, tflops in NOMINAL_BF16_TFLOPS.items() if name in device_name), None)


def read_sentences(corpus: Path, count: int) -> list[str]:
    """The corpus's first `count` non-empty lines, in order (again from the start if it has fewer)."""
    lines = [line.strip() for line in corpus.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not lines:
        raise SystemExit(f"{corpus}: no sentences")
    return [lines[index % len(lines)] for index in range(count)]


def step_flop(
    frozen: int, lora: int, layers: int, query_width: int, tokens: int, squares: int, checkpointing: bool = True
) -> int:
    """FLOP of one step's matrix products (module docstring): `tokens` through the frozen projections (`frozen`
    parameters) and the adapters (`lora`), attention over rows whose squared lengths sum to `squares`."""
    passes = 3 if checkpointing else 2  # forward, (recomputation,) backward to the activations
    return passes * 2 * frozen * tokens + (passes + 1) * (2 * lora * tokens + 4 * layers * query_width * squares)


def batch_tokens(mask: torch.Tensor) -> dict[str, int]:
    """A collated batch's rows, width, real and padded tokens, and their rows' squared lengths summed."""
    lengths = mask.sum(dim=1).long()
    rows, width = mask.shape
    return {
        "rows": rows,
        "width": width,
        "real": int(lengths.sum()),
        "padded": rows * width,
        "real_squares": int(lengths.pow(2).sum()),
        "padded_squares": rows * width * width,
    }


def projection_parameters(backbone: nn.Module) -> tuple[int, int]:
    """The frozen linear layers' parameters (the projections; embeddings are lookups) and the adapters'."""
    frozen = sum(
        module.weight.numel()
        for name, module in backbone.named_modules()
        if isinstance(module, nn.Linear) and "lora_" not in name
    )
    lora = sum(p.numel() for name, p in backbone.named_parameters() if "lora_" in name)
    return frozen, lora


def build_encoder(values: dict[str, Any], tokenizer: Any, device: str, recipe: Any) -> Any:
    """The random decoder of `values` in bf16 on `device`, bidirectional, with the recipe's attention dropout and
    LoRA adapters, mean pooling: what `load_encoder` would make of such a checkpoint."""
    from transformers import AutoConfig, AutoModel

    from csekit.encoding.encoder import SentenceEncoder
    from csekit.encoding.lora import add_lora
    from csekit.encoding.pooling import make_pooler

    config = AutoConfig.for_model("mistral", **values)
    config.attention_dropout = recipe.model.dropout
    config.is_causal = recipe.model.attention == "causal"
    torch.manual_seed(0)
    with torch.device(device):  # initialised where it trains: a GPU draws 7B random weights in a blink
        backbone = AutoModel.from_config(config, dtype=torch.bfloat16)
    where = {p.device.type for p in backbone.parameters()}
    if where != {torch.device(device).type}:
        raise SystemExit(f"the model was built on {where}, not {device}")
    backbone = add_lora(backbone, recipe.model.lora)
    # The recipe's mean_padded adds one one-token pass a step (the padding state, csekit.encoding.padding_state) and
    # needs an EOS token, which the WordPiece tokenizer used here has not: the step is timed with the plain mean.
    return SentenceEncoder(backbone, tokenizer, make_pooler("mean"))


def overrides(shape: Shape, packed: bool) -> list[str]:
    """The LLM2Vec recipe at `shape`, bf16 weights and precision, checkpointing, padded or packed."""
    return [
        f"model.max_length={shape.max_length}",
        "model.weights_dtype=bf16",
        f"train.batch_size={shape.batch}",
        "train.precision=bf16",
        "run.gradient_checkpointing=true",
        f"run.packed={str(packed).lower()}",
    ]


def peak_start(device: str) -> str | None:
    """Start the peak memory figure from now; why it could not (a CPU without /proc's reset), else None."""
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
        return None
    from decoder_memory import reset_peak_resident

    return None if reset_peak_resident() else "peak resident size since the process started (no reset)"


def peak_bytes(device: str) -> int:
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated()
    from decoder_memory import status_mib

    return int(status_mib("VmHWM") * 2**20)


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def one_pass_kind(
    encoder: Any, shape: Shape, packed: bool, sentences: list[str], device: str, deadline: float | None
) -> dict[str, Any]:
    """`shape.warmup` then up to `shape.steps` timed training steps, padded or `packed`, on consecutive batches of
    `sentences`; with `deadline` (time.time()), a timed step starts only with time for it (one at least)."""
    from csekit.data.corpus import TrainCollator
    from csekit.encoding.lora import plain_model
    from csekit.training.execution import build_run_model, decide_execution
    from csekit.training.optimization import make_optimizer
    from csekit.training.recipe import load_recipe

    recipe = load_recipe(RECIPE, overrides(shape, packed))
    execution = decide_execution(recipe, device_type=torch.device(device).type)
    model, views = build_run_model(recipe, encoder, execution)
    model.to(device).train()
    plan = execution.pass_plan(encoder.backbone, recipe.model.max_length)
    optimizer = make_optimizer(model, recipe)
    trainable = [p for p in model.parameters() if p.requires_grad]
    collate = TrainCollator(views)
    count = shape.warmup + shape.steps
    batches = [collate(sentences[i * shape.batch : (i + 1) * shape.batch]) for i in range(count)]
    seen: list[int] = []
    first = plain_model(encoder.backbone).layers[0].mlp
    hook = first.register_forward_pre_hook(lambda module, args: seen.append(args[0].shape[:-1].numel()))
    note = peak_start(device)
    seconds: list[float] = []
    loss = torch.zeros(())
    for index, batch in enumerate(batches):
        timed = seconds[shape.warmup :]
        if deadline is not None and timed and time.time() + 1.5 * timed[-1] > deadline:
            break  # no time for another step: report those timed
        started = time.perf_counter()
        inputs = {key: value.to(device) if hasattr(value, "to") else value for key, value in batch["inputs"].items()}
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
            loss, _ = model(inputs, batch["sentences"])
        loss.backward()
        if recipe.train.max_grad_norm:
            torch.nn.utils.clip_grad_norm_(trainable, recipe.train.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        synchronize(device)
        seconds.append(time.perf_counter() - started)
        if index == 0:
            hook.remove()
    hook.remove()
    timed = seconds[shape.warmup :]
    counted = [batch_tokens(batch["inputs"]["attention_mask"]) for batch in batches[shape.warmup :][: len(timed)]]
    figures: dict[str, Any] = {
        "packed": plan.packed,
        "seconds_per_step": statistics.mean(timed) if timed else None,
        "step_seconds": seconds,
        "warmup_steps": min(shape.warmup, len(seconds)),
        "peak_bytes": peak_bytes(device),
        "first_layer_tokens": seen,  # the feed-forward's tokens in the first step: forward, then recomputation
        "tokens": {key: statistics.mean(c[key] for c in counted) for key in counted[0]} if counted else None,
        "loss": float(loss.detach()),
    }
    if note:
        figures["peak_note"] = note
    return figures


def release(encoder: Any, device: str) -> None:
    """Free what a pass kind held (its gradients, model wrapper, optimizer and caches; after an error too)."""
    encoder.zero_grad(set_to_none=True)
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def rated(figures: dict[str, Any], frozen: int, lora: int, config: dict[str, Any], bound: float) -> dict[str, Any]:
    """`figures` with the FLOP a step (real tokens, and the padded batch's), the bound's seconds and the fraction."""
    tokens = figures.get("tokens")
    if not tokens or not figures.get("seconds_per_step"):
        return figures
    layers, width = config["num_hidden_layers"], config["num_attention_heads"] * config["head_dim"]
    flop = step_flop(frozen, lora, layers, width, tokens["real"], tokens["real_squares"])
    padded = step_flop(frozen, lora, layers, width, tokens["padded"], tokens["padded_squares"])
    bound_seconds, seconds = flop / (bound * 1e12), figures["seconds_per_step"]
    computed = flop if figures["packed"] else padded  # what this pass multiplied, padding included
    return {
        **figures,
        "flop_per_step": flop,
        "padded_flop_per_step": padded,
        "bound_seconds": bound_seconds,
        "bound_fraction": bound_seconds / seconds,
        "tflops": flop / seconds / 1e12,
        "computed_bound_fraction": computed / (bound * 1e12) / seconds,
    }


def measure(
    device: str,
    tokenizer_path: Path,
    corpus: Path,
    tiny: bool = False,
    bound: float | None = None,
    deadline: float | None = None,
    report: Callable[[dict[str, Any]], None] = lambda results: None,
) -> dict[str, Any]:
    """Build the model once, then the padded and the packed steps; `report` gets the results after each part.
    `bound`: the device's bf16 TFLOP/s where its datasheet's is not known (a measured one)."""
    from transformers import AutoTokenizer

    from csekit.training.recipe import load_recipe

    shape = TINY_SHAPE if tiny else LLM2VEC_SHAPE
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    values = {**TINY_MISTRAL, "vocab_size": len(tokenizer)} if tiny else MISTRAL_7B
    if len(tokenizer) > values["vocab_size"]:
        raise SystemExit(f"{tokenizer_path}: {len(tokenizer)} ids do not fit a {values['vocab_size']}-entry table")
    name = torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"
    nominal = nominal_bound(name)
    if nominal is None and bound is None:
        raise SystemExit(f"no datasheet bf16 figure for {name}: pass a measured bound")
    results: dict[str, Any] = {
        "device_name": name,
        "config": values,
        "shape": asdict(shape),
        "tokenizer": f"{tokenizer_path.name}: {type(tokenizer).__name__}, {len(tokenizer)} ids used as they are",
        "corpus": corpus.name,
        "bound_tflops": nominal or bound,
        "bound_source": "datasheet, dense bf16" if nominal else "measured bf16 matrix product",
        "formula": "3*2*P*T + 4*2*P_lora*T + 4*4*n_layers*H*sum(L_i^2) (checkpointing; module docstring)",
        "target_seconds": TARGET_SECONDS,
        "runs": {},
    }
    started = time.perf_counter()
    recipe = load_recipe(RECIPE, overrides(shape, False))
    encoder = build_encoder(values, tokenizer, device, recipe)
    synchronize(device)
    frozen, lora = projection_parameters(encoder.backbone)
    results["build_seconds"] = time.perf_counter() - started
    results["parameters"] = sum(p.numel() for p in encoder.backbone.parameters())
    results["frozen_projection_parameters"], results["lora_parameters"] = frozen, lora
    results["built_bytes"] = torch.cuda.memory_allocated() if device.startswith("cuda") else None
    report(results)
    sentences = read_sentences(corpus, shape.batch * (shape.warmup + shape.steps))
    for kind in ("padded", "packed"):
        try:
            figures = one_pass_kind(encoder, shape, kind == "packed", sentences, device, deadline)
            results["runs"][kind] = rated(figures, frozen, lora, values, results["bound_tflops"])
        except Exception as error:  # one kind failing (out of memory, say) leaves the other's figures
            results["runs"][kind] = {"error": f"{type(error).__name__}: {str(error)[:400]}"}
        release(encoder, device)  # out of the except block: its traceback no longer holds the kind's tensors
        report(results)
    reference = next((run for run in results["runs"].values() if "flop_per_step" in run), None)
    if reference is not None:
        bound_seconds = reference["flop_per_step"] / (LLM2VEC["bound_tflops"] * 1e12)
        padded_bound = reference["padded_flop_per_step"] / (LLM2VEC["bound_tflops"] * 1e12)
        results["llm2vec"] = {
            **LLM2VEC,
            "bound_seconds": bound_seconds,
            "bound_fraction": bound_seconds / LLM2VEC["seconds_per_step"],
            "padded_bound_fraction": padded_bound / LLM2VEC["seconds_per_step"],
        }
        report(results)
    return results


def main() -> None:
    sys.path.insert(0, str(REPO / "benchmarks"))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="a toy Mistral, 4 sentences of up to 32 tokens (tests)")
    parser.add_argument("--tokenizer", type=Path, help="a tokenizer folder (default: csekit's minilm-l6)")
    parser.add_argument("--corpus", type=Path, help=f"default: $CSEKIT_DATA/{DECODER_CORPUS}")
    args = parser.parse_args()
    from csekit.data.data_dir import resolve_data_dir
    from csekit.encoding.hub import resolve_model_path

    tokenizer = args.tokenizer or Path(resolve_model_path("minilm-l6"))
    corpus = args.corpus or resolve_data_dir() / DECODER_CORPUS
    bound = None
    if args.device == "cpu" or nominal_bound(torch.cuda.get_device_name()) is None:
        from gpu_throughput import matmul_bound

        bound = matmul_bound(args.device, 256 if args.tiny else 8192, 3 if args.tiny else 20)
    print(json.dumps(measure(args.device, tokenizer, corpus, args.tiny, bound), indent=1, default=str))


if __name__ == "__main__":
    main()

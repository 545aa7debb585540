"""Peak memory of an LLM2Vec-style training step on a random 1B-parameter Llama: fp32 against bf16 weights.

    PYTHONPATH=src python benchmarks/decoder_memory.py                  # the three settings, one process each
    PYTHONPATH=src python benchmarks/decoder_memory.py --one bf16/bf16  # weights/precision, in this process

The model has TinyLlama-1.1B's shape (22 layers, width 2,048, MLP 5,632, 32 query and 4 key/value heads, 32,000
tokens: 1.03B parameters without the LM head, which a sentence encoder does not have), randomly initialised
directly in the weights' dtype (no file is written or read), with bidirectional attention, mean pooling, attention
dropout 0.3, LoRA r 16 on every projection and `run.gradient_checkpointing`, as llm2vec-simcse-*.yaml; the batch
is 4 sentences of 128 tokens in SimCSE's two dropout views. The step is csekit's: the recipe's model
(`build_run_model`), forward under the precision's autocast, backward, and AdamW's step over the adapters
(`make_optimizer`).

`--return-freed-memory`: on a CPU, glibc returns every freed block of 128 KiB or more at once, so the peak is
about the live tensors' (the trainer instead keeps freed memory for speed, `run.keep_freed_memory`, the default).

Settings: fp32 weights in fp32, fp32 weights under bf16 autocast (`train.precision: bf16`), and bf16 weights under
bf16 autocast (`model.weights_dtype: bf16`). Each runs in a fresh process. The figure is the step's peak resident set
size (VmHWM, reset once the model is built, so random initialisation's own peak does not count; what the operating
system had to give the process); beside it, the resident size once the model is built, the peak while building it
(ru_maxrss), and the bytes of the weights. On a GPU (`--device cuda`) the figures are torch's allocator's
(`torch.cuda.max_memory_allocated` from the built model on). It prints no time: timing is for a quiet machine (add
`--steps N` and time the command there).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # tiny_decoders: a decoder tokenizer built offline

SETTINGS = ("fp32/fp32", "fp32/bf16", "bf16/bf16")
"""weights dtype / training precision."""

LLAMA_1B = {
    "vocab_size": 32_000,
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_hidden_layers": 22,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "max_position_embeddings": 2048,
    "attention_dropout": 0.3,  # LLM2Vec's SimCSE dropout
}
"""TinyLlama-1.1B's config (a Llama-2 architecture of 1.1B parameters)."""

TINY_LLAMA = {
    **LLAMA_1B,
    **{"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "vocab_size": 512},
    **{"num_attention_heads": 4, "num_key_value_heads": 2},
}
"""`--tiny`: the same code path on a toy model (tests/runs/test_gpu_check.py runs the GPU command's decoder_memory stage
on a CPU)."""

BATCH, LENGTH = 4, 128


def status_mib(key: str) -> float:
    """A size from /proc/self/status (VmRSS: resident now; VmHWM: its peak since start or the last reset), in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def reset_peak_resident() -> bool:
    """Start VmHWM again from the resident size now (Linux 4.0 on: 5 into /proc/self/clear_refs); whether it could."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def one_setting(
    setting: str,
    device: str,
    steps: int,
    checkpointing: bool = True,
    return_freed: bool = False,
    batch: int = BATCH,
    tiny: bool = False,
) -> dict[str, Any]:
    """Build the model in `setting` (weights/precision), take `steps` training steps; the memory figures.

    On a CPU the process's allocator is set as the trainer sets it (`run.keep_freed_memory`: glibc keeps freed
    blocks for reuse), or with `return_freed` the other way: every block of 128 KiB or more is returned to the
    operating system when freed, so the resident size follows the live tensors."""
    from tiny_decoders import DECODER_WORDS, make_decoder_tokenizer
    from transformers import AutoConfig, AutoModel

    from csekit.encoding.encoder import SentenceEncoder
    from csekit.encoding.lora import add_lora
    from csekit.encoding.pooling import make_pooler
    from csekit.training.execution import build_run_model, decide_execution
    from csekit.training.optimization import make_optimizer
    from csekit.training.processes import keep_freed_memory
    from csekit.training.recipe import load_recipe

    weights, precision = setting.split("/")
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[weights]
    recipe = load_recipe(
        REPO / "recipes" / "llm2vec-simcse-sheared-llama.yaml",
        [
            f"model.max_length={LENGTH}",
            f"model.weights_dtype={weights}",
            f"train.batch_size={batch}",
            f"train.precision={precision}",
            f"run.gradient_checkpointing={str(checkpointing).lower()}",
        ],
    )
    execution = decide_execution(recipe, device_type=torch.device(device).type)
    if return_freed and execution.device_type == "cpu":
        keep_freed_memory(128 * 1024)  # the thresholds to glibc's initial 128 KiB, kept there
    else:
        execution.prepare_process()  # as the trainer: run.keep_freed_memory on a CPU
    torch.manual_seed(0)
    config = AutoConfig.for_model("llama", **(TINY_LLAMA if tiny else LLAMA_1B))
    config.is_causal = False  # bidirectional (model.attention)
    with torch.device(device):  # built where it trains: a GPU initialises 1B random weights in a blink, a CPU not
        backbone = AutoModel.from_config(config, dtype=dtype)
    parameters = sum(p.numel() for p in backbone.parameters())
    weight_bytes = sum(p.numel() * p.element_size() for p in backbone.parameters())
    backbone = add_lora(backbone, recipe.model.lora)
    tokenizer = make_decoder_tokenizer()
    if tiny:  # the toy vocabulary: the tokenizer's ids must fit the embedding table
        backbone.resize_token_embeddings(len(tokenizer))
    encoder = SentenceEncoder(backbone, tokenizer, make_pooler("mean"))
    model, views = build_run_model(recipe, encoder, execution)
    model.train()
    optimizer = make_optimizer(model, recipe)
    rng = random.Random(0)
    words = [word for word in DECODER_WORDS if word.isalpha()]
    sentences = [" ".join(rng.choices(words, k=LENGTH)) for _ in range(batch)]  # truncated at max_length
    built, building_peak = status_mib("VmRSS"), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
        built = torch.cuda.memory_allocated() / 2**20
    elif not reset_peak_resident():  # the building's peak (random initialisation) must not pass for the step's
        raise SystemExit("cannot reset the peak resident size (/proc/self/clear_refs): Linux 4.0 or later needed")
    autocast = torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=precision == "bf16")
    step_seconds = []
    for _ in range(steps):
        started = time.perf_counter()
        inputs = views(sentences)
        inputs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
        with autocast:
            loss, _ = model(inputs, sentences)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        step_seconds.append(time.perf_counter() - started)
    peak = torch.cuda.max_memory_allocated() / 2**20 if device.startswith("cuda") else status_mib("VmHWM")
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {
        "setting": setting,
        "batch": batch,
        "step_seconds": step_seconds,  # the first includes warm-up; time only on a quiet machine
        "parameters": parameters,
        "trainable": trainable,
        "weights_mib": weight_bytes / 2**20,
        "built_mib": built,
        "building_peak_mib": building_peak,
        "peak_mib": peak,
        "loss": float(loss.detach()),
    }


def setting_in_process(
    setting: str, device: str, steps: int, extra: list[str], timeout: float | None = None
) -> dict[str, Any]:
    """`one_setting` in a fresh process (`extra`: more options of this script): its figures, or {"error": why}
    (the last line of its error output). A timeout raises subprocess.TimeoutExpired."""
    command = [sys.executable, __file__, "--one", setting, "--device", device, "--steps", str(steps), *extra]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()
        return {"error": tail[-1][:300] if tail else f"exit {done.returncode}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--one", choices=SETTINGS, help="run one setting in this process and print its JSON")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--no-checkpointing", action="store_true", help="run.gradient_checkpointing: false")
    parser.add_argument("--batch", type=int, default=BATCH, help="sentences a step (two views each)")
    parser.add_argument("--tiny", action="store_true", help="a toy Llama instead of the 1B one (tests)")
    parser.add_argument(
        "--return-freed-memory", action="store_true", help="on a CPU, glibc returns freed blocks of 128 KiB or more"
    )
    args = parser.parse_args()
    if args.one:
        print(
            json.dumps(
                one_setting(
                    args.one,
                    args.device,
                    args.steps,
                    not args.no_checkpointing,
                    args.return_freed_memory,
                    args.batch,
                    args.tiny,
                )
            )
        )
        return
    from csekit.core.precision import cpu_model_and_flags

    if args.device.startswith("cuda"):
        where = torch.cuda.get_device_name()
    else:
        where = f"{cpu_model_and_flags()[0]}, {len(os.sched_getaffinity(0))} cores"
    run = f"batch {BATCH} x 2 views x {LENGTH} tokens, LoRA r 16, {'no ' if args.no_checkpointing else ''}checkpointing"
    freed = "freed blocks returned" if args.return_freed_memory else "freed memory kept (run.keep_freed_memory)"
    print(f"# {where}; torch {torch.__version__}; {run}; {freed}")
    columns = ("weights / precision", "parameters", "trainable", "weights", "peak while building", "once built")
    print(f"| {' | '.join(columns)} | peak of the step |")
    print("|---|---|---|---|---|---|---|")
    for setting in SETTINGS:
        extra = ["--no-checkpointing"] if args.no_checkpointing else []
        extra += ["--return-freed-memory"] if args.return_freed_memory else []
        row = setting_in_process(setting, args.device, args.steps, extra)
        if "error" in row:
            print(f"| {setting} | failed: {row['error']} |")
            continue
        gib = [f"{row[key] / 1024:.2f} GiB" for key in ("weights_mib", "building_peak_mib", "built_mib", "peak_mib")]
        print(f"| {setting} | {row['parameters'] / 1e9:.2f}B | {row['trainable'] / 1e6:.1f}M | {' | '.join(gib)} |")


if __name__ == "__main__":
    main()

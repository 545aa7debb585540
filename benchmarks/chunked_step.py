"""Memory and time of a chunked training step (`run.chunk_size`) against the unchunked step, by global batch.

    python benchmarks/chunked_step.py                                    # MiniLM, batch 64/256/1024, chunk 32
    python benchmarks/chunked_step.py --small                            # a 2-layer, 128-wide random BERT
    python benchmarks/chunked_step.py --batches 64 256 --unchunked-up-to 256 --max-length 16
    python benchmarks/chunked_step.py --small --alternate 256 --steps 5  # time ratio, steps in turns

Each (batch, chunk) runs in its own process, so that the process's peak resident memory (RSS, on CPU)
is that step's: the model, optimizer and one batch are set up, then `--warmup` and `--steps` steps of
the training loop's own step (`forward_backward` with accelerate, AdamW) are taken. Printed per row:
the median seconds per step, peak RSS, and peak RSS above the RSS after setting up (the step's own memory); on a
GPU also `torch.cuda.max_memory_allocated`. The unchunked step runs only up to `--unchunked-up-to`
(where it fits). Targets (issue #30): the chunked step's memory grows with the batch by at most the
representations' size (not the activations'), and it costs at most 1.4x the unchunked step of the same
batch on CPU.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
WORDS = (
    "a man woman child dog cat plays runs walks sits eats reads the park street house guitar ball food music "
    "quickly slowly on in with near red blue big small old young is are was were and not very"
).split()


def cpu_name() -> str:
    """The CPU's model name, its core count and whether it has AVX-512 (what decides a CPU step's speed)."""
    from csekit.core.precision import cpu_model_and_flags

    name, flags = cpu_model_and_flags()
    vector = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    return f"{name}, {torch.get_num_threads()} threads, {vector}"


def sentences(count: int, seed: int = 0) -> list[str]:
    """Made-up sentences of 6 to 20 words (a spread of lengths, as a corpus has)."""
    rng = random.Random(seed)
    return [" ".join(rng.choices(WORDS, k=rng.randint(6, 20))) for _ in range(count)]


def rss_mib() -> float:
    """This process's peak resident memory so far, MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def current_rss_mib() -> float:
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text(encoding="utf-8").splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return rss_mib()


def set_up(args: argparse.Namespace, batch_size: int) -> tuple[Callable[[int | None], None], bool]:
    """The training loop's step on one fixed batch, as a function of the chunk size; and whether on a GPU."""
    from accelerate import Accelerator

    from csekit.data.corpus import TrainCollator
    from csekit.encoding.encoder import SentenceEncoder
    from csekit.training.execution import build_run_model
    from csekit.training.optimization import forward_backward, make_optimizer
    from csekit.training.processes import MIXED_PRECISION, keep_freed_memory
    from csekit.training.recipe import load_recipe

    keep_freed_memory()  # as the trainer does on CPU
    overrides = [
        f"model.backbone={args.model}",
        f"train.batch_size={batch_size}",
        f"model.max_length={args.max_length}",
    ]
    recipe = load_recipe(args.recipe, overrides)
    torch.manual_seed(0)
    model, views = build_run_model(recipe, SentenceEncoder.load(recipe.model.backbone, recipe.model.pooler))
    accelerator = Accelerator(mixed_precision=MIXED_PRECISION[args.precision])
    model, optimizer = accelerator.prepare(model, make_optimizer(model, recipe))
    model.train()
    batch = TrainCollator(views, recipe.data.text_column)(sentences(batch_size))
    batch["inputs"] = {key: value.to(accelerator.device) for key, value in batch["inputs"].items()}
    cuda = accelerator.device.type == "cuda"

    def step(chunk_size: int | None) -> None:
        forward_backward(accelerator, model, batch, recipe.train.max_grad_norm, 1000, 1000, chunk_size)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()

    return step, cuda


def one(args: argparse.Namespace, batch_size: int, chunk_size: int | None) -> dict[str, float | int | None]:
    """Set up, take the steps, and measure (in this process)."""
    step, cuda = set_up(args, batch_size)
    set_up_rss = current_rss_mib()
    for _ in range(args.warmup):
        step(chunk_size)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(args.steps):
        started = time.perf_counter()
        step(chunk_size)
        times.append(time.perf_counter() - started)
    return {
        "batch": batch_size,
        "chunk": chunk_size,
        "seconds_per_step": statistics.median(times),  # the median: shared machines have slow moments
        "peak_rss_mib": rss_mib(),
        "step_rss_mib": rss_mib() - set_up_rss,
        "cuda_max_allocated_mib": torch.cuda.max_memory_allocated() / 2**20 if cuda else None,
    }


def alternate(args: argparse.Namespace, batch_size: int) -> None:
    """Unchunked and chunked steps in turns in one process; the fastest of each (the least disturbed by other
    load on a shared machine) and their ratio. No memory figures (one process holds both)."""
    step, _ = set_up(args, batch_size)
    times: dict[int | None, list[float]] = {None: [], args.chunk: []}
    for round_ in range(args.warmup + args.steps):
        for chunk_size in times:
            started = time.perf_counter()
            step(chunk_size)
            if round_ >= args.warmup:
                times[chunk_size].append(time.perf_counter() - started)
    fastest = {chunk_size: min(values) for chunk_size, values in times.items()}
    print(
        f"batch {batch_size}, in turns, fastest of {args.steps}: unchunked {fastest[None]:.2f} s, chunk {args.chunk} "
        f"{fastest[args.chunk]:.2f} s: {fastest[args.chunk] / fastest[None]:.2f}x"
    )


def save_small_model(folder: Path) -> str:
    """A randomly initialised 2-layer, 128-wide BERT with MiniLM's tokenizer (for a short run on a small CPU)."""
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    from csekit.encoding.encoder import SentenceEncoder
    from csekit.encoding.hub import resolve_model_path
    from csekit.encoding.pooling import make_pooler

    source = resolve_model_path("minilm-l6")
    config = AutoConfig.from_pretrained(
        source, num_hidden_layers=2, hidden_size=128, num_attention_heads=2, intermediate_size=512
    )
    torch.manual_seed(0)
    encoder = SentenceEncoder(AutoModel.from_config(config), AutoTokenizer.from_pretrained(source), make_pooler("cls"))
    encoder.save(folder)
    return str(folder)


def run_in_own_process(
    args: argparse.Namespace, batch_size: int, chunk_size: int | None, model: str
) -> dict[str, object]:
    arguments = [*sys.argv[1:], "--model", model]
    command = [sys.executable, __file__, "--one", str(batch_size), str(chunk_size or 0), *arguments]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        return {"batch": batch_size, "chunk": chunk_size, "error": result.stderr.strip().splitlines()[-1:]}
    return json.loads(result.stdout.strip().splitlines()[-1])


def print_row(row: dict[str, object]) -> None:
    chunk = row["chunk"] or "none"
    if "error" in row:
        print(f"{row['batch']:>6} {chunk!s:>6}  failed: {row['error']}", flush=True)
        return
    cuda = f" {row['cuda_max_allocated_mib']:>10.0f}" if row["cuda_max_allocated_mib"] is not None else ""
    print(
        f"{row['batch']:>6} {chunk!s:>6} {row['seconds_per_step']:>9.2f} {row['peak_rss_mib']:>9.0f} "
        f"{row['step_rss_mib']:>9.0f}{cuda}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", type=Path, default=REPO / "recipes" / "quickstart.yaml")
    parser.add_argument("--model", default="minilm-l6", help="model.backbone (default: minilm-l6)")
    parser.add_argument("--batches", type=int, nargs="+", default=[64, 256, 1024], help="global batch sizes")
    parser.add_argument("--chunk", type=int, default=32, help="run.chunk_size (rows a pass)")
    parser.add_argument("--unchunked-up-to", type=int, default=1024, help="largest batch also run unchunked")
    parser.add_argument("--max-length", type=int, default=32)
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--alternate", type=int, metavar="BATCH", help="time both steps in turns at this batch")
    parser.add_argument("--small", action="store_true", help="a small random BERT instead of --model")
    parser.add_argument("--one", type=int, nargs=2, metavar=("BATCH", "CHUNK"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        batch_size, chunk_size = args.one
        print(json.dumps(one(args, batch_size, chunk_size or None)))
        return
    with tempfile.TemporaryDirectory(prefix="chunked-step-") as folder:
        model = save_small_model(Path(folder) / "small-bert") if args.small else args.model
        label = "a 2-layer 128-wide random BERT" if args.small else args.model
        print(f"{cpu_name()}; torch {torch.__version__}; {label}, {args.precision}, max length {args.max_length}")
        if args.alternate:
            args.model = model
            alternate(args, args.alternate)
            return
        cuda = " cuda MiB" if torch.cuda.is_available() else ""
        print(f"{'batch':>6} {'chunk':>6} {'s/step':>9} {'peak MiB':>9} {'step MiB':>9}{cuda}")
        for batch_size in args.batches:
            for chunk_size in (None, args.chunk):
                if chunk_size is None and batch_size > args.unchunked_up_to:
                    continue
                print_row(run_in_own_process(args, batch_size, chunk_size, model))


if __name__ == "__main__":
    main()

"""Training throughput on a GPU: csekit's SimCSE step against sentence-transformers' MNRL recipe, and the bound.

    python benchmarks/gpu_throughput.py --assets .gpu/assets [--batches 64 512] [--profile 512]

A randomly initialised BERT-base (transformers' BertConfig defaults, all-MiniLM-L6-v2's WordPiece tokenizer
from `--assets/tokenizer-bert`), [CLS] pooling, max length 32, bf16 autocast, AdamW at lr 3e-5, the same
batches of real sentences (`--assets/corpus.txt`) for every variant, in one process:

  csekit step      the trainer's own step (`profile_step.csekit_step`: collation, forward_backward with
                   gradient clipping, the logged loss's all-reduce, AdamW), batch moved to the GPU
  csekit loop      `csekit.training.trainer.train` itself (data loading, logging), from its metrics.jsonl
  ST MNRL          sentence-transformers: `MultipleNegativesRankingLoss` on (s, s) pairs (its unsupervised
                   SimCSE recipe) in a plain loop (tokenise, forward, backward, AdamW): no Trainer overhead
  ST CMNRL         the same with `CachedMultipleNegativesRankingLoss` (GradCache, mini-batches of 32)

Each step's matrix-product FLOPs (forward and backward, `torch.utils.flop_counter`) over its median time is
a rate, printed as a fraction of the bf16 rate a large square product reaches on this GPU (the bound).
With `--profile B` it prints torch.profiler's kernels by GPU time and the CPU operators by self time for
csekit's step at batch B.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
MAX_LENGTH = 32


def matmul_bound(size: int = 8192, repeats: int = 20) -> float:
    """TFLOP/s of a large square bf16 product on random data, median of CUDA-event timings."""
    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return 2 * size**3 / statistics.median(times) / 1e12


def random_bert_base(assets: Path, folder: Path) -> Path:
    from transformers import AutoConfig, AutoTokenizer

    from csekit.encoding.encoder import SentenceEncoder

    tokenizer = AutoTokenizer.from_pretrained(assets / "tokenizer-bert")
    torch.manual_seed(0)
    config = AutoConfig.for_model("bert", vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id)
    SentenceEncoder.from_config(config, tokenizer, pooler="cls").save(folder)
    return folder


def seconds_per_step(step: Callable[[list[str]], None], batches: list[list[str]], warmup: int = 3) -> float:
    """Median wall time of a step, the GPU synchronised around each (each step ends on the host anyway)."""
    for texts in batches[:warmup]:
        step(texts)
    torch.cuda.synchronize()
    times = []
    for texts in batches[warmup:]:
        started = time.perf_counter()
        step(texts)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def flops_of(step: Callable[[list[str]], None], texts: list[str]) -> int:
    with FlopCounterMode(display=False) as counter:
        step(texts)
    return counter.get_total_flops()


def csekit_step(model_dir: Path, batch: int) -> Callable[[list[str]], None]:
    """The trainer's step (profile_step.csekit_step) with the collated batch moved to the GPU."""
    from accelerate import Accelerator
    from accelerate.utils import send_to_device

    from csekit.data.corpus import TrainCollator
    from csekit.encoding.encoder import SentenceEncoder
    from csekit.training.model import build_model
    from csekit.training.optimization import forward_backward, make_optimizer
    from csekit.training.processes import MIXED_PRECISION
    from csekit.training.recipe import load_recipe

    overrides = [f"model.backbone={model_dir}", f"train.batch_size={batch}", f"model.max_length={MAX_LENGTH}"]
    recipe = load_recipe(REPO / "recipes" / "quickstart.yaml", [*overrides, "model.pooler=cls"])
    model, views = build_model(recipe, SentenceEncoder.load(model_dir, "cls"))
    optimizer = make_optimizer(model, recipe)
    accelerator = Accelerator(mixed_precision=MIXED_PRECISION["bf16"])
    model, optimizer = accelerator.prepare(model, optimizer)
    model.train()
    collate = TrainCollator(views, recipe.data.text_column)

    def step(texts: list[str]) -> None:
        batch_on_gpu = send_to_device(collate(texts), accelerator.device)
        loss, parts, _ = forward_backward(accelerator, model, batch_on_gpu, recipe.train.max_grad_norm)
        accelerator.reduce(torch.stack([loss.detach(), *parts.values()]).float(), "mean").tolist()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def csekit_loop(model_dir: Path, corpus: Path, batch: int, steps: int) -> float:
    """Seconds a step of `csekit.training.trainer.train`, from its logged rates after the first window."""
    from csekit.training.recipe import load_recipe
    from csekit.training.trainer import train

    overrides = [
        f"model.backbone={model_dir}",
        "model.pooler=cls",
        f"model.max_length={MAX_LENGTH}",
        f"data.corpus={corpus}",
        f"train.batch_size={batch}",
        f"train.max_steps={steps}",
        "train.precision=bf16",
        "train.dev_task=none",
        "train.eval_every=0",
        "train.log_every=10",
    ]
    with tempfile.TemporaryDirectory() as folder:
        train(load_recipe(REPO / "recipes" / "quickstart.yaml", overrides), Path(folder) / "run", show_progress=False)
        records = [json.loads(x) for x in (Path(folder) / "run" / "metrics.jsonl").read_text().splitlines()]
    rates = [record["sentences_per_second"] for record in records if "sentences_per_second" in record][1:]
    return batch / statistics.median(rates)


def st_step(model_dir: Path, cached: bool) -> Callable[[list[str]], None]:
    """sentence-transformers' SimCSE step: (s, s) pairs through MNRL (or its cached form), bf16 autocast, AdamW."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.losses import CachedMultipleNegativesRankingLoss, MultipleNegativesRankingLoss

    model = SentenceTransformer(str(model_dir), device="cuda")
    model.max_seq_length = MAX_LENGTH
    model.train()
    loss_class = CachedMultipleNegativesRankingLoss if cached else MultipleNegativesRankingLoss
    loss_fn = loss_class(model, scale=20.0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-5)

    def step(texts: list[str]) -> None:
        features = [model.preprocess(texts), model.preprocess(texts)]
        features = [{key: _to_gpu(value) for key, value in feature.items()} for feature in features]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(features, None)
        loss.backward()  # the cached loss runs its mini-batch backward passes inside this call
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss.item()

    return step


def _to_gpu(value: object) -> object:
    return value.to("cuda", non_blocking=True) if isinstance(value, torch.Tensor) else value


def profile_csekit(step: Callable[[list[str]], None], texts: list[str], rows: int = 20) -> None:
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        step(texts)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiler:
        for _ in range(3):
            step(texts)
        torch.cuda.synchronize()
    print("profiled; summarising", flush=True)
    averages = profiler.key_averages()
    print("\ncsekit step, 3 steps: kernels by GPU time")
    print(averages.table(sort_by="cuda_time_total", row_limit=rows))
    print("\ncsekit step, 3 steps: operators by self CPU time")
    print(averages.table(sort_by="self_cpu_time_total", row_limit=rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--assets", type=Path, required=True)
    parser.add_argument("--batches", type=int, nargs="+", default=[64, 512])
    parser.add_argument("--steps", type=int, default=23, help="timed steps a variant (3 of them warm-up)")
    parser.add_argument("--loop-steps", type=int, default=60)
    parser.add_argument("--profile", type=int, default=0, help="profile csekit's step at this batch size")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    import sentence_transformers
    import transformers

    bound = matmul_bound()
    print(
        f"{torch.cuda.get_device_name()}; torch {torch.__version__}, transformers {transformers.__version__}, "
        f"sentence-transformers {sentence_transformers.__version__}; bf16 8192^3 product: {bound:.0f} TFLOP/s"
    )
    sentences = (args.assets / "corpus.txt").read_text(encoding="utf-8").splitlines()
    results: dict[str, dict] = {"bound_tflops": bound}
    with tempfile.TemporaryDirectory() as folder:
        model_dir = random_bert_base(args.assets, Path(folder) / "bert-base-random")
        for batch in args.batches:
            batches = [random.Random(k).sample(sentences, batch) for k in range(args.steps)]
            variants = {
                "csekit step": csekit_step(model_dir, batch),
                "ST MNRL": st_step(model_dir, cached=False),
                "ST CMNRL": st_step(model_dir, cached=True),
            }
            row: dict[str, dict] = {}
            for name, step in variants.items():
                flops = flops_of(step, batches[0])
                seconds = seconds_per_step(step, batches)
                row[name] = {"seconds": seconds, "tflops": flops / seconds / 1e12, "flops": flops}
                print(
                    f"batch {batch}, {name}: {seconds * 1e3:.1f} ms/step, {row[name]['tflops']:.1f} TFLOP/s", flush=True
                )
            if args.profile == batch:
                profile_csekit(variants["csekit step"], batches[0])
            del variants
            torch.cuda.empty_cache()
            seconds = csekit_loop(model_dir, args.assets / "corpus.txt", batch, args.loop_steps)
            row["csekit loop"] = {"seconds": seconds, "tflops": row["csekit step"]["flops"] / seconds / 1e12}
            print(f"batch {batch}, csekit loop: {seconds * 1e3:.1f} ms/step", flush=True)
            results[str(batch)] = row
            if args.output:
                args.output.write_text(json.dumps(results, indent=1), encoding="utf-8")
    print("\n| batch | variant | ms/step | sentences/s | TFLOP/s | of the bound | csekit loop's speed-up |")
    print("|---|---|---|---|---|---|---|")
    for batch in args.batches:
        row = results[str(batch)]
        for name, figures in row.items():
            speedup = row[name]["seconds"] / row["csekit loop"]["seconds"]
            print(
                f"| {batch} | {name} | {figures['seconds'] * 1e3:.1f} | {batch / figures['seconds']:,.0f} | "
                f"{figures['tflops']:.1f} | {figures['tflops'] / bound:.1%} | {speedup:.2f}x |"
            )


if __name__ == "__main__":
    main()

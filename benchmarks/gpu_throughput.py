"""Training throughput on a GPU: csekit's real loop with each key on and off, sentence-transformers, the bound.

    python benchmarks/gpu_throughput.py --assets .gpu/assets [--batches 64 512] [--profile 512]
    python benchmarks/gpu_throughput.py --assets DIR --key model.some_new_key=true,false

A randomly initialised BERT-base (transformers' BertConfig defaults, all-MiniLM-L6-v2's WordPiece tokenizer
from `--assets/tokenizer-bert`), [CLS] pooling, max length 32, bf16 autocast, AdamW at lr 3e-5, sentences
of `--assets/corpus.txt`, in one process (benchmarks/gpu_check.py runs the same measurements in its stages):

  csekit <variant>  `csekit.training.trainer.Trainer`'s own loop: its DataLoader (collation, the copy to the
                    device), `Trainer.step` and what follows it, with the recipe keys of `KEYS` all off, each
                    alone on, and all on (`--key KEY=ON,OFF` adds a key; keys added to KEYS slot in); then
                    all on with the fixed-shape packed pass (`on_top_variants`); a variant that would
                    execute what an earlier one does (`effective_settings`) is listed, not measured
  ST MNRL           sentence-transformers: `MultipleNegativesRankingLoss` on (s, s) pairs (its unsupervised
                    SimCSE recipe), AdamW as its trainer configures it (transformers' default optim
                    `adamw_torch_fused` for torch >= 2.8: fused, no weight decay, gradients clipped at 1.0)
  ST CMNRL          the same with `CachedMultipleNegativesRankingLoss` (GradCache, mini-batches of 32)

Every step time is a window's wall time over its steps, the device synchronised once before and once after
the window (the loop itself never waits between log points when run.sync_free is on). Every variant's
rate uses ONE FLOP count, the matrix-product FLOPs (forward and backward, `torch.utils.flop_counter`) of
csekit's padded step on the same batch size, so a packed step is not charged less. Host syncs per step are
counted in a separate window (`step_tools.counting_syncs`: host reads and CUDA's synchronising calls).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from step_tools import counting_syncs, random_bert_base, synchronize  # benchmarks/ is on a script's path
from torch.utils.flop_counter import FlopCounterMode

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
MAX_LENGTH = 32
LR = 3e-5

KEYS: dict[str, tuple[str, str]] = {
    "run.packed": ("true", "false"),
    "run.fused_qkv": ("true", "false"),
    "run.sync_free": ("true", "false"),
    "run.fast_dropout": ("true", "false"),
    "run.num_workers": ("2", "0"),
}
"""The csekit keys measured on and off: key -> (on, off). run.compile runs apart (gpu_check's last stage).
run.fused_qkv acts inside the packed pass only: alone (packing off) it is "all off" again, a row `run_batch`
drops as a repeat (`distinct_variants`)."""


def packed_bucket(batch: int) -> int:
    """`run.packed_bucket` for a batch of `batch` sentences (two views, max length 32: about 28 real tokens a
    sentence): a few buckets cover a random batch's token count (its spread grows as the square root of the
    batch), and torch.compile recompiles the layer stack once a bucket (8 times at most by default)."""
    return 256 * max(1, batch // 128)


def on_top_variants(batch: int) -> dict[str, list[str]]:
    """Keys that act only inside the packed pass and only pay under run.compile (issue "Speed IV", Build 2),
    measured on top of all keys on."""
    bucket = f"run.packed_bucket={packed_bucket(batch)}"
    return {f"all on, {bucket}": [bucket]}


Step = Callable[[], None]


def matmul_bound(device: str = "cuda", size: int = 8192, repeats: int = 20) -> float:
    """TFLOP/s of a large square bf16 product on random data, median of timed products."""
    a = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    synchronize(device)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        a @ b
        synchronize(device)
        times.append(time.perf_counter() - started)
    return 2 * size**3 / statistics.median(times) / 1e12


def key_variants(keys: dict[str, tuple[str, str]]) -> dict[str, list[str]]:
    """Variant name -> recipe overrides: all keys off, each key alone on, all keys on."""
    off = {key: values[1] for key, values in keys.items()}
    variants = {"all off": [f"{k}={v}" for k, v in off.items()]}
    for key, (on, _) in keys.items():
        variants[f"{key}={on}"] = [f"{k}={on if k == key else v}" for k, v in off.items()]
    variants["all on"] = [f"{k}={values[0]}" for k, values in keys.items()]
    return variants


def effective_settings(overrides: list[str], device: str) -> str:
    """What the loop with `overrides` executes on `device` once every `auto` and every key that acts only with
    another is resolved (csekit's own `decide_execution` and pass plan): two variants with the same string run
    the same step."""
    import dataclasses

    from transformers import AutoConfig, AutoModel

    from csekit.training.execution import decide_execution
    from csekit.training.recipe import load_recipe

    recipe = load_recipe(REPO / "recipes" / "quickstart.yaml", overrides)
    execution = decide_execution(recipe, device_type=torch.device(device).type)
    with torch.device("meta"):  # the layout alone decides whether the packed pass runs it: no weights
        backbone = AutoModel.from_config(AutoConfig.from_pretrained(recipe.model.backbone))
    plan = execution.pass_plan(backbone, recipe.model.max_length)
    run = recipe.run
    settings = {
        "plan": {f.name: getattr(plan, f.name) for f in dataclasses.fields(plan) if f.name != "layer_stack"},
        "compiled_stack": plan.layer_stack is not None,
        "precision": execution.precision,
        "sync_free": execution.sync_free,
        "loader": dataclasses.asdict(execution.loader),
        "run": {key: getattr(run, key) for key in ("fast_dropout", "compile", "chunk_size", "gradient_checkpointing")},
    }
    return json.dumps(settings, sort_keys=True, default=str)


def distinct_variants(
    variants: dict[str, list[str]], settings: Callable[[list[str]], str]
) -> tuple[dict[str, list[str]], dict[str, str]]:
    """`variants` without those whose `settings` repeat an earlier one's, and for each dropped, the one it repeats."""
    kept: dict[str, list[str]] = {}
    seen: dict[str, str] = {}
    repeats: dict[str, str] = {}
    for name, overrides in variants.items():
        key = settings(overrides)
        if key in seen:
            repeats[name] = seen[key]
            continue
        seen[key] = name
        kept[name] = overrides
    return kept, repeats


def loop_overrides(model_dir: Path, corpus: Path, batch: int, precision: str) -> list[str]:
    """The quickstart recipe as the measured loop: the model, [CLS], max length 32, no evaluation, rare logs."""
    return [
        f"model.backbone={model_dir}",
        "model.pooler=cls",
        f"model.max_length={MAX_LENGTH}",
        f"data.corpus={corpus}",
        f"train.batch_size={batch}",
        f"train.lr={LR}",
        "train.max_steps=100000",
        "train.log_every=100000",
        "train.dev_task=none",
        "train.eval_every=0",
        f"train.precision={precision}",
    ]


@contextlib.contextmanager
def csekit_loop(overrides: list[str], folder: Path) -> Iterator[tuple[Step, Any]]:
    """The trainer's loop, one step a call (its DataLoader's next batch, `Trainer.step`, what follows it)."""
    from csekit.training.processes import own_accelerator_state
    from csekit.training.recipe import load_recipe
    from csekit.training.trainer import Trainer

    recipe = load_recipe(REPO / "recipes" / "quickstart.yaml", overrides)
    with contextlib.ExitStack() as held:
        held.enter_context(own_accelerator_state())
        trainer = Trainer(recipe, folder, None, False, False, False, held)
        trainer._start_progress()
        trainer.model.train()
        batches = trainer._batches()

        def step() -> None:
            trainer.step(next(batches))
            trainer._after_step()

        yield step, trainer


def st_step(model_dir: Path, cached: bool, sentences: list[str], batch: int, device: str, precision: str) -> Step:
    """sentence-transformers' SimCSE step on random batches of `sentences`: (s, s) pairs through MNRL (or its
    cached form), autocast at `precision`, gradients clipped at 1.0, fused AdamW as its trainer sets it up."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.losses import CachedMultipleNegativesRankingLoss, MultipleNegativesRankingLoss

    model = SentenceTransformer(str(model_dir), device=device)
    model.max_seq_length = MAX_LENGTH
    model.train()
    loss_fn = (CachedMultipleNegativesRankingLoss if cached else MultipleNegativesRankingLoss)(model, scale=20.0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0, fused=True)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    draw = random.Random(0)

    def step() -> None:
        texts = draw.sample(sentences, batch)
        features = [model.preprocess(texts), model.preprocess(texts)]
        features = [{k: moved(v, device) for k, v in f.items()} for f in features]
        with torch.autocast(torch.device(device).type, dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = loss_fn(features, None)
        loss.backward()  # the cached loss runs its mini-batch backward passes inside this call
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def moved(value: Any, device: str) -> Any:
    """A tensor copied to `device` without waiting (as sentence-transformers' trainer does); others as they are."""
    return value.to(device, non_blocking=True) if isinstance(value, torch.Tensor) else value


def seconds_per_step(step: Step, steps: int, warmup: int, device: str) -> float:
    """A window's wall time over its steps, the device synchronised once before and once after it."""
    for _ in range(warmup):
        step()
    synchronize(device)
    started = time.perf_counter()
    for _ in range(steps):
        step()
    synchronize(device)
    return (time.perf_counter() - started) / steps


def flops_of(step: Step) -> int:
    """Matrix-product FLOPs of one step (forward and backward)."""
    with FlopCounterMode(display=False) as counter:
        step()
    return counter.get_total_flops()


def syncs_per_step(step: Step, steps: int, device: str) -> tuple[float, dict[str, float]]:
    """Host reads and CUDA synchronising calls a step, over `steps` steps (after the timed window)."""
    with counting_syncs(torch.device(device)) as seen:
        for _ in range(steps):
            step()
        synchronize(device)
    kinds = {name: seen.count(name) / steps for name in sorted(set(seen))}
    return len(seen) / steps, kinds


def measure(step: Step, device: str, steps: int, warmup: int, sync_steps: int = 2) -> dict[str, Any]:
    seconds = seconds_per_step(step, steps, warmup, device)
    syncs, kinds = syncs_per_step(step, sync_steps, device)
    return {"seconds": seconds, "syncs_per_step": syncs, "syncs": kinds}


def profile_text(step: Step, device: str, rows: int = 20, steps: int = 3) -> str:
    """torch.profiler's top kernels by device time (on a CPU: operators by self time) over `steps` steps."""
    from torch.profiler import ProfilerActivity, profile

    on_gpu = torch.device(device).type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    step()
    with profile(activities=activities) as profiler:
        for _ in range(steps):
            step()
        synchronize(device)
    sort = "device_time_total" if on_gpu else "self_cpu_time_total"
    return profiler.key_averages().table(sort_by=sort, row_limit=rows, max_name_column_width=70)


def padded_flops(overrides: list[str], folder: Path) -> int:
    """The common FLOP count: a step of the loop with `overrides` (all keys off: padded), after 2 steps."""
    with csekit_loop(overrides, folder) as (step, _):
        for _ in range(2):
            step()
        return flops_of(step)


def measure_loop(overrides: list[str], folder: Path, device: str, steps: int, warmup: int) -> dict[str, Any]:
    """`measure` on the loop with `overrides` (a function, so the trainer is garbage once it returns)."""
    with csekit_loop(overrides, folder) as (step, _):
        return measure(step, device, steps, warmup)


def measure_st(
    model_dir: Path,
    cached: bool,
    sentences: list[str],
    batch: int,
    device: str,
    precision: str,
    steps: int,
    warmup: int,
) -> dict[str, Any]:
    return measure(st_step(model_dir, cached, sentences, batch, device, precision), device, steps, warmup)


def profile_loop(overrides: list[str], folder: Path, device: str) -> str:
    with csekit_loop(overrides, folder) as (step, _):
        return profile_text(step, device)


def with_rates(figures: dict[str, Any], batch: int, flops: int, bound: float) -> dict[str, Any]:
    """`figures` with sentences/s, TFLOP/s on the common FLOP count and the fraction of the bound."""
    tflops = flops / figures["seconds"] / 1e12
    return {**figures, "sentences_per_second": batch / figures["seconds"], "tflops": tflops, "of_bound": tflops / bound}


def run_batch(
    batch: int,
    model_dir: Path,
    corpus: Path,
    device: str,
    precision: str,
    bound: float,
    keys: dict[str, tuple[str, str]],
    steps: int = 20,
    warmup: int = 5,
    report: Callable[[dict[str, Any]], None] = lambda row: None,
) -> dict[str, Any]:
    """One batch size: the common FLOP count, then every variant (most telling first; those of
    `on_top_variants` last) that does not repeat an earlier one's effective settings, `report` after each."""
    sentences = corpus.read_text(encoding="utf-8").splitlines()
    base = loop_overrides(model_dir, corpus, batch, precision)
    variants = key_variants(keys)
    variants.update({name: [*variants["all on"], *more] for name, more in on_top_variants(batch).items()})
    settings: dict[str, str] = {}

    def resolved(overrides: list[str]) -> str:
        return settings.setdefault(" ".join(overrides), effective_settings([*base, *overrides], device))

    variants, repeats = distinct_variants(variants, resolved)
    row: dict[str, Any] = {"variants": {}, "repeats": repeats}
    row["settings"] = {name: json.loads(resolved(overrides)) for name, overrides in variants.items()}
    with tempfile.TemporaryDirectory() as folder:
        row["common_flops"] = padded_flops([*base, *variants["all off"]], Path(folder) / "flops")
        release_memory(device)
        report(row)
        first = [name for name in ("all off", "all on") if name in variants]
        order = [*first, "ST MNRL", "ST CMNRL", *(n for n in variants if n not in first)]
        for name in order:
            try:
                if name == "ST CMNRL":  # 10x the step of the others at batch 512 (1.3 to 1.7 s): fewer steps
                    figures = measure_st(
                        model_dir, True, sentences, batch, device, precision, max(steps // 4, 1), min(warmup, 2)
                    )
                elif name.startswith("ST "):
                    figures = measure_st(
                        model_dir, name == "ST CMNRL", sentences, batch, device, precision, steps, warmup
                    )
                else:
                    run = Path(folder) / f"run{len(row['variants'])}"
                    figures = measure_loop([*base, *variants[name]], run, device, steps, warmup)
                row["variants"][name] = with_rates(figures, batch, row["common_flops"], bound)
            except Exception as error:  # one variant's failure (a key refused on this device) is a result too
                row["variants"][name] = {"error": f"{type(error).__name__}: {str(error)[:300]}"}
            release_memory(device)
            report(row)
    return row


def release_memory(device: str) -> None:
    """Free the last variant's model, optimizer state and cached blocks (a trainer holds reference cycles)."""
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def parse_keys(extra: list[str]) -> dict[str, tuple[str, str]]:
    """KEYS plus `KEY=ON,OFF` entries."""
    keys = dict(KEYS)
    for entry in extra:
        key, _, values = entry.partition("=")
        on, _, off = values.partition(",")
        if not (key and on and off):
            raise SystemExit(f"--key {entry!r}: expected KEY=ON,OFF")
        keys[key] = (on, off)
    return keys


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--assets", type=Path, required=True)
    parser.add_argument("--batches", type=int, nargs="+", default=[64, 512])
    parser.add_argument("--steps", type=int, default=20, help="timed steps a variant (after 5 warm-up steps)")
    parser.add_argument("--key", action="append", default=[], help="another key to measure: KEY=ON,OFF")
    parser.add_argument("--profile", type=int, default=0, help="profile csekit (all keys on) at this batch size")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    import sentence_transformers
    import transformers
    from gpu_check_report import table

    keys = parse_keys(args.key)
    bound = matmul_bound()
    results: dict[str, Any] = {
        "device": torch.cuda.get_device_name(),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "sentence_transformers": sentence_transformers.__version__,
        "bound_tflops": bound,
        "batches": {},
    }
    print(f"{results['device']}; bf16 8192^3 product: {bound:.0f} TFLOP/s", flush=True)
    with tempfile.TemporaryDirectory() as folder:
        model_dir = random_bert_base(args.assets, Path(folder) / "bert-base-random")
        corpus = args.assets / "corpus.txt"
        for batch in args.batches:

            def report(row: dict[str, Any], batch: int = batch) -> None:
                results["batches"][str(batch)] = row
                if args.output:
                    args.output.write_text(json.dumps(results, indent=1), encoding="utf-8")

            run_batch(batch, model_dir, corpus, "cuda", "bf16", bound, keys, args.steps, report=report)
            if args.profile == batch:
                overrides = [*loop_overrides(model_dir, corpus, batch, "bf16"), *key_variants(keys)["all on"]]
                print(profile_loop(overrides, Path(folder) / "profiled", "cuda"))
    print(table(results))


if __name__ == "__main__":
    main()

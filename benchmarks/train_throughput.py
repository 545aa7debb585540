"""Training throughput: csekit SimCSE against sentence-transformers' own unsupervised SimCSE, in one run.

Both train the same backbone on the same corpus with the same batch size, maximum length and precision
(the CPU's native one by default: bf16 where it has AVX512-BF16 or AMX, else fp32; fp32 is measured too
when native is bf16):
csekit through `csekit.training.trainer.train` (its real loop, data loading included), sentence-transformers
through `SentenceTransformerTrainer` with `MultipleNegativesRankingLoss` on (sentence, sentence)
pairs (its documented SimCSE recipe), with a [CLS] pooler to match. Each measurement runs in its own
process, so peak memory (max RSS) is per measurement. Method recipes found in `recipes/` (e.g.
`dclr-minilm.yaml`) are timed too, as step-time ratios to csekit SimCSE, in their steady state: warm-ups
are set to 0 so every auxiliary term runs, and SLT-FAI uses the authors' BookCorpus counts (MiniLM has
bert-base-uncased's vocabulary), with which incomplete-sentence filtering masks about half the sentences.

    python benchmarks/train_throughput.py --steps 20            # the whole comparison, 3 rounds
    python benchmarks/train_throughput.py --steps 20 --no-methods   # csekit against sentence-transformers only
    python benchmarks/train_throughput.py --corpus-memory       # peak memory of 100k / 1M-line corpora
    python benchmarks/train_throughput.py --packed --precision fp32   # padding-free pass against length groups
    python benchmarks/train_throughput.py --steps 20 --variants run.sync_free=false run.sync_free=true
                                    # csekit's loop with each variant's recipe keys (';' joins several),
                                    # in turn each round; ratios to the first variant

After the rounds it prints the limit: each step's matrix-product FLOPs (forward and backward, counted by
`torch.utils.flop_counter`) over its median time, as a fraction of the rate a large matrix product reaches
at the same precision on this CPU (the dense-matmul bound), for csekit and for sentence-transformers.

Method step-time ratios are measured twice: each recipe's real loop in its own process (its s/step and
peak memory), and all recipes in one process taking turns, a few steps each on the same batches, for
several turns (the reported ratio): this machine's speed drifts by 20-30% over minutes, which the
separate runs, minutes apart, cannot cancel and the alternating ones do.

`--packed` times csekit SimCSE (quickstart.yaml) four ways in one process, taking turns on the same batches:
in length groups (`run.packed=false`), padding-free (`run.packed=true`, the CPU default: attention in
length groups), padding-free with attention over the whole batch (`run.length_group_size=0`) and as one
padded pass (`run.length_group_size=0`, `run.packed=false`).

Figures depend on the machine and on what else runs on it: report them with both.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
METHOD_RECIPES = ["dclr-minilm.yaml", "whitenedcse-minilm.yaml", "slt-fai-minilm.yaml", "osscse-minilm.yaml"]


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_csekit(recipe: str, precision: str, steps: int, batch: int, max_length: int, extra: list[str]) -> dict:
    """Train `steps` steps; throughput from metrics.jsonl after the first logging window (warm-up)."""
    from csekit.training.recipe import load_recipe
    from csekit.training.trainer import train

    overrides = [
        f"train.max_steps={steps}",
        "train.dev_task=none",
        "train.eval_every=0",
        "train.log_every=5",
        f"train.precision={precision}",
        f"train.batch_size={batch}",
        f"model.max_length={max_length}",
        "model.pooler=cls",
        *extra,
    ]
    config = load_recipe(REPO / "recipes" / recipe, overrides)
    steady_state_objectives(config.objectives)
    with tempfile.TemporaryDirectory() as folder:
        if config.data.corpus.endswith(".jsonl") and not corpus_exists(config.data.corpus):
            config.data.corpus = surrogate_augmented_corpus(Path(folder), batch * (steps + 1))
        train(config, Path(folder) / "run", show_progress=False)
        records = [json.loads(x) for x in (Path(folder) / "run" / "metrics.jsonl").read_text().splitlines()]
    rates = [r["sentences_per_second"] for r in records if "sentences_per_second" in r][1:]
    rate = sum(rates) / len(rates)
    return {"sentences_per_second": rate, "seconds_per_step": batch / rate}


BOOKCORPUS_COUNTS = "freq/bookcorpus_bert-base-uncased/labels.json"


def steady_state_objectives(objectives: list[dict]) -> list[str]:
    """Every auxiliary term on from the first step, with the authors' BookCorpus counts; the changes made.

    MiniLM shares bert-base-uncased's vocabulary, so those counts fit it.
    """
    changes = []
    for spec in objectives:
        if "start_after_epochs" in spec:
            spec["start_after_epochs"] = 0.0
        if "counts" in spec and spec["counts"] != BOOKCORPUS_COUNTS:
            changes.append(f"counts {spec['counts']} -> {BOOKCORPUS_COUNTS}")
            spec["counts"] = BOOKCORPUS_COUNTS
    return changes


def corpus_exists(corpus: str) -> bool:
    from csekit.core.errors import CsekitError
    from csekit.data.corpus import resolve_corpus_path
    from csekit.data.data_dir import resolve_data_dir

    try:
        return Path(resolve_corpus_path(corpus, resolve_data_dir(None))).exists()
    except CsekitError:
        return False


def surrogate_augmented_corpus(folder: Path, rows: int) -> str:
    """For timing OssCSE without running `csekit augment`: fields of the same lengths, not real ones."""
    from csekit.data.data_dir import resolve_data_dir

    source = resolve_data_dir(None) / "corpus" / "sts_sick_unlabeled_sentences.txt"
    path = folder / "augmented.jsonl"
    with open(path, "w", encoding="utf-8") as handle:
        for sentence in source.read_text(encoding="utf-8").splitlines()[:rows]:
            row = {"text": sentence, "paraphrase": " ".join(reversed(sentence.split())), "negation": f"not {sentence}"}
            handle.write(json.dumps(row) + "\n")
    return str(path)


def run_sentence_transformers(precision: str, steps: int, batch: int, max_length: int) -> dict:
    """sentence-transformers' unsupervised SimCSE: MNRL on (s, s) pairs, the same backbone with [CLS] pooling."""
    from datasets import Dataset
    from sentence_transformers import SentenceTransformerTrainer
    from sentence_transformers.losses import MultipleNegativesRankingLoss
    from sentence_transformers.training_args import SentenceTransformerTrainingArguments
    from transformers import TrainerCallback

    sentences = _corpus_sentences(batch * (steps + 1))
    model = _st_model(max_length)
    dataset = Dataset.from_dict({"anchor": sentences, "positive": sentences})

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.times: list[float] = []

        def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
            self.times.append(time.perf_counter())

    timer = StepTimer()
    with tempfile.TemporaryDirectory() as folder:
        args = SentenceTransformerTrainingArguments(
            output_dir=folder,
            per_device_train_batch_size=batch,
            max_steps=steps,
            learning_rate=3e-5,
            bf16=precision == "bf16",
            use_cpu=True,
            report_to="none",
            save_strategy="no",
            logging_steps=1000,
            dataloader_drop_last=True,
        )
        trainer = SentenceTransformerTrainer(
            model=model,
            args=args,
            train_dataset=dataset,
            loss=MultipleNegativesRankingLoss(model, scale=20.0),
            callbacks=[timer],
        )
        trainer.train()
    window = timer.times[5:]  # after warm-up, like csekit's first logging window
    seconds = (window[-1] - window[0]) / (len(window) - 1)
    return {"sentences_per_second": batch / seconds, "seconds_per_step": seconds}


def step_flops(precision: str, batch: int, max_length: int, samples: int = 4) -> dict:
    """Matrix-product FLOPs of one training step (forward and backward) of csekit and of sentence-transformers,
    averaged over the same `samples` random batches, and the dense-matmul rate this CPU reaches at `precision`.

    FLOPs are counted by `torch.utils.flop_counter` (matrix products, attention included); they depend on the
    batch's lengths, hence the average. The bound is a large square product (`profile_step.matmul_bound`).
    """
    import random

    import torch
    from profile_step import csekit_step, matmul_bound  # benchmarks/ is on the path of a script run from it
    from sentence_transformers.losses import MultipleNegativesRankingLoss
    from torch.utils.flop_counter import FlopCounterMode

    from csekit.core.precision import DTYPES

    sentences = _corpus_sentences(20_000)
    batches = [random.Random(k).sample(sentences, batch) for k in range(samples)]
    csekit = csekit_step(REPO / "recipes" / "quickstart.yaml", precision, batch, max_length)
    st_model = _st_model(max_length)
    st_model.train()
    st_loss = MultipleNegativesRankingLoss(st_model, scale=20.0)

    def st_step(texts: list[str]) -> None:
        features = [st_model.preprocess(texts), st_model.preprocess(texts)]  # (anchor, positive) = (s, s)
        st_loss(features, None).backward()
        st_model.zero_grad(set_to_none=True)

    counts: dict[str, list[int]] = {"csekit": [], "st": []}
    for texts in batches:
        for name, step in (("csekit", csekit), ("st", st_step)):
            with FlopCounterMode(display=False) as counter:
                step(texts)
            counts[name].append(counter.get_total_flops())
    return {
        "bound_gflops": matmul_bound(DTYPES[precision]),
        "csekit_gflop": statistics.mean(counts["csekit"]) / 1e9,
        "st_gflop": statistics.mean(counts["st"]) / 1e9,
        "threads": torch.get_num_threads(),
    }


def _corpus_sentences(limit: int) -> list[str]:
    from csekit.data.data_dir import resolve_data_dir

    corpus = resolve_data_dir(None) / "corpus" / "sts_sick_unlabeled_sentences.txt"
    return corpus.read_text(encoding="utf-8").splitlines()[:limit]


def _st_model(max_length: int):  # type: ignore[no-untyped-def]
    """sentence-transformers' model of the comparison: the backbone with a [CLS] pooler, on CPU."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    from csekit.encoding.hub import resolve_model_path

    transformer = Transformer(resolve_model_path("minilm-l6"), max_seq_length=max_length)
    pooling = Pooling(transformer.auto_model.config.hidden_size, pooling_mode="cls")
    return SentenceTransformer(modules=[transformer, pooling], device="cpu")


def alternate_recipes(
    recipes: list[str], precision: str, batch: int, max_length: int, turns: int, steps_per_turn: int
) -> dict:
    """Seconds per step of each recipe, all built in this process and stepped in turns on the same batches.

    Each step is the training loop's: accelerate's autocast at `precision`, the loop's `forward_backward` on the
    collated batch (fields, step numbers), AdamW. Returns each recipe's list of per-turn
    s/step and each turn's ratio to the first recipe's.
    """
    import random

    from accelerate import Accelerator

    from csekit.data.corpus import TrainCollator, open_corpus
    from csekit.data.data_dir import resolve_data_dir
    from csekit.encoding.encoder import SentenceEncoder
    from csekit.training.execution import build_run_model
    from csekit.training.optimization import forward_backward, make_optimizer
    from csekit.training.processes import MIXED_PRECISION, keep_freed_memory
    from csekit.training.recipe import load_recipe

    keep_freed_memory()
    accelerator = Accelerator(mixed_precision=MIXED_PRECISION[precision])
    with tempfile.TemporaryDirectory() as folder:  # the surrogate OssCSE corpus, if needed
        total = turns * steps_per_turn + 2
        picks = random.Random(0).sample(range(20_000), batch * total)
        steps = {}
        for recipe in recipes:
            # "recipe.yaml+key=value+...": the recipe with these overrides (the same batches, another setting)
            name, *settings = recipe.split("+")
            overrides = [f"train.batch_size={batch}", f"model.max_length={max_length}", "model.pooler=cls", *settings]
            config = load_recipe(REPO / "recipes" / name, overrides)
            steady_state_objectives(config.objectives)
            if config.data.corpus.endswith(".jsonl") and not corpus_exists(config.data.corpus):
                config.data.corpus = surrogate_augmented_corpus(Path(folder), 20_000)
            data = config.data
            corpus = open_corpus(data.corpus, resolve_data_dir(None), data.max_chars, data.bad_lines, data.text_column)
            encoder = SentenceEncoder.load(config.model.backbone, config.model.pooler)
            model, views = build_run_model(config, encoder)
            collate = TrainCollator(views, data.text_column)
            batches = [collate([corpus[i] for i in picks[k * batch : (k + 1) * batch]]) for k in range(total)]
            optimizer = make_optimizer(model, config)
            model, optimizer = accelerator.prepare(model, optimizer)
            model.train()
            clip = config.train.max_grad_norm

            def step(item: dict, model=model, optimizer=optimizer, clip=clip) -> None:  # type: ignore[no-untyped-def]
                forward_backward(accelerator, model, item, clip, step=1000, steps_per_epoch=1000)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)

            steps[recipe] = (step, batches)
        times: dict[str, list[float]] = {recipe: [] for recipe in recipes}
        for step, batches in steps.values():  # warm-up: first steps allocate and build kernels
            for item in batches[-2:]:
                step(item)
        for turn in range(turns):
            for recipe, (step, batches) in steps.items():
                started = time.perf_counter()
                for item in batches[turn * steps_per_turn : (turn + 1) * steps_per_turn]:
                    step(item)
                times[recipe].append((time.perf_counter() - started) / steps_per_turn)
        base = times[recipes[0]]
        ratios = {recipe: [t / b for t, b in zip(values, base, strict=True)] for recipe, values in times.items()}
        return {"seconds_per_step": times, "ratios": ratios}


def corpus_memory(lines: int) -> dict:
    """Peak memory after opening a generated corpus of `lines` lines and reading a few batches."""
    from csekit.data.corpus import Corpus

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "corpus.txt"
        with open(path, "w", encoding="utf-8") as handle:
            for i in range(lines):
                handle.write(f"sentence number {i} about a man playing the guitar in the park .\n")
        before = peak_rss_mib()
        started = time.perf_counter()
        corpus = Corpus(path)
        seconds = time.perf_counter() - started
        _ = [corpus[i] for i in range(0, len(corpus), max(1, len(corpus) // 1000))]
        return {"lines": lines, "scan_seconds": seconds, "peak_rss_mib": peak_rss_mib(), "rss_before_mib": before}


def one(kind: str, args: argparse.Namespace) -> None:
    """Run one measurement in this process and print it as JSON (called by `main` in a subprocess)."""
    import torch

    torch.manual_seed(0)
    name, _, precision = kind.partition(":")
    if name == "alternate":
        precision, _, recipes = precision.partition(":")
        result = alternate_recipes(
            recipes.split(","), precision, args.batch_size, args.max_length, args.turns, args.steps_per_turn
        )
    elif name == "flops":
        result = step_flops(precision, args.batch_size, args.max_length)
    elif name == "st":
        result = run_sentence_transformers(precision, args.steps, args.batch_size, args.max_length)
    elif name == "corpus":
        result = corpus_memory(int(precision))
    else:
        extra = [item for item in args.keys.split(";") if item]
        result = run_csekit(name, precision, args.steps, args.batch_size, args.max_length, extra)
    result["peak_rss_mib"] = max(result.get("peak_rss_mib", 0), peak_rss_mib())
    print(json.dumps({"kind": kind, **result}))


def measure(kind: str, args: argparse.Namespace, keys: str = "") -> dict:
    command = [sys.executable, __file__, "--one", kind, "--steps", str(args.steps), "--keys", keys]
    command += ["--batch-size", str(args.batch_size), "--max-length", str(args.max_length)]
    command += ["--turns", str(args.turns), "--steps-per-turn", str(args.steps_per_turn)]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if done.returncode != 0:
        raise SystemExit(f"{kind} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def cpu_name() -> str:
    """The CPU model as /proc/cpuinfo names it (figures are only comparable on the same CPU)."""
    from csekit.core.precision import cpu_model_and_flags

    return cpu_model_and_flags()[0]


def print_round(results: dict) -> None:
    for kind, r in results.items():
        print(
            f"  {kind:<24} {r['sentences_per_second']:7.1f} sentences/s  {r['seconds_per_step']:.3f} s/step  "
            f"peak RSS {r['peak_rss_mib']:.0f} MiB"
        )


def compare_with_sentence_transformers(args: argparse.Namespace, precision: str) -> dict[str, list[float]]:
    """`args.rounds` rounds of back-to-back runs; each run's seconds per step, by kind.

    This machine's speed drifts by 20-30% over minutes (it is shared), so the runs whose ratio is
    reported are taken back to back in each round, and the median of the rounds' ratios is reported.
    """
    precisions = [precision] if precision == "fp32" else [precision, "fp32"]
    kinds = [kind for p in precisions for kind in (f"st:{p}", f"quickstart.yaml:{p}")]
    seconds: dict[str, list[float]] = {kind: [] for kind in kinds}
    ratios: dict[str, list[float]] = {}
    for round_number in range(1, args.rounds + 1):
        print(f"round {round_number} of {args.rounds}")
        results = {kind: measure(kind, args) for kind in kinds}
        print_round(results)
        for p in precisions:
            ratio = results[f"quickstart.yaml:{p}"]["sentences_per_second"] / results[f"st:{p}"]["sentences_per_second"]
            ratios.setdefault(f"csekit {p} / sentence-transformers {p}", []).append(ratio)
            print(f"  csekit {p} / sentence-transformers {p}: {ratio:.2f}x")
        for kind, r in results.items():
            seconds[kind].append(r["seconds_per_step"])
    print(f"median over {args.rounds} round(s):")
    for name, values in ratios.items():
        print(f"  {name}: {statistics.median(values):.2f}x  (rounds: {', '.join(f'{v:.2f}' for v in values)})")
    return seconds


def compare_variants(args: argparse.Namespace, precision: str) -> None:
    """csekit's loop (quickstart) with each variant's recipe keys, in turn each round; step-time ratios to the first."""
    ratios: dict[str, list[float]] = {}
    for round_number in range(1, args.rounds + 1):
        times = {}
        for keys in args.variants:
            times[keys] = measure(f"quickstart.yaml:{precision}", args, keys)["seconds_per_step"]
        first = times[args.variants[0]]
        print(
            f"round {round_number} (load {os.getloadavg()[0]:.1f}): "
            + "; ".join(f"{keys} {t:.3f} s/step ({t / first:.3f}x)" for keys, t in times.items()),
            flush=True,
        )
        for keys, t in times.items():
            ratios.setdefault(keys, []).append(t / first)
    print(f"median step-time ratio to {args.variants[0]} over {args.rounds} rounds:")
    for keys, values in ratios.items():
        print(f"  {keys:<40} {statistics.median(values):.3f}x  (rounds: {', '.join(f'{v:.3f}' for v in values)})")


def print_bound(args: argparse.Namespace, precision: str, seconds: dict[str, list[float]]) -> None:
    """The step's matrix-product FLOPs over its time, as a fraction of the measured dense-matmul rate."""
    r = measure(f"flops:{precision}", args)
    bound = r["bound_gflops"]
    print(
        f"the limit ({precision}): a 2048x2048 matrix product runs at {bound:.0f} GFLOP/s on {r['threads']} threads; "
        "step FLOPs are the matrix products of forward and backward (torch.utils.flop_counter, mean of 4 batches)"
    )
    for label, kind, key in (
        ("csekit SimCSE", f"quickstart.yaml:{precision}", "csekit_gflop"),
        ("sentence-transformers MNRL", f"st:{precision}", "st_gflop"),
    ):
        step = statistics.median(seconds[kind])
        rate = r[key] / step
        print(
            f"  {label:<27} {r[key]:6.1f} GFLOP a step, {step:.3f} s/step: {rate:5.0f} GFLOP/s = {rate / bound:.0%} of "
            f"the bound (the FLOPs alone take {r[key] / bound:.3f} s at the bound)"
        )
    target = statistics.median(seconds[f"st:{precision}"]) / 3
    print(
        f"  3x sentence-transformers means {target:.3f} s a csekit step; its matrix products alone need "
        f"{r['csekit_gflop'] / bound:.3f} s at the bound"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--max-length", type=int, default=32)
    parser.add_argument(
        "--precision",
        default="native",
        help="native: bf16 where the CPU runs it natively, else fp32 (fp32 is measured too when native is bf16)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds of back-to-back runs (median reported)")
    parser.add_argument("--turns", type=int, default=8, help="turns of the alternating method comparison")
    parser.add_argument("--steps-per-turn", type=int, default=2, help="steps a recipe takes in each turn")
    parser.add_argument("--no-methods", action="store_true", help="skip the method recipes")
    parser.add_argument("--corpus-memory", action="store_true", help="only the 100k / 1M-line corpus figures")
    parser.add_argument("--packed", action="store_true", help="only the padding-free pass against length groups")
    parser.add_argument("--variants", nargs="+", help="recipe keys of each variant of csekit's loop (';' joins)")
    parser.add_argument("--keys", default="", help=argparse.SUPPRESS)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        one(args.one, args)
        return
    from profile_step import native_precision  # benchmarks/ is on the path of a script run from it

    precision = native_precision() if args.precision == "native" else args.precision
    print(
        f"machine: {cpu_name()}, {os.cpu_count()} cores; torch threads default; batch {args.batch_size}, max length "
        f"{args.max_length}, {args.steps} steps; backbone all-MiniLM-L6-v2 ([CLS]); precision {precision}"
    )
    if args.corpus_memory:
        for lines in (100_000, 1_000_000):
            r = measure(f"corpus:{lines}", args)
            grown = r["peak_rss_mib"] - r["rss_before_mib"]
            print(
                f"corpus {lines:>9,} lines: scan {r['scan_seconds']:.1f} s, peak RSS {r['peak_rss_mib']:.0f} MiB "
                f"(+{grown:.0f} MiB for the corpus)"
            )
        return
    if args.packed:
        compare_packing(args, precision)
        return
    if args.variants:
        compare_variants(args, precision)
        return
    seconds = compare_with_sentence_transformers(args, precision)
    print_bound(args, precision, seconds)
    methods = [recipe for recipe in METHOD_RECIPES if (REPO / "recipes" / recipe).exists()]
    if methods and not args.no_methods:
        compare_methods(args, precision, methods)


PACKING_SETTINGS = {
    "length groups": "quickstart.yaml+run.packed=false",
    "padding-free": "quickstart.yaml+run.packed=true",
    "padding-free, attention in one group": "quickstart.yaml+run.packed=true+run.length_group_size=0",
    "one padded pass": "quickstart.yaml+run.packed=false+run.length_group_size=0",
}


def compare_packing(args: argparse.Namespace, precision: str) -> None:
    """The padding-free pass against length groups and one padded pass: one process, turns on the same batches."""
    print(f"csekit SimCSE in one process, {args.turns} turns of {args.steps_per_turn} steps each ({precision}):")
    r = measure(f"alternate:{precision}:" + ",".join(PACKING_SETTINGS.values()), args)
    for label, recipe in PACKING_SETTINGS.items():
        values = r["ratios"][recipe]
        print(
            f"  {label:<36} {statistics.median(r['seconds_per_step'][recipe]):.3f} s/step, "
            f"{statistics.median(values):.3f}x the length groups' step (turns: {', '.join(f'{v:.2f}' for v in values)})"
        )


def compare_methods(args: argparse.Namespace, precision: str, methods: list[str]) -> None:
    print(f"method recipes, {precision}, each in its own process (the real loop; peak memory):")
    for recipe in methods:
        r = measure(f"{recipe}:{precision}", args)
        print(f"  {recipe:<24} {r['seconds_per_step']:.3f} s/step  peak RSS {r['peak_rss_mib']:.0f} MiB")
    print(
        f"method recipes against SimCSE in one process, {args.turns} turns of {args.steps_per_turn} steps each "
        f"on the same batches ({precision}):"
    )
    r = measure(f"alternate:{precision}:" + ",".join(["quickstart.yaml", *methods]), args)
    for recipe, values in r["ratios"].items():
        if recipe == "quickstart.yaml":
            continue
        median_step = statistics.median(r["seconds_per_step"][recipe])
        print(
            f"  {recipe:<24} {median_step:.3f} s/step, {statistics.median(values):.2f}x SimCSE's step "
            f"(turns: {', '.join(f'{v:.2f}' for v in values)})"
        )
    print(f"  SimCSE (quickstart.yaml)   {statistics.median(r['seconds_per_step']['quickstart.yaml']):.3f} s/step")


if __name__ == "__main__":
    main()

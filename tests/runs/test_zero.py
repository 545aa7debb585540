"""DeepSpeed ZeRO under accelerate: the shipped config and what csekit refuses of one (always), and where
DeepSpeed is installed (not a csekit dependency, not in CI) two CPU processes (gloo) that give one process's
update on the global batch, and a launched run that checkpoints, resumes exactly and saves a whole model."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
from conftest import DISTINCT_SENTENCES as SENTENCES
from conftest import make_corpus, tiny_recipe
from safetensors.torch import load_file
from test_distributed import free_port
from test_sharding import (
    MAX_GRAD_NORM,
    assert_same_final_weights,
    build,
    interrupting_recipe,
    launch_train,
    losses,
    one_process_step,
    straight_and_stopped,
)

from csekit.core.errors import CsekitError
from csekit.encoding.encoder import SentenceEncoder
from csekit.training.recipe import Recipe
from csekit.training.zero import ZeroRequest, check_deepspeed_request

DEEPSPEED_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "accelerate-deepspeed.yaml"
HAS_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None
needs_deepspeed = pytest.mark.skipif(
    not HAS_DEEPSPEED, reason="DeepSpeed is not installed (pip install deepspeed; csekit does not depend on it)"
)


def launch_environment(config: Path) -> dict[str, str]:
    """What `accelerate launch --config_file CONFIG` puts in the processes' environment (nothing started)."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_deepspeed_cmd_env

    argv = ["--config_file", str(config), "--num_processes", "2", "-m", "csekit.cli", "train", "r.yaml"]
    args, defaults, _ = _validate_launch_command(launch_command_parser().parse_args(argv))
    fields = list(defaults.deepspeed_config) if defaults else []  # as launch_command sets it
    args.deepspeed_fields_from_accelerate_config = ",".join(fields)
    _, environment = prepare_deepspeed_cmd_env(args)
    return {key: value for key, value in environment.items() if key.startswith("ACCELERATE_")}


def test_shipped_deepspeed_config_asks_for_zero2_and_leaves_clipping_to_the_recipe() -> None:
    environment = launch_environment(DEEPSPEED_CONFIG)
    assert environment["ACCELERATE_USE_DEEPSPEED"] == "true"
    request = ZeroRequest.from_environment(environment)
    assert (request.stage, request.offload_optimizer, request.offload_param) == (2, "none", "none")
    assert request.config_file is None and request.gradient_clipping is None and request.gradient_accumulation == 1


@pytest.fixture
def deepspeed_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """As if DeepSpeed were installed, so the checks after the install check are reached."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "deepspeed" else real(name))


@pytest.mark.parametrize(
    ("setting", "needle"),
    [
        ({"ACCELERATE_DEEPSPEED_ZERO_STAGE": "4"}, "ZeRO stage 4; csekit trains under stages 1, 2 and 3"),
        ({"ACCELERATE_DEEPSPEED_ZERO3_INIT": "true"}, "zero3_init_flag: true"),
        ({"ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE": "cpu"}, "offload"),
        ({"ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE": "nvme"}, "offload"),
        ({"ACCELERATE_DEEPSPEED_CONFIG_FILE": "ds.json"}, "DeepSpeed config file (ds.json)"),
        ({"ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "4"}, "gradient_accumulation_steps"),
        ({"ACCELERATE_GRADIENT_CLIPPING": "1.0"}, "gradient_clipping: 1, the recipe train.max_grad_norm: 0.5"),
        ({"ACCELERATE_DEEPSPEED_ZERO_STAGE": "two"}, "not a number"),
    ],
    ids=["zero4", "zero3-init", "offload-opt", "offload-param", "config-file", "accumulation", "clipping", "bad-stage"],
)
def test_a_deepspeed_setting_csekit_does_not_run_is_refused_with_the_fix(
    deepspeed_found: None, setting: dict[str, str], needle: str
) -> None:
    environment = {**launch_environment(DEEPSPEED_CONFIG), **setting}
    with pytest.raises(CsekitError, match="the accelerate config") as refused:
        check_deepspeed_request(0.5, "fp32", environment)
    assert needle in str(refused.value) and "\n" not in str(refused.value)


def test_the_shipped_config_and_the_recipes_clipping_and_precision_are_accepted(deepspeed_found: None) -> None:
    environment = launch_environment(DEEPSPEED_CONFIG)
    assert check_deepspeed_request(0.5, "bf16", environment).stage == 2
    same = {**environment, "ACCELERATE_GRADIENT_CLIPPING": "0.5", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "1"}
    assert check_deepspeed_request(0.5, "fp32", same).stage == 1
    with pytest.raises(CsekitError, match="fp16 is not supported under DeepSpeed"):
        check_deepspeed_request(0.5, "fp16", environment)


def test_deepspeed_not_installed_names_the_install_before_any_other_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None)
    environment = {**launch_environment(DEEPSPEED_CONFIG), "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3"}
    with pytest.raises(CsekitError, match="which is not installed: pip install deepspeed, or launch with"):
        check_deepspeed_request(0.5, "fp32", environment)


def test_accelerator_options_under_deepspeed_carry_the_recipes_clipping_and_gloo_on_cpus(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """accelerate 1.15 gives DeepSpeed no backend on CPU processes unless one is named (it then counted one
    process while DeepSpeed counted two: found running the shipped config here)."""
    from csekit.training.sharding import accelerator_options

    for key, value in launch_environment(DEEPSPEED_CONFIG).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr("csekit.training.sharding.has_gpu", lambda: False)
    options = accelerator_options(0.5)
    assert options["cpu"] is False
    assert options["deepspeed_plugin"].deepspeed_config["gradient_clipping"] == 0.5
    assert options["deepspeed_plugin"].deepspeed_config["zero_optimization"]["stage"] == 2
    assert [handler.backend for handler in options["kwargs_handlers"]] == ["gloo"]
    monkeypatch.delenv("ACCELERATE_USE_DEEPSPEED")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert accelerator_options(0.5) == {"cpu": True}  # several CPU processes without DeepSpeed: gloo DDP


def zero_worker(rank: int, world: int, port: int, stage: int, model_dir: Path, out: Path) -> None:
    """One process of a ZeRO step through accelerate (as the trainer prepares it), on its half of the batch."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world)
    )
    os.environ.update(ACCELERATE_USE_DEEPSPEED="true", ACCELERATE_DEEPSPEED_ZERO_STAGE=str(stage))
    os.environ.update(ACCELERATE_DEEPSPEED_ZERO3_INIT="false")  # as configs/accelerate-deepspeed.yaml
    torch.set_num_threads(1)
    from accelerate import Accelerator

    from csekit.training.optimization import gradient_norm
    from csekit.training.sharding import accelerator_options
    from csekit.training.zero import whole_model_loading
    from csekit.training.zero_state import full_model_for

    accelerator = Accelerator(**accelerator_options(MAX_GRAD_NORM))
    with whole_model_loading(accelerator):
        model, views, optimizer = build(model_dir)
    full = full_model_for(accelerator, model, optimizer)
    share = len(SENTENCES) // world
    accelerator.state.deepspeed_plugin.deepspeed_config["train_micro_batch_size_per_gpu"] = share  # no loader here
    model, optimizer = accelerator.prepare(model, optimizer)
    sentences = SENTENCES[rank * share : (rank + 1) * share]
    loss, _ = model(views(sentences), sentences)
    accelerator.backward(loss)  # DeepSpeed clips and steps AdamW here
    norm = gradient_norm(accelerator, list(model.parameters()), MAX_GRAD_NORM)
    copy = full.at_step(model, 1)
    moments = full.optimizer_state(optimizer).state_dict()
    if rank == 0:
        assert copy is not None
        weights = {k: v.clone() for k, v in copy.state_dict().items()}
        result = {
            "norm": float(norm),
            "weights": weights,
            "moments": moments,
            "mode": str(accelerator.distributed_type),
        }
        result["partitioned"] = type(optimizer.optimizer).__name__
        torch.save(result, out)
    torch.distributed.destroy_process_group()


@needs_deepspeed
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_step_on_two_processes_is_the_one_process_step_on_the_global_batch(
    tmp_path: Path, tiny_model_dir: Path, stage: int
) -> None:
    """ZeRO on 2 gloo processes: the gradient norm (clipping active), the weights after AdamW's step and AdamW's
    moments (assembled from the partitions, numbered as a plain optimizer's) are one process's on the 12
    sentences."""
    single = one_process_step(tiny_model_dir, SENTENCES)
    out = tmp_path / "zero.pt"
    mp.spawn(zero_worker, args=(2, free_port(), stage, tiny_model_dir, out), nprocs=2, join=True)
    two = torch.load(out, weights_only=False)
    assert two["mode"] == "DistributedType.DEEPSPEED"
    assert two["partitioned"] == ("DeepSpeedZeroOptimizer_Stage3" if stage == 3 else "DeepSpeedZeroOptimizer")
    assert single["norm"] > MAX_GRAD_NORM  # clipping acted
    assert two["norm"] == pytest.approx(single["norm"], rel=1e-5)
    assert set(two["weights"]) == set(single["weights"])
    for name, weight in single["weights"].items():
        torch.testing.assert_close(two["weights"][name], weight, rtol=1e-5, atol=1e-6, msg=name)
    plain, state = single["optimizer"], two["moments"]["state"]
    assert sorted(state) == sorted(plain["state"])
    assert two["moments"]["param_groups"] == plain["param_groups"]
    for number, entry in plain["state"].items():
        assert set(state[number]) == set(entry)
        for key, value in entry.items():
            torch.testing.assert_close(state[number][key], value, rtol=1e-4, atol=1e-9, msg=f"{number} {key}")


@needs_deepspeed
@pytest.mark.parametrize(("stage", "precision"), [(2, "fp32"), (3, "fp32"), (3, "bf16")])
def test_zero_run_resumes_exactly_and_saves_a_whole_model(
    tmp_path: Path, tiny_model_dir: Path, test_parts: None, stage: int, precision: str
) -> None:
    """`accelerate launch --config_file configs/accelerate-deepspeed.yaml`, 2 processes: a run interrupted after
    step 3 checkpoints the whole weights and AdamW state (csekit's format, no pickles); resumed, under DeepSpeed
    or under data parallelism, it gives the losses and final weights of the run that went straight through;
    best/ is a whole model that encodes. bf16 (DeepSpeed's: bf16 weights, fp32 master weights in the checkpoint)
    is not data parallelism's (autocast over fp32 weights), so only fp32 is resumed across the two."""
    corpus = make_corpus(tmp_path / "corpus.txt", lines=64)

    def recipe(marker: Path) -> Recipe:
        keys = (f"train.precision={precision}", "train.max_grad_norm=0.5")
        keys += ("run.packed=false",)  # the passes DeepSpeed runs, also when data parallelism resumes the run
        return interrupting_recipe(tiny_model_dir, corpus, marker, *keys)

    zero = {"config": DEEPSPEED_CONFIG, "launch": ("--zero_stage", str(stage))}
    straight, stopped, marker = straight_and_stopped(recipe, tmp_path, **zero)
    optimizer: dict[str, Any] = torch.load(stopped / "checkpoint" / "optimizer.pt", weights_only=True)
    assert all(float(entry["step"]) == 3.0 for entry in optimizer["state"].values())
    weights = load_file(stopped / "checkpoint" / "model.safetensors")
    assert {weight.dtype for weight in weights.values()} == {torch.float32}  # the master weights under bf16 too
    # One checkpoint format: data parallelism (no DeepSpeed) resumes it too, with the same result.
    plain = tmp_path / "plain"
    shutil.copytree(stopped, plain)
    cpu_config = DEEPSPEED_CONFIG.parent / "accelerate-cpu.yaml"
    result = launch_train(recipe(marker), plain, "--resume", plugin_dir=tmp_path / "plugins", config=cpu_config)
    assert result.returncode == 0, result.stderr[-3000:]
    if precision == "fp32":
        assert losses(plain) == pytest.approx(losses(straight), rel=1e-5)
        assert_same_final_weights(straight, plain, rtol=1e-5, atol=1e-6)
    result = launch_train(recipe(marker), stopped, "--resume", plugin_dir=tmp_path / "plugins", **zero)
    assert result.returncode == 0, result.stderr[-3000:]
    assert losses(stopped) == pytest.approx(losses(straight), rel=1e-6)
    assert_same_final_weights(straight, stopped)
    assert SentenceEncoder.load(straight / "best").encode(["a man plays"]).shape == (1, 32)


@needs_deepspeed
def test_a_non_finite_step_is_skipped_under_zero_as_under_data_parallel(
    tmp_path: Path, tiny_model_dir: Path, test_parts: None
) -> None:
    """DeepSpeed steps AdamW inside `backward`; a NaN gradient on one process makes it skip that step itself and
    report an infinite norm, which csekit records as a skipped step: the run's log and final weights are the
    data-parallel run's (configs/accelerate-cpu.yaml), which skips the same step."""
    corpus = make_corpus(tmp_path / "corpus.txt", lines=64)
    poison = "{name: nan_at, calls: [2], gradient_only: true, only_rank: 1}"
    keys = ("train.max_steps=4", "train.eval_every=4", "train.precision=fp32", "train.max_grad_norm=0.5")
    keys += ("run.packed=false",)  # as under DeepSpeed: the same passes, so the same dropout draws
    recipe = tiny_recipe(tiny_model_dir, corpus, *keys, f"objectives=[{{name: infonce}}, {poison}]")
    plugins = tmp_path / "plugins"
    zero = tmp_path / "zero"
    result = launch_train(recipe, zero, plugin_dir=plugins, config=DEEPSPEED_CONFIG)
    assert result.returncode == 0, result.stderr[-3000:]
    plain = tmp_path / "plain"
    cpu_config = DEEPSPEED_CONFIG.parent / "accelerate-cpu.yaml"
    result = launch_train(recipe, plain, plugin_dir=plugins, config=cpu_config)
    assert result.returncode == 0, result.stderr[-3000:]

    def skips(out: Path) -> list[dict[str, Any]]:
        records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        return [record for record in records if record.get("event") == "non_finite_step"]

    assert [record["step"] for record in skips(zero)] == [1] and skips(zero) == skips(plain)
    assert losses(zero) == pytest.approx(losses(plain), rel=1e-5)
    assert_same_final_weights(plain, zero, rtol=1e-5, atol=1e-6)

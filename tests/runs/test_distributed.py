"""Two processes (gloo, CPU) give the loss and gradients of one process on the same global batch."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import DISTINCT_SENTENCES as SENTENCES

from csekit.encoding.encoder import SentenceEncoder
from csekit.training.execution import build_run_model
from csekit.training.recipe import Recipe, load_recipe

ACCELERATE_CPU = Path(__file__).resolve().parents[2] / "configs" / "accelerate-cpu.yaml"


# Each method's parts whose statistics span the batch: SimCSE's in-batch negatives; ConSERT's NT-Xent (both
# views' in-batch negatives); DCLR's noise
# (optimised against the whole batch) and complementary-model weights (over every in-batch
# negative); WhitenedCSE's whitening (mean and covariance of the batch, here with gradients through
# them) and its multi-positive loss.
METHODS = {
    "simcse": "objectives: [{name: infonce, temperature: 0.05}]\n",
    "consert": "objectives: [{name: nt_xent, temperature: 0.1}]\n",  # both views anchors, same-view negatives
    "dclr": (
        "negatives: [{name: dclr_noise, ratio: 1.5, steps: 4, step_size: 0.1, temperature: 0.05}]\n"
        "weighting: {name: dclr, model: '{model}', model_pooler: mean, phi: 0.93}\n"
        "objectives: [{name: infonce, temperature: 0.05}]\n"
    ),
    "whitenedcse": (
        "model: {head: {name: whitening, whitening: shuffled_group, num_groups: 8, group_size: null,\n"
        "               num_positives: 3, gradient_through_whitening: true}}\n"
        "objectives: [{name: multi_positive, temperature: 0.05, form: eq7}]\n"
    ),
}


def write_recipe(model_dir: Path, method: str) -> Path:
    """The method's recipe file (written once, before any worker starts: workers only read it)."""
    recipe_file = model_dir.parent / f"{method}.yaml"
    recipe_file.write_text(METHODS[method].replace("{model}", str(model_dir)), encoding="utf-8")
    return recipe_file


def build(model_dir: Path, method: str):  # type: ignore[no-untyped-def]
    recipe_file = model_dir.parent / f"{method}.yaml"
    recipe = load_recipe(recipe_file, [f"model.backbone={model_dir}", "model.pooler=mean"])
    encoder = SentenceEncoder.load(model_dir, pooler="mean", dropout=0.0)  # no dropout: same views everywhere
    torch.manual_seed(0)  # the same head, noise and channel permutations in every process
    return build_run_model(recipe, encoder)


def loss_and_grads(model_dir: Path, method: str, sentences: list[str]) -> tuple[float, dict[str, torch.Tensor]]:
    model, views = build(model_dir, method)
    loss, _ = model(views(sentences), sentences)
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return loss.item(), grads


def worker(rank: int, world: int, port: int, model_dir: Path, out: Path) -> None:
    """Every method in one process group: one spawn (two interpreters importing torch) for the four."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    share = len(SENTENCES) // world
    results = {}
    for method in METHODS:
        loss, grads = loss_and_grads(model_dir, method, SENTENCES[rank * share : (rank + 1) * share])
        for grad in grads.values():  # what DDP does: average gradients over processes
            dist.all_reduce(grad)
            grad /= world
        losses = [torch.zeros(1) for _ in range(world)]
        dist.all_gather(losses, torch.tensor([loss]))
        results[method] = {"loss": torch.cat(losses).mean().item(), "grads": grads}
    if rank == 0:
        torch.save(results, out)
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def two_process_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """Every method's loss and DDP-averaged gradients from one 2-process spawn, keyed by method."""
    from conftest import make_tiny_encoder

    root = tmp_path_factory.mktemp("two-processes")
    model_dir = root / "tiny-model"
    make_tiny_encoder(root / "tokenizer").save(model_dir)
    for method in METHODS:
        write_recipe(model_dir, method)
    out = root / "two.pt"
    mp.spawn(worker, args=(2, free_port(), model_dir, out), nprocs=2, join=True)
    return {"model_dir": model_dir, **torch.load(out)}


@pytest.mark.slow
@pytest.mark.parametrize("method", list(METHODS))
def test_two_processes_equal_one_process_on_the_global_batch(two_process_results: dict, method: str) -> None:
    """Loss (averaged over processes, as the trainer logs it) and DDP-averaged gradients match one process."""
    single_loss, single_grads = loss_and_grads(two_process_results["model_dir"], method, SENTENCES)
    two = two_process_results[method]
    assert two["loss"] == pytest.approx(single_loss, rel=1e-5)
    assert set(two["grads"]) == set(single_grads)
    for name, grad in single_grads.items():
        torch.testing.assert_close(two["grads"][name], grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("method", list(METHODS))
def test_half_batches_alone_give_another_loss(tiny_model_dir: Path, method: str) -> None:
    """The equivalence above is not vacuous: each process on its half alone (no gathering) would differ."""
    write_recipe(tiny_model_dir, method)
    whole, _ = loss_and_grads(tiny_model_dir, method, SENTENCES)
    halves = [loss_and_grads(tiny_model_dir, method, SENTENCES[i : i + 6])[0] for i in (0, 6)]
    assert sum(halves) / 2 != pytest.approx(whole, rel=0.1)  # the equivalence test asks rel=1e-5


def test_dclr_weighting_drops_some_but_not_all_negatives(tiny_model_dir: Path) -> None:
    """The DCLR case above exercises the weights: phi leaves a mix of kept and dropped negatives."""
    write_recipe(tiny_model_dir, "dclr")
    model, views = build(tiny_model_dir, "dclr")
    state = model.make_state(views(SENTENCES), SENTENCES, {})
    model.weighting(state)
    weights = state.negative_weights
    assert weights is not None
    assert 0 < int((weights == 0).sum()) < weights.numel() - len(SENTENCES)


def launch(command: list[str], recipe: Recipe, out: Path) -> subprocess.CompletedProcess:
    """Run `csekit train` on `recipe` under a launcher command; one thread a process (2 cores here)."""
    recipe_file = out.parent / f"{out.name}.yaml"
    recipe_file.write_text(recipe.to_yaml(), encoding="utf-8")
    command = [*command, "-m", "csekit.cli", "train", str(recipe_file), "--output", str(out), "--no-progress"]
    return subprocess.run(command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})


def logged_steps(out: Path) -> tuple[int, list[int]]:
    """(processes, steps with a loss record) from a run's metrics.jsonl."""
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return records[0]["processes"], [r["step"] for r in records if "loss" in r]


@pytest.mark.slow
def test_torchrun_trains_on_two_cpu_processes(tmp_path: Path, tiny_model_dir: Path) -> None:
    """`torchrun` (what accelerate's multi-process launcher runs) on a machine without a GPU: gloo, 2 processes."""
    from conftest import make_corpus, tiny_recipe

    recipe = tiny_recipe(tiny_model_dir, make_corpus(tmp_path / "corpus.txt", lines=64), "train.max_steps=3")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    torchrun += ["--master_port", str(free_port())]
    result = launch(torchrun, recipe, tmp_path / "out")
    assert result.returncode == 0, result.stderr[-2000:]
    assert logged_steps(tmp_path / "out") == (2, [1, 2, 3])  # written once, by the main process
    assert (tmp_path / "out" / "best" / "model.safetensors").exists()
    # The last line once, the main process's: the other said "no evaluated model was kept: .../best is missing".
    assert result.stdout.count("trained 3 steps") == 1 and "is missing" not in result.stdout, result.stdout
    checkpoint = tmp_path / "out" / "checkpoint"
    assert sorted(p.name for p in checkpoint.glob("rng_state_*.pt")) == ["rng_state_0.pt", "rng_state_1.pt"]
    assert not (tmp_path / "out" / ".lock").exists()


@pytest.mark.slow
def test_accelerate_launch_trains_all_four_papers_on_two_cpu_processes(
    tmp_path: Path, tiny_combined_recipe: Recipe
) -> None:
    """The documented command with the shipped config: every part of every paper at once (combined recipe)."""
    recipe = tiny_combined_recipe
    accelerate = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(ACCELERATE_CPU)]
    result = launch([*accelerate, "--num_processes", "2"], recipe, tmp_path / "out")
    assert result.returncode == 0, result.stderr[-2000:]
    assert logged_steps(tmp_path / "out") == (2, [1, 2, 3])
    assert SentenceEncoder.load(tmp_path / "out" / "best").encode(["a man plays"]).shape == (1, 32)


def test_accelerate_launch_without_the_config_says_it_started_one_process(tmp_path: Path, tiny_model_dir: Path) -> None:
    """accelerate's own default on a machine without a GPU is one process; csekit says so instead of hiding it."""
    if torch.cuda.is_available():
        pytest.skip("with GPUs accelerate starts one process a GPU")
    from conftest import make_corpus, tiny_recipe

    recipe = tiny_recipe(tiny_model_dir, make_corpus(tmp_path / "corpus.txt", lines=64), "train.max_steps=1")
    command = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2"]
    result = launch(command, recipe, tmp_path / "out")
    assert result.returncode == 0, result.stderr[-2000:]
    assert logged_steps(tmp_path / "out") == (1, [1])
    assert "accelerate started a single process" in result.stderr
    assert "configs/accelerate-cpu.yaml" in result.stderr


def test_a_checkpoint_reads_on_accelerates_cpu_device_of_several_processes(tmp_path: Path) -> None:
    """On CPU processes (gloo) accelerate's device is "cpu:0", a name safetensors and torch.load refuse: every
    `--resume` of a run on several CPU processes stopped with "device cpu:0 is invalid"."""
    from types import SimpleNamespace

    from conftest import train_finished_run
    from transformers import get_linear_schedule_with_warmup

    from csekit.training.checkpoint import read_checkpoint
    from csekit.training.optimization import make_optimizer

    root = train_finished_run(tmp_path)
    recipe = load_recipe(root / "recipe.yaml")
    model, _ = build_run_model(recipe, SentenceEncoder.load(root / "tiny-model"))
    optimizer = make_optimizer(model, recipe)
    scheduler = get_linear_schedule_with_warmup(optimizer, 0, 2)  # as the trainer makes it
    accelerator = SimpleNamespace(device=torch.device("cpu", 0), scaler=None, process_index=0, num_processes=1)
    state = read_checkpoint(accelerator, root / "run", model, optimizer, scheduler, 2)  # type: ignore[arg-type]
    assert state is not None and state.step == 2

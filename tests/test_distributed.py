"""Two processes (gloo, CPU) give the loss and gradients of one process on the same global batch."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from csekit.config import load_recipe
from csekit.encoder import SentenceEncoder
from csekit.model import build_model

SENTENCES = [
    "a man plays the guitar",
    "the dog runs in the park",
    "she eats food quickly",
    "a small cat sits on the house",
    "they are playing music",
    "the red ball is big",
    "he runs slowly with the dog",
    "a woman plays with a blue ball",
]


def build(model_dir: Path):  # type: ignore[no-untyped-def]
    recipe = load_recipe(None, [f"model.backbone={model_dir}", "model.pooler=mean"])
    encoder = SentenceEncoder.load(model_dir, pooler="mean", dropout=0.0)  # no dropout: same views everywhere
    torch.manual_seed(0)
    return build_model(recipe, encoder)


def loss_and_grads(model_dir: Path, sentences: list[str]) -> tuple[float, dict[str, torch.Tensor]]:
    model, views = build(model_dir)
    loss, _ = model(views(sentences), sentences)
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return loss.item(), grads


def worker(rank: int, world: int, port: int, model_dir: Path, out: Path) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    share = len(SENTENCES) // world
    loss, grads = loss_and_grads(model_dir, SENTENCES[rank * share : (rank + 1) * share])
    for grad in grads.values():  # what DDP does: average gradients over processes
        dist.all_reduce(grad)
        grad /= world
    losses = [torch.zeros(1) for _ in range(world)]
    dist.all_gather(losses, torch.tensor([loss]))
    if rank == 0:
        torch.save({"loss": torch.cat(losses).mean().item(), "grads": grads}, out)
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_two_processes_equal_one_process_on_the_global_batch(tmp_path: Path, tiny_model_dir: Path) -> None:
    single_loss, single_grads = loss_and_grads(tiny_model_dir, SENTENCES)
    out = tmp_path / "two.pt"
    mp.spawn(worker, args=(2, free_port(), tiny_model_dir, out), nprocs=2, join=True)
    two = torch.load(out)
    assert two["loss"] == pytest.approx(single_loss, rel=1e-5)
    assert set(two["grads"]) == set(single_grads)
    for name, grad in single_grads.items():
        torch.testing.assert_close(two["grads"][name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_training_runs_as_two_cpu_processes(tmp_path: Path, tiny_model_dir: Path) -> None:
    """`torchrun` (what `accelerate launch --multi_gpu` runs) on a machine without a GPU: gloo, 2 processes."""
    import json
    import subprocess
    import sys

    from test_training import make_corpus

    corpus = make_corpus(tmp_path / "corpus.txt", lines=64)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        f"model: {{backbone: '{tiny_model_dir}', pooler: mean, max_length: 16}}\n"
        f"data: {{corpus: '{corpus}'}}\n"
        "train: {batch_size: 16, max_steps: 3, eval_every: 0, log_every: 1, dev_task: none}\n",
        encoding="utf-8",
    )
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(free_port()),
    ]
    command += ["-m", "csekit.cli", "train", str(recipe), "--output", str(tmp_path / "out"), "--no-progress"]
    result = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-2000:]
    records = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert records[0]["processes"] == 2
    assert [r["step"] for r in records if "loss" in r] == [1, 2, 3]  # written once, by the main process
    assert (tmp_path / "out" / "best" / "model.safetensors").exists()

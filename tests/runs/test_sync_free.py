"""Sync-free steps (run.sync_free): no read on the host between log points, and the plain loop's weights."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import TinyTrainer, make_corpus, read_metrics, tiny_recipe
from safetensors.torch import load_file
from transformers import get_linear_schedule_with_warmup

from csekit.core.errors import CsekitError
from csekit.training.execution import decide_execution
from csekit.training.loading import LoaderOptions
from csekit.training.recipe import Recipe, load_recipe
from csekit.training.sync_free import linear_schedule_factor, set_schedule_step, use_sync_free
from csekit.training.trainer import Trainer

HOST_READS = ("item", "tolist", "__bool__", "__float__", "__int__", "nonzero")
"""The Tensor methods that copy a value (or, `nonzero`, a result's size) to the host: on a GPU, each waits for
the device. Reads inside transformers count too (its mask helper asked `padding_mask.all()` once a pass)."""

BLOCKING_COPY = "blocking copy"
"""What a loader's copy of a batch to the device with `non_blocking=False` is recorded as (on a GPU, a wait)."""


@contextlib.contextmanager
def counting_host_reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Inside the block every Python-level read of a tensor's value on the host is recorded by name, and every
    copy of a batch by the loader (accelerate's `send_to_device`) that waits for the device as `BLOCKING_COPY`."""
    import accelerate.data_loader

    reads: list[str] = []
    with monkeypatch.context() as patch:
        for name in HOST_READS:
            original = getattr(torch.Tensor, name)

            def counted(self: torch.Tensor, *args: Any, _name: str = name, _original: Any = original, **kw: Any) -> Any:
                reads.append(_name)
                return _original(self, *args, **kw)

            patch.setattr(torch.Tensor, name, counted)
        send = accelerate.data_loader.send_to_device

        def copied(batch: Any, device: Any, non_blocking: bool = False, **kw: Any) -> Any:
            if not non_blocking:
                reads.append(BLOCKING_COPY)
            return send(batch, device, non_blocking=non_blocking, **kw)

        patch.setattr(accelerate.data_loader, "send_to_device", copied)
        yield reads


@contextlib.contextmanager
def started_trainer(recipe: Recipe, output: Path) -> Iterator[Trainer]:
    """A Trainer set up as `train` sets it up, its progress started and its model in training mode."""
    with contextlib.ExitStack() as held:
        from csekit.training.processes import own_accelerator_state

        held.enter_context(own_accelerator_state())
        trainer = Trainer(recipe, output, None, False, False, False, held)
        trainer._start_progress()
        trainer.model.train()
        yield trainer


def gpu_path_recipe(model_dir: Path, corpus: Path, *extra: str) -> Recipe:
    """The tiny recipe on the path a GPU takes: one padded encoder pass (no length groups; `auto` packs on a
    CPU only, reading row lengths on the host), torch's dropout."""
    return tiny_recipe(
        model_dir,
        corpus,
        "run.length_group_size=0",
        "run.packed=false",
        "run.fast_dropout=false",
        "train.log_every=4",
        *extra,
    )


GPU_LOADER = LoaderOptions(0, pin_memory=False, persistent_workers=False, non_blocking=True)
"""The loader as on a GPU (`loader_options`), in the main process and unpinned (a CPU has no pinned memory)."""


@pytest.mark.parametrize("sync_free", [True, False])
def test_steps_between_log_points_read_nothing_on_the_host(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, sync_free: bool
) -> None:
    """Each window holds what the loop does between two steps: the step, its bookkeeping, the next batch."""
    monkeypatch.setattr("csekit.training.execution.loader_options", lambda workers, device: GPU_LOADER)
    corpus = make_corpus(tmp_path / "corpus.txt", lines=128)  # 8 batches: no epoch starts inside the windows
    recipe = gpu_path_recipe(tiny_model_dir, corpus, "train.max_steps=8", f"run.sync_free={str(sync_free).lower()}")
    with started_trainer(recipe, tmp_path / "run") as trainer:
        batches = trainer._batches()
        batch = next(batches)  # the epoch's start (the sampler's shuffle)
        for _ in range(3):  # steps 1-3: no log point
            with counting_host_reads(monkeypatch) as reads:
                assert trainer.step(batch)
                assert not trainer._after_step()
                batch = next(batches)  # collated, and copied by accelerate as on a GPU
            if sync_free:
                assert reads == []
            else:  # the plain loop reads the loss and the gradient norm each step
                assert sorted(reads) == ["tolist", "tolist"]
        with counting_host_reads(monkeypatch) as reads:
            assert trainer.step(batch)
            trainer._after_step()  # step 4: the log point reads
        assert trainer.state.step == 4 and trainer.progress.window_steps == 0 and "tolist" in reads


def test_the_count_of_host_reads_sees_transformers_mask_check_and_a_blocking_copy(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The counter above can fail: transformers' own mask (a 2-D mask in training) and CPU loader options."""
    import csekit.encoding.encoder as encoder_module

    monkeypatch.setattr(encoder_module, "ready_attention_mask", lambda backbone, mask: mask)
    corpus = make_corpus(tmp_path / "corpus.txt", lines=128)
    recipe = gpu_path_recipe(tiny_model_dir, corpus, "train.max_steps=8", "run.sync_free=true")
    with started_trainer(recipe, tmp_path / "run") as trainer:
        batches = trainer._batches()
        batch = next(batches)
        with counting_host_reads(monkeypatch) as reads:
            trainer.step(batch)
            next(batches)
    assert "__bool__" in reads and BLOCKING_COPY in reads


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_three_cuda_steps_between_log_points_never_synchronise(tmp_path: Path, tiny_model_dir: Path) -> None:
    """The whole step as the loop takes it, with the model's own attention (SDPA): the loader's fetch and copy
    to the device, the step, and what follows it. Steps 2-4 of a run logging every 8th: no log point."""
    corpus = make_corpus(tmp_path / "corpus.txt", lines=64)
    recipe = gpu_path_recipe(tiny_model_dir, corpus, "train.max_steps=8", "run.sync_free=true", "train.log_every=8")
    with started_trainer(recipe, tmp_path / "run") as trainer:
        batches = trainer._batches()
        trainer.step(next(batches))  # the first step sets up AdamW's state
        trainer._after_step()
        for _ in range(3):
            torch.cuda.set_sync_debug_mode("error")
            try:
                assert trainer.step(next(batches))
                assert not trainer._after_step()
            finally:
                torch.cuda.set_sync_debug_mode("default")
        assert trainer.state.step == 4


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_cuda_steps_with_the_loader_never_synchronise(tmp_path: Path, tiny_model_dir: Path, packed: bool) -> None:
    """The loop between two steps on a GPU, its loader (workers, pinned memory, copies) and SDPA's mask included."""
    corpus = make_corpus(tmp_path / "corpus.txt", lines=128)
    recipe = gpu_path_recipe(
        tiny_model_dir,
        corpus,
        "train.max_steps=8",
        "run.sync_free=true",
        "train.precision=bf16",
        f"run.packed={packed}",
    )
    with started_trainer(recipe, tmp_path / "run") as trainer:
        assert trainer.loader_options.non_blocking and trainer.loader_options.pin_memory
        batches = trainer._batches()
        trainer.step(next(batches))  # the first step sets up AdamW's state
        trainer._after_step()
        batch = next(batches)
        for _ in range(2):  # steps 2-3: no log point
            torch.cuda.set_sync_debug_mode("error")
            try:
                trainer.step(batch)
                trainer._after_step()
                batch = next(batches)
            finally:
                torch.cuda.set_sync_debug_mode("default")


def weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(run / "last" / "model.safetensors")


@pytest.mark.parametrize(
    ("gradient_only", "chunk_size"), [(False, None), (True, None), (False, 8)], ids=["loss", "gradient", "chunked"]
)
def test_a_poisoned_batch_is_skipped_as_the_plain_loop_skips_it(
    train_tiny: TinyTrainer, test_parts: None, gradient_only: bool, chunk_size: int | None
) -> None:
    poison = f"{{name: nan_at, calls: [3, 6, 7], gradient_only: {str(gradient_only).lower()}}}"
    runs = {}
    for sync_free in ("false", "true"):
        runs[sync_free] = train_tiny(
            "train.log_every=4",
            "train.warmup_ratio=0.3",  # the schedule must not advance on a skipped step
            f"run.chunk_size={chunk_size or 'null'}",
            f"objectives=[{{name: infonce}}, {poison}]",
            f"run.sync_free={sync_free}",
            steps=9,
            name=sync_free,
        )
        assert runs[sync_free].result.steps == 9 and runs[sync_free].result.skipped_steps == 3
    plain, sync_free_run = weights(runs["false"].folder), weights(runs["true"].folder)
    assert set(plain) == set(sync_free_run)
    for name, tensor in plain.items():
        torch.testing.assert_close(sync_free_run[name], tensor, rtol=0, atol=0, msg=name)
    logged = {label: run.losses for label, run in runs.items()}
    assert [r["step"] for r in logged["true"]] == [r["step"] for r in logged["false"]] == [4, 8, 9]
    for ours, theirs in zip(logged["true"], logged["false"], strict=True):
        assert ours["loss"] == pytest.approx(theirs["loss"], rel=1e-12)
        assert ours["lr"] == theirs["lr"]
    skips = [r for r in runs["true"].metrics if r.get("event") == "non_finite_step"]
    assert skips[-1]["skipped_steps"] == 3
    assert {r["reason"] for r in skips} == {"gradient" if gradient_only else "loss"}


@pytest.mark.slow
def test_two_processes_skip_the_step_one_of_them_poisoned_as_the_plain_loop(
    tmp_path: Path, tiny_model_dir: Path, test_parts: None
) -> None:
    """DDP: process 1's loss is NaN at its 3rd step; both processes skip it (the flag is the all-reduced loss)."""
    from parts_for_tests import write_entry_points
    from test_distributed import free_port

    corpus = make_corpus(tmp_path / "corpus.txt", lines=64)
    tests = Path(__file__).resolve().parents[1]
    path = [str(tests), str(write_entry_points(tmp_path / "plugin")), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path), "OMP_NUM_THREADS": "1"}
    for sync_free in ("false", "true"):
        recipe = tiny_recipe(
            tiny_model_dir,
            corpus,
            "train.max_steps=5",
            "train.log_every=2",
            "train.warmup_ratio=0.3",
            "objectives=[{name: infonce}, {name: nan_at, calls: [3], only_rank: 1}]",
            f"run.sync_free={sync_free}",
        )
        recipe_file = tmp_path / f"{sync_free}.yaml"
        recipe_file.write_text(recipe.to_yaml(), encoding="utf-8")
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
        command += ["--master_port", str(free_port()), "-m", "csekit.cli", "train", str(recipe_file)]
        command += ["--output", str(tmp_path / sync_free), "--no-progress"]
        done = subprocess.run(command, capture_output=True, text=True, env=env)
        assert done.returncode == 0, done.stderr[-2000:]
        skips = [r for r in read_metrics(tmp_path / sync_free) if r.get("event") == "non_finite_step"]
        assert skips[-1]["skipped_steps"] == 1
    plain, ours = weights(tmp_path / "false"), weights(tmp_path / "true")
    for name, tensor in plain.items():
        torch.testing.assert_close(ours[name], tensor, rtol=0, atol=0, msg=name)


def test_too_many_bad_steps_in_a_row_stop_at_the_next_read(train_tiny: TinyTrainer, test_parts: None) -> None:
    poisoned = "objectives=[{name: infonce}, {name: nan_after, after: 3}]"
    with pytest.raises(CsekitError, match="6 steps in a row had a non-finite loss"):
        train_tiny("train.log_every=4", "train.max_bad_steps=5", poisoned, "run.sync_free=true", steps=40)
    records = read_metrics(train_tiny.tmp_path / "run")
    assert [r["step"] for r in records if "loss" in r] == []  # steps 1-2 taken, then only skips: no log point
    skips = [r for r in records if r.get("event") == "non_finite_step"]
    # Steps 1-2 taken, 3-4 skipped: the read at step 4 finds step 2. Counting again from step 2, the next
    # read is 2 steps later, and so on: 2, 4, then 6 skipped in a row, past max_bad_steps.
    assert [r["skipped_steps"] for r in skips] == [2, 4, 6]


def test_the_device_schedule_is_transformers_linear_schedule() -> None:
    for warmup, total in ((0, 10), (3, 10), (10, 10)):
        parameter = torch.nn.Parameter(torch.zeros(1))
        optimizer = torch.optim.AdamW([parameter], lr=3e-5)
        scheduler = get_linear_schedule_with_warmup(optimizer, warmup, total)
        for step in range(total + 2):
            on_device = 3e-5 * linear_schedule_factor(torch.tensor(float(step), dtype=torch.float64), warmup, total)
            assert on_device.item() == scheduler.get_last_lr()[0], (warmup, step)
            expected = scheduler.state_dict()
            set_schedule_step(scheduler, step)
            assert scheduler.state_dict()["last_epoch"] == expected["last_epoch"]
            assert scheduler.get_last_lr() == expected["_last_lr"] == [optimizer.param_groups[0]["lr"]]
            optimizer.step()
            scheduler.step()


def test_sync_free_choices_and_what_it_needs() -> None:
    with pytest.raises(CsekitError, match=r"run\.sync_free must be auto, true or false"):
        load_recipe(None, ["run.sync_free=sometimes"])
    assert load_recipe(None, ["run.sync_free=true"]).run.sync_free == "True"  # YAML's true, taken as on
    assert load_recipe(None, ["train.sync_free=true"]).run.sync_free == "True"  # its place before run:
    assert use_sync_free("True", "fp32", "adamw", auto=False)
    assert not use_sync_free("false", "fp32", "adamw", auto=True)
    assert not use_sync_free("auto", "bf16", "adamw", auto=False)
    decided = [decide_execution(load_recipe(None), device_type=kind).sync_free for kind in ("cpu", "cuda")]
    assert decided == [False, True]  # auto: on for CUDA ("On a GPU III"), off on a CPU
    with pytest.raises(CsekitError, match=r"needs train\.optimizer adamw"):
        use_sync_free("true", "fp32", "adamw_uncorrected", auto=True)
    with pytest.raises(CsekitError, match=r"needs train\.precision fp32 or bf16"):
        use_sync_free("true", "fp16", "adamw", auto=True)


def test_a_resumed_epoch_copies_its_batches_as_the_loader_options_say(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """accelerate's loader for the batches left of a resumed epoch drops non_blocking; csekit sets it again."""
    monkeypatch.setattr("csekit.training.execution.loader_options", lambda workers, device: GPU_LOADER)
    corpus = make_corpus(tmp_path / "corpus.txt", lines=128)
    recipe = gpu_path_recipe(tiny_model_dir, corpus, "train.max_steps=8", "run.sync_free=true")
    with started_trainer(recipe, tmp_path / "run") as trainer:
        trainer.state.batches = 3  # as a run resumed from a checkpoint after 3 batches
        batches = trainer._batches()
        with counting_host_reads(monkeypatch) as reads:
            next(batches)
            next(batches)
        assert BLOCKING_COPY not in reads

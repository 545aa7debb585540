"""Compute copies (`run.compute_copies`, issue 62 item 4): half-precision copies of the linear weights for the step's
products, fp32 masters for everything else.

A step on the copies is autocast's step: the copy is the cast autocast makes and the master's gradient the
half-precision gradient in fp32. Every comparison below asserts the weights of the plain autocast run within a
hundredth of one AdamW step (`BOUND`); on the development machine (AMD EPYC Zen 3, AVX2, bf16 emulated) they were
equal bit for bit in every case, chunked, sync-free, LoRA and two processes included.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import TinyTrainer, make_corpus, tiny_recipe
from resumed_runs import crashed_and_resumed
from safetensors.torch import load_file
from test_sync_free import started_trainer
from torch.utils._python_dispatch import TorchDispatchMode

from csekit.core.errors import CsekitError
from csekit.training.compute_copies import ComputeCopies
from csekit.training.execution import decide_execution
from csekit.training.recipe import Recipe, load_recipe
from csekit.training.trainer import Trainer

STEPS = 3
LR = 5e-4  # tiny_recipe's
BOUND = LR / 100
"""How far a weight may be from autocast's after `STEPS` steps: AdamW moves each weight by about lr a step whatever
its gradient's size, so a copy a step behind or a gradient lost or rounded otherwise moves some weight by about lr."""

BF16 = ("train.precision=bf16", "model.dropout=0.1")  # bf16 emulated on an AVX2 CPU: slow, but the model is tiny
VARIANTS = {
    "plain": (),
    "lora": ("model.lora={r: 4, alpha: 8, dropout: 0.1}",),
    "chunked": ("run.chunk_size=4",),
    "sync-free": ("run.sync_free=true",),
}


def fp32_modules(trainer: Trainer) -> bool:
    """Whether every trainable parameter the modules hold is fp32 (the masters, outside a step)."""
    return all(p.dtype == torch.float32 for p in trainer.unwrapped.parameters() if p.requires_grad)


def stepped_weights(recipe: Recipe, output: Path, check: bool = True) -> list[dict[str, torch.Tensor]]:
    """The trained weights after each of `STEPS` loop steps; with copies, checked against the masters after each."""
    weights = []
    with started_trainer(recipe, output) as trainer:
        batches = trainer._batches()
        for _ in range(STEPS):
            assert trainer.step(next(batches))
            copies = trainer.copies
            assert (copies is not None) == (recipe.run.compute_copies is True) and fp32_modules(trainer)
            if copies is not None and check:
                assert copies.copies and all(copy.dtype == torch.bfloat16 for copy in copies.copies)
                for copy, master in zip(copies.copies, copies.masters, strict=True):
                    assert torch.equal(copy, master.detach().to(torch.bfloat16))  # refreshed after the step
            weights.append({n: p.detach().clone() for n, p in trainer.unwrapped.named_parameters() if p.requires_grad})
    return weights


def largest_difference(tmp_path: Path, tiny_model_dir: Path, *extra: str, check: bool = True) -> float:
    """The largest difference of a weight between the run with copies and autocast's, over every step."""
    corpus = make_corpus(tmp_path / "corpus.txt", lines=64)
    recipes = {
        on: tiny_recipe(tiny_model_dir, corpus, *BF16, *extra, f"run.compute_copies={on}") for on in ("false", "true")
    }
    runs = [stepped_weights(recipe, tmp_path / on, check) for on, recipe in recipes.items()]
    return max(
        (copied[name] - plain[name]).abs().max().item() for plain, copied in zip(*runs, strict=True) for name in plain
    )


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_steps_on_copies_give_autocasts_weights(tmp_path: Path, tiny_model_dir: Path, variant: str) -> None:
    """Three loop steps (AdamW, clipping at 1.0, dropout 0.1; LoRA's adapters with their own dropout)."""
    assert largest_difference(tmp_path, tiny_model_dir, *VARIANTS[variant]) <= BOUND


def test_the_bound_fails_copies_that_are_not_refreshed(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def stale(self: ComputeCopies) -> None:
        self._versions = self._master_versions()

    monkeypatch.setattr(ComputeCopies, "refresh", stale)
    with pytest.raises(AssertionError):  # the copies-equal-masters check
        largest_difference(tmp_path, tiny_model_dir)
    (tmp_path / "again").mkdir()
    assert largest_difference(tmp_path / "again", tiny_model_dir, check=False) > 10 * BOUND


class CastsOf(TorchDispatchMode):
    """Counts the casts of the given tensors (`aten._to_copy`) and the multi-tensor copies."""

    def __init__(self, tensors: list[torch.Tensor]) -> None:
        super().__init__()
        self.watched = {tensor.data_ptr() for tensor in tensors}
        self.cast: set[int] = set()  # the watched tensors cast, by address
        self.multi_tensor_copies = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.ops.aten._to_copy.default and args[0].data_ptr() in self.watched:
            self.cast.add(args[0].data_ptr())
        if func is torch.ops.aten._foreach_copy_.default:
            self.multi_tensor_copies += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("copies", [False, True])
def test_a_step_on_copies_casts_no_linear_weight(tmp_path: Path, tiny_model_dir: Path, copies: bool) -> None:
    """Autocast casts every linear weight a step uses (all but BERT's pooler layer: the recipe pools [CLS] without it);
    on copies none is cast, and two multi-tensor copies run: the gradients to the masters, then the copies refreshed
    after AdamW's step."""
    corpus = make_corpus(tmp_path / "corpus.txt", lines=64)
    recipe = tiny_recipe(tiny_model_dir, corpus, *BF16, f"run.compute_copies={str(copies).lower()}")
    with started_trainer(recipe, tmp_path / "run") as trainer:
        modules = trainer.unwrapped.named_modules()
        linear = [m.weight for name, m in modules if isinstance(m, torch.nn.Linear) and ".pooler." not in name]
        batches = trainer._batches()
        trainer.step(next(batches))  # AdamW's state made
        batch = next(batches)
        with CastsOf(linear) as counted:
            trainer.step(batch)
    if copies:
        assert (counted.cast, counted.multi_tensor_copies) == (set(), 2)
    else:
        assert counted.cast == {weight.data_ptr() for weight in linear} and counted.multi_tensor_copies == 0


def test_the_checkpoint_holds_fp32_masters_and_a_resume_continues_the_same(
    train_tiny: TinyTrainer, test_parts: None
) -> None:
    """A run that crashes in step 3 resumes from its step-2 checkpoint (the copies rebuilt from the masters) to the
    straight run's weights, bit for bit; the checkpoint, best/ and last/ hold fp32 weights."""
    resumed = crashed_and_resumed(train_tiny, *BF16, "run.compute_copies=true", steps=4, eval_every=2)
    for saved in ("checkpoint", "last", "best"):
        weights = load_file(resumed.folder / saved / "model.safetensors")
        assert weights and all(t.dtype == torch.float32 for t in weights.values() if t.is_floating_point()), saved


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ("train.precision=fp32",),
            r"run\.compute_copies: true needs train\.precision bf16 or fp16 \(this run's is fp32",
        ),
        (("train.precision=auto",), r"this run's is fp32: nothing is cast"),  # auto on an AVX2 CPU
        (("train.precision=bf16", "run.compile=default"), r"run\.compute_copies: true does not run with run\.compile"),
    ],
)
def test_true_where_it_cannot_run_is_one_line(extra: tuple[str, ...], message: str) -> None:
    with pytest.raises(CsekitError, match=message) as error:
        decide_execution(load_recipe(None, ["run.compute_copies=true", *extra]), device_type="cpu")
    assert "\n" not in str(error.value)


def test_true_under_fsdp_and_with_a_part_that_reads_the_weights_is_one_line(train_tiny: TinyTrainer) -> None:
    recipe_with_copies = load_recipe(None, ["run.compute_copies=true", *BF16])
    with pytest.raises(CsekitError, match=r"run\.compute_copies: true is not supported under FSDP") as error:
        decide_execution(recipe_with_copies, device_type="cpu", sharding="fsdp")
    assert "\n" not in str(error.value)
    recall = "objectives=[{name: infonce}, {name: recall}]"
    with pytest.raises(CsekitError, match=r"cannot run objectives\[1\] \(recall\): its pull") as error:
        train_tiny(*BF16, recall, "run.compute_copies=true", lines=32)
    assert "\n" not in str(error.value) and not (train_tiny.tmp_path / "run" / "metrics.jsonl").exists()


def test_the_key_takes_auto_true_or_false_and_auto_is_off_everywhere() -> None:
    with pytest.raises(CsekitError, match=r"recipe key run\.compute_copies must be auto, true or false"):
        load_recipe(None, ["run.compute_copies=always"])
    for device in ("cpu", "cuda"):
        assert not decide_execution(load_recipe(None, ["train.precision=bf16"]), device_type=device).compute_copies
    assert decide_execution(load_recipe(None, ["run.compute_copies=true", *BF16]), device_type="cpu").compute_copies


@pytest.mark.slow
def test_two_processes_on_copies_train_as_without(tmp_path: Path, tiny_model_dir: Path) -> None:
    """DDP's gradient hooks are on the masters: the step runs under no_sync and averages the fp32 gradients after
    the backward. Two torchrun processes with copies end where two without end."""
    from test_distributed import free_port, launch, logged_steps

    corpus = make_corpus(tmp_path / "corpus.txt", lines=64)
    weights = {}
    for on in ("false", "true"):
        recipe = tiny_recipe(tiny_model_dir, corpus, *BF16, "train.max_steps=2", f"run.compute_copies={on}")
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
        result = launch([*torchrun, "--master_port", str(free_port())], recipe, tmp_path / on)
        assert result.returncode == 0, result.stderr[-2000:]
        assert logged_steps(tmp_path / on) == (2, [1, 2])
        weights[on] = load_file(tmp_path / on / "checkpoint" / "model.safetensors")
    for name, weight in weights["false"].items():
        torch.testing.assert_close(weights["true"][name], weight, rtol=0, atol=BOUND, msg=name)

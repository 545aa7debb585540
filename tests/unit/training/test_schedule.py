"""The learning-rate horizon and the kept model (issue 65, Fidelity V item 2): `train.schedule_steps`, `train.schedule:
constant` and `train.keep: last`, each equal to what the authors' code computes (tests/llm2vec_reference.py), in the
plain loop and in sync-free steps; and the recipes that use them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import TinyTrainer, make_corpus, read_metrics, tiny_recipe
from hypothesis import given, settings
from hypothesis import strategies as st
from llm2vec_reference import hf_linear_factor, hf_trainer_schedule_steps
from safetensors.torch import load_file
from test_never_worse import an_unbeatable_start

from csekit.core.errors import CsekitError
from csekit.training.recipe import load_recipe
from csekit.training.schedule import Schedule
from csekit.training.trainer import train

REPO = Path(__file__).resolve().parents[3]
LLM2VEC_RECIPES = [
    "llm2vec-simcse-sheared-llama.yaml",
    "llm2vec-simcse-mistral-7b.yaml",
    "llm2vec-dclr-sheared-llama.yaml",
]


def rates(schedule: Schedule, lr: float, steps: int) -> list[float]:
    """The host scheduler's rate after 0, 1, ..., `steps` steps."""
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    scheduler = schedule.scheduler(optimizer)
    found = [scheduler.get_last_lr()[0]]
    for _ in range(steps):
        optimizer.step()
        scheduler.step()
        found.append(scheduler.get_last_lr()[0])
    return found


@pytest.mark.parametrize("name", LLM2VEC_RECIPES)
def test_the_llm2vec_recipes_rate_at_step_1000_is_the_hf_trainers(name: str) -> None:
    train_config = load_recipe(REPO / "recipes" / name).train
    schedule = Schedule.of(train_config, train_config.max_steps)
    # run_simcse.py: 1M sentences, batch 128, no num_train_epochs (3), stopped at 1,000 steps of that schedule
    total = hf_trainer_schedule_steps(1_000_000, 128)
    assert (schedule.length, schedule.run_steps, schedule.warmup_steps, total) == (23_439, 1000, 0, 23_439)
    at_1000 = rates(schedule, train_config.lr, 1000)[-1]
    assert at_1000 == 3e-5 * hf_linear_factor(1000, 0, total)
    assert round(at_1000, 9) == 2.872e-5
    on_device = 3e-5 * schedule.device_factor(torch.tensor(1000.0, dtype=torch.float64))
    assert on_device.item() == at_1000  # sync-free steps read the same rate
    csekits_own = Schedule.of(load_recipe(REPO / "recipes" / name, ["train.schedule_steps=null"]).train, 1000)
    assert rates(csekits_own, 3e-5, 1000)[-1] == 0.0  # csekit's default horizon: the run's, decaying to 0


def test_the_constant_schedule_is_sentence_transformers_constantlr() -> None:
    from sentence_transformers.sentence_transformer.fit_mixin import FitMixin

    train_config = load_recipe(REPO / "recipes" / "tsdae-bert-base.yaml").train
    assert (train_config.schedule, train_config.keep) == ("constant", "last")
    schedule = Schedule.of(train_config, 125_000)
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=3e-5)
    theirs = FitMixin._get_scheduler(optimizer, "constantlr", warmup_steps=0, t_total=125_000)
    ours = rates(schedule, 3e-5, 50)
    for step in range(51):
        assert ours[step] == theirs.get_last_lr()[0] == 3e-5
        optimizer.step()
        theirs.step()
    warm = Schedule.of(load_recipe(REPO / "recipes" / "tsdae-bert-base.yaml", ["train.warmup_ratio=0.1"]).train, 40)
    assert rates(warm, 1.0, 40) == [min(1.0, step / 4) for step in range(41)]  # warm-up then flat
    for step in (0, 2, 4, 30):
        assert warm.device_factor(torch.tensor(float(step), dtype=torch.float64)).item() == min(1.0, step / 4)


@pytest.mark.parametrize("schedule", ["linear", "constant"])
def test_a_run_logs_the_schedules_rates_in_the_plain_loop_and_in_sync_free_steps(
    train_tiny: TinyTrainer, schedule: str
) -> None:
    runs = {}
    for sync_free in ("false", "true"):
        runs[sync_free] = train_tiny(
            "train.log_every=1",
            f"train.schedule={schedule}",
            "train.schedule_steps=20",
            "train.warmup_ratio=0.1",  # 2 steps of the schedule's 20
            f"run.sync_free={sync_free}",
            steps=6,
            name=sync_free,
        ).folder
    for sync_free, run in runs.items():
        logged = [record["lr"] for record in read_metrics(run) if "loss" in record]
        factors = [hf_linear_factor(step, 2, 20) if schedule == "linear" else min(1.0, step / 2) for step in range(7)]
        assert logged == [5e-4 * factor for factor in factors[1:]], sync_free
    plain, sync_free_weights = (load_file(runs[run] / "last" / "model.safetensors") for run in ("false", "true"))
    for name, tensor in plain.items():
        torch.testing.assert_close(sync_free_weights[name], tensor, rtol=0, atol=0, msg=name)


def test_keep_last_saves_the_last_evaluated_model_where_best_keeps_the_start(
    tmp_path: Path, tiny_model_dir: Path, train_tiny: TinyTrainer
) -> None:
    """A dev file that no step can beat (the start ranks it perfectly): `best` keeps the start, `last` the last."""
    unbeatable = an_unbeatable_start(tiny_model_dir, tmp_path)
    runs = {
        keep: train_tiny(*unbeatable, f"train.keep={keep}", steps=4, eval_every=2, name=keep)
        for keep in ("best", "last")
    }
    results = {keep: run.result for keep, run in runs.items()}
    folder = {keep: run.folder for keep, run in runs.items()}
    assert results["best"].best_step == 0 and results["last"].best_step == 4
    last = load_file(folder["last"] / "last" / "model.safetensors")
    kept = load_file(folder["last"] / "best" / "model.safetensors")
    start = load_file(folder["best"] / "best" / "model.safetensors")
    assert all(torch.equal(kept[name], last[name]) for name in last)
    assert not all(torch.equal(kept[name], start[name]) for name in start)
    summary = results["last"].summary()[0]
    assert "best/ is the last evaluated model (train.keep: last), step 4" in summary
    assert results["last"].start_scores is not None  # the start is still scored and reported


def test_the_new_keys_are_checked_when_the_recipe_is_loaded(tmp_path: Path, tiny_model_dir: Path) -> None:
    quickstart = REPO / "recipes" / "quickstart.yaml"
    for overrides, message in (
        (["train.schedule=cosine"], r"train\.schedule must be one of linear, constant"),
        (["train.keep=first"], r"train\.keep must be one of best, last"),
        (["train.keep=last", "train.patience=3"], r"train\.patience stops a run .* keep: best"),
        (["train.schedule_steps=100"], r"train\.schedule_steps: 100 ends before the run's 300 steps"),
        (["train.schedule_steps=0"], r"train\.schedule_steps must be from 1 to"),
    ):
        with pytest.raises(CsekitError, match=message):
            load_recipe(quickstart, overrides)
    # With epochs the run's length needs the corpus: refused before the run folder is made.
    corpus = make_corpus(tmp_path / "corpus.txt", lines=64)  # 4 steps an epoch of 16
    recipe = tiny_recipe(tiny_model_dir, corpus, "train.epochs=2", "train.schedule_steps=5")
    with pytest.raises(CsekitError, match=r"ends before the run's 8 steps"):
        train(recipe, tmp_path / "run", show_progress=False)
    assert not (tmp_path / "run").exists()


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    kind=st.sampled_from(["linear", "constant"]),
    warmup_ratio=st.floats(0, 0.5),
    steps=st.integers(1, 300),
    extra=st.integers(0, 20),
)
def test_the_host_schedules_are_transformers_own(kind: str, warmup_ratio: float, steps: int, extra: int) -> None:
    """Schedule.scheduler gives transformers' `get_linear_schedule_with_warmup` or
    `get_constant_schedule_with_warmup` learning rates at every step, past the end included, and either's state
    loads in the other (checkpoints of older runs resume), without importing transformers.optimization."""
    from transformers import get_constant_schedule_with_warmup, get_linear_schedule_with_warmup

    train = load_recipe(None, [f"train.schedule={kind}", f"train.warmup_ratio={warmup_ratio}"]).train
    schedule = Schedule.of(train, steps)

    def optimizer() -> torch.optim.Optimizer:
        return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=3e-5)

    ours_optimizer, theirs_optimizer = optimizer(), optimizer()
    ours = schedule.scheduler(ours_optimizer)
    if kind == "linear":
        theirs = get_linear_schedule_with_warmup(theirs_optimizer, schedule.warmup_steps, schedule.length)
    else:
        theirs = get_constant_schedule_with_warmup(theirs_optimizer, schedule.warmup_steps)
    for _ in range(steps + extra):
        assert ours.get_last_lr() == theirs.get_last_lr()
        ours_optimizer.step()
        theirs_optimizer.step()
        ours.step()
        theirs.step()
    resumed = schedule.scheduler(optimizer())
    resumed.load_state_dict(theirs.state_dict())
    assert resumed.get_last_lr() == theirs.get_last_lr() and resumed.last_epoch == theirs.last_epoch

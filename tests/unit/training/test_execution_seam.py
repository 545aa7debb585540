"""The trainer's execution seam (issue 66): one step runner chosen from `Execution`, the precision decided once for
the Accelerator, the Execution and dev scoring, and sharding's refusals and replacements decided in
`decide_execution` with every other execution setting."""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from accelerate.utils import DistributedType
from conftest import make_corpus, make_data_dir, read_metrics, tiny_recipe
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from csekit.core.errors import CsekitError
from csekit.encoding.encoder import SentenceEncoder
from csekit.training import execution as execution_module
from csekit.training.execution import decide_execution
from csekit.training.processes import own_accelerator_state
from csekit.training.progress_log import ProgressLog
from csekit.training.recipe import load_recipe
from csekit.training.recipe_schema import COMPILE_MODES, SYNC_FREE_CHOICES
from csekit.training.run_folder import MetricsLog, TrainerState
from csekit.training.schedule import Schedule
from csekit.training.sharding import active_sharding
from csekit.training.step_runner import PlainSteps, StepLoop
from csekit.training.sync_free import SyncFreeSteps
from csekit.training.trainer import Trainer

SRC = Path(__file__).resolve().parents[3] / "src" / "csekit"
TRAINER = SRC / "training" / "trainer.py"

SYNC_FREE_WORDS = re.compile(r"sync[-_ ]?free", re.IGNORECASE)


def lines_naming_sync_free(source: str) -> list[str]:
    """The lines of `source` that name sync-free steps: their key, module, class, attribute or the words."""
    return [
        f"{number}: {line.strip()}"
        for number, line in enumerate(source.splitlines(), 1)
        if SYNC_FREE_WORDS.search(line)
    ]


def test_the_trainer_names_no_sync_free_step() -> None:
    """Which steps a run takes is decided once (`Execution.step_runner`); the loop calls its runner without asking."""
    assert lines_naming_sync_free(TRAINER.read_text(encoding="utf-8")) == []


def test_the_sync_free_check_can_fail() -> None:
    source = "if self.sync_free is not None:\n    pass\n# Sync-free steps read here\nSyncFreeSteps(x)\nplain = 1\n"
    assert [line.split(":")[0] for line in lines_naming_sync_free(source)] == ["1", "3", "4"]


def calls_of(source: str, names: set[str]) -> list[str]:
    """The calls in `source` of a function named in `names` (as a plain name or an attribute)."""
    return [
        f"{node.lineno}: {ast.unparse(node.func)}"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] in names
    ]


DECIDERS = {"training_precision", "choose_precision", "resolve_precision"}
"""What decides a training run's precision (`training_precision`) and what it is made of."""


def test_the_precision_of_a_run_is_decided_in_execution_py_only() -> None:
    """The trainer reads `Execution.precision`; only execution.py asks `training_precision` (once a run)."""
    training = {path.name: path.read_text(encoding="utf-8") for path in (SRC / "training").glob("*.py")}
    callers = {name for name, source in training.items() if calls_of(source, {"training_precision"})}
    assert callers == {"execution.py"}
    assert calls_of(training["trainer.py"], DECIDERS) == []
    assert calls_of("precision = training_precision(x)[0]\nself.p.resolve_precision(y)\n", DECIDERS) != []


def test_the_one_precision_decision_reaches_the_accelerator_the_execution_and_dev_scoring(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The recipe asks for fp32 and the decider answers bf16: the Accelerator's autocast, the Execution, the start
    record and dev scoring (`train.dev_precision: training`) all get bf16, from one decision a run."""
    asked: list[str] = []

    def bf16_decider(requested: str) -> tuple[str, list[str]]:
        asked.append(requested)
        return "bf16", ["csekit: train.precision decided by the test"]

    encoded: list[object] = []
    encode = SentenceEncoder.encode

    def recording(self: SentenceEncoder, sentences: list[str], *args: object, **kwargs: object) -> np.ndarray:
        encoded.append(kwargs.get("precision"))
        return encode(self, sentences, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(execution_module, "training_precision", bf16_decider)
    monkeypatch.setattr(SentenceEncoder, "encode", recording)
    corpus = make_corpus(tmp_path / "corpus.txt", lines=64)
    extra = ("train.precision=fp32", "train.dev_precision=training", "train.max_steps=2", "train.eval_every=2")
    recipe = tiny_recipe(tiny_model_dir, corpus, *extra, "train.dev_task=stsb-dev")
    with contextlib.ExitStack() as held:
        held.enter_context(own_accelerator_state())
        trainer = Trainer(recipe, tmp_path / "run", make_data_dir(tmp_path / "data"), False, False, False, held)
        assert trainer.accelerator.mixed_precision == "bf16" and trainer.execution.precision == "bf16"
        trainer.run()
    assert asked == ["fp32"]
    assert encoded and set(encoded) == {"bf16"}
    (start,) = [record for record in read_metrics(tmp_path / "run") if record.get("event") == "start"]
    assert start["precision"] == "bf16"


def loop_for(optimizer: torch.optim.Optimizer) -> StepLoop:
    recipe = load_recipe(None, ["train.max_steps=4"])
    schedule = Schedule.of(recipe.train, 4)
    progress = ProgressLog(4, 0, False, recipe.train.select_metric)
    metrics = MetricsLog(Path("unused.jsonl"), enabled=False)
    scheduler = schedule.scheduler(optimizer)
    return StepLoop(
        optimizer,
        scheduler,
        schedule,
        TrainerState(),
        progress,
        metrics,
        recipe.train,
        4,
        1,
        torch.device("cpu"),
        Path(),
    )


@pytest.mark.parametrize(("device_type", "runner"), [("cpu", PlainSteps), ("cuda", SyncFreeSteps)])
def test_the_step_runner_is_the_one_the_execution_decided(device_type: str, runner: type) -> None:
    """`run.sync_free: auto` on CUDA and a CPU (`SYNC_FREE_AUTO_DEVICES`), and each value asked for explicitly."""
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=1e-3, fused=True)
    execution = decide_execution(load_recipe(None), device_type=device_type)
    assert isinstance(execution.step_runner(loop_for(optimizer)), runner)
    for sync_free, expected in (("true", SyncFreeSteps), ("false", PlainSteps)):
        asked = decide_execution(load_recipe(None, [f"run.sync_free={sync_free}"]), device_type=device_type)
        assert isinstance(asked.step_runner(loop_for(optimizer)), expected)


def test_the_sharding_an_accelerator_runs_is_the_one_decide_execution_gets() -> None:
    def accelerator(kind: DistributedType) -> SimpleNamespace:
        return SimpleNamespace(distributed_type=kind)

    assert active_sharding(accelerator(DistributedType.FSDP)) == "fsdp"  # type: ignore[arg-type]
    assert active_sharding(accelerator(DistributedType.DEEPSPEED)) == "deepspeed"  # type: ignore[arg-type]
    for plain in (DistributedType.NO, DistributedType.MULTI_CPU, DistributedType.MULTI_GPU):
        assert active_sharding(accelerator(plain)) is None  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sharding must be one of fsdp, deepspeed"):
        decide_execution(load_recipe(None), device_type="cpu", sharding="zero")


def mostly(left_alone: list[str], asked: list[str]) -> st.SearchStrategy[str]:
    """A setting left alone three times in four (so that runs asking for nothing are drawn often), else asked for."""
    return st.one_of(
        st.sampled_from(left_alone), st.sampled_from(left_alone), st.sampled_from(left_alone), st.sampled_from(asked)
    )


@given(
    sync_free=mostly(["auto", "false"], [*SYNC_FREE_CHOICES, "True"]),
    compile_mode=mostly(["auto", "none"], list(COMPILE_MODES)),
    packed=mostly(["auto", "false"], ["true"]),
    compute_copies=mostly(["auto", "false"], ["true"]),
    chunk_size=mostly(["null"], ["8"]),
    precision=st.sampled_from(["fp32", "bf16"]),
    device_type=st.sampled_from(["cpu", "cuda"]),
    sharding=st.sampled_from(["fsdp", "deepspeed"]),
)
@example("auto", "auto", "auto", "auto", "null", "bf16", "cuda", "fsdp")  # every auto that turns on off sharded
@example("True", "auto", "auto", "auto", "null", "fp32", "cpu", "deepspeed")  # YAML's true, refused
@settings(max_examples=80, deadline=None, derandomize=True)
def test_a_sharded_run_refuses_what_is_asked_for_and_leaves_each_auto_off(
    sync_free: str,
    compile_mode: str,
    packed: str,
    compute_copies: str,
    chunk_size: str,
    precision: str,
    device_type: str,
    sharding: str,
) -> None:
    """Under FSDP or DeepSpeed, sync-free steps, chunks, compute copies, a compile and the packed pass are not proven:
    asked for, one line naming the key; left `auto`, off (padded, eager, plain steps); everything else is the
    unsharded run's execution. A refusal that does not depend on sharding is the same sharded or not."""
    settings_asked = {
        "run.sync_free": sync_free,
        "run.compile": compile_mode,
        "run.packed": packed,
        "run.compute_copies": compute_copies,
        "run.chunk_size": chunk_size,
        "train.precision": precision,
    }
    try:
        recipe = load_recipe(None, [f"{key}={value}" for key, value in settings_asked.items()])
    except CsekitError:
        assume(False)  # refused when the recipe is read, before any execution is decided
        return
    try:
        unsharded = decide_execution(recipe, device_type=device_type)
    except CsekitError as error:
        with pytest.raises(CsekitError, match=re.escape(str(error))):
            decide_execution(recipe, device_type=device_type, sharding=sharding)
        return
    asked = [
        key
        for key, yes in (
            ("run.sync_free", sync_free.lower() == "true"),
            ("run.chunk_size", chunk_size != "null"),
            ("run.compute_copies", compute_copies == "true"),
            ("run.compile", compile_mode not in ("none", "auto")),
            ("run.packed", packed == "true"),
        )
        if yes
    ]
    if asked:
        with pytest.raises(CsekitError, match=r"is not supported under FSDP or DeepSpeed") as refused:
            decide_execution(recipe, device_type=device_type, sharding=sharding)
        message = str(refused.value)
        assert "\n" not in message and any(message.startswith(f"recipe key {key}") for key in asked), message
        return
    sharded = decide_execution(recipe, device_type=device_type, sharding=sharding)
    run = dataclasses.replace(unsharded.run, packed=False, compile="none")
    expected = dataclasses.replace(unsharded, run=run, sync_free=False, compute_copies=False, sharding=sharding)
    assert sharded == expected
    assert not sharded.pass_plan(torch.nn.Module()).packed and sharded.compile_for(torch.nn.Module()) == "none"


def calls_by_function(source: str, names: set[str]) -> set[tuple[str, str]]:
    """(the function a call stands in, the function called) for each call in `source` of a name in `names`."""
    found: set[tuple[str, str]] = set()

    def visit(node: ast.AST, inside: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Call) and ast.unparse(child.func).split(".")[-1] in names:
                found.add((inside, ast.unparse(child.func).split(".")[-1]))
            is_function = isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            visit(child, child.name if is_function else inside)  # type: ignore[union-attr]

    visit(ast.parse(source), "<module>")
    return found


SHARDING_CHECKS = {"check_sharding_request", "check_deepspeed_request", "_sharded"}
"""What refuses or replaces settings under sharding: the launch config's checks and the recipe's."""


def test_the_sharding_checks_are_called_by_decide_execution_only() -> None:
    """The rule stays in one place: sharding's refusals and replacements are reached through `decide_execution` only
    (no other module, benchmarks included, checks a launch or a sharded recipe itself)."""
    sources = [*SRC.rglob("*.py"), *(SRC.parents[1] / "benchmarks").rglob("*.py")]
    calls = {
        (path.relative_to(SRC.parents[1]).as_posix(), *call)
        for path in sources
        for call in calls_by_function(path.read_text(encoding="utf-8"), SHARDING_CHECKS)
    }
    assert calls == {
        ("src/csekit/training/execution.py", "decide_execution", "check_sharding_request"),
        ("src/csekit/training/execution.py", "decide_execution", "_sharded"),
        ("src/csekit/training/sharding.py", "check_sharding_request", "check_deepspeed_request"),
    }
    elsewhere = "def start(r):\n    sharding.check_sharding_request(1.0, 'fp32')\n"
    assert calls_by_function(elsewhere, SHARDING_CHECKS) == {("start", "check_sharding_request")}  # it can fail


DEEPSPEED = {"ACCELERATE_USE_DEEPSPEED": "true"}
FSDP2 = {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2"}


@pytest.mark.parametrize(
    ("environment", "installed", "precision"),
    [
        (DEEPSPEED, False, "fp32"),  # not installed: the install line
        ({**DEEPSPEED, "ACCELERATE_DEEPSPEED_ZERO_STAGE": "4"}, True, "fp32"),
        ({**DEEPSPEED, "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE": "cpu"}, True, "bf16"),
        ({**DEEPSPEED, "ACCELERATE_GRADIENT_CLIPPING": "0.5"}, True, "fp32"),  # the recipe's is 1.0
        (DEEPSPEED, True, "fp16"),
        ({"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "1"}, False, "fp32"),
        ({"ACCELERATE_USE_FSDP": "true"}, False, "bf16"),  # no version: accelerate's FSDP1
    ],
)
def test_decide_execution_refuses_the_launch_check_sharding_request_refuses(
    monkeypatch: pytest.MonkeyPatch, environment: dict[str, str], installed: bool, precision: str
) -> None:
    """The launch's own settings, as `accelerate launch` puts them in the environment, are refused by
    `decide_execution` with `check_sharding_request`'s line, before the recipe's refusals under sharding (here
    run.chunk_size)."""
    import importlib.util
    import os

    from csekit.training.sharding import check_sharding_request, requested_sharding

    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    real = importlib.util.find_spec
    found = lambda name, *args: (object() if installed else None) if name == "deepspeed" else real(name)  # noqa: E731
    monkeypatch.setattr(importlib.util, "find_spec", found)
    recipe = load_recipe(None, ["train.max_grad_norm=1.0", "run.chunk_size=8"])
    with pytest.raises(CsekitError) as checked:
        check_sharding_request(1.0, precision)
    sharding = requested_sharding()
    with pytest.raises(CsekitError) as decided:
        decide_execution(recipe, device_type="cuda", sharding=sharding, precision=(precision, []), launch=os.environ)
    assert str(decided.value) == str(checked.value) and "\n" not in str(decided.value)
    with pytest.raises(CsekitError, match=r"run\.chunk_size is not supported under FSDP or DeepSpeed"):
        decide_execution(recipe, device_type="cuda", sharding=sharding, precision=(precision, []))  # no launch


@given(
    asked=st.sampled_from([{}, DEEPSPEED, FSDP2, {**DEEPSPEED, **FSDP2}]),
    fsdp_version=st.sampled_from([None, "1", "2"]),
    stage=st.sampled_from([None, "1", "2", "3", "4", "two"]),
    offload=st.sampled_from([None, "none", "cpu"]),
    config_file=st.sampled_from([None, "none", "ds.json"]),
    zero3_init=st.sampled_from([None, "false", "true"]),
    accumulation=st.sampled_from([None, "1", "2"]),
    clipping=st.sampled_from([None, "auto", "1.0", "0.5"]),
    installed=st.booleans(),
    precision=st.sampled_from(["fp32", "bf16", "fp16"]),
)
@settings(max_examples=60)
def test_decide_execution_refuses_exactly_what_check_sharding_request_refuses(
    asked: dict[str, str],
    fsdp_version: str | None,
    stage: str | None,
    offload: str | None,
    config_file: str | None,
    zero3_init: str | None,
    accumulation: str | None,
    clipping: str | None,
    installed: bool,
    precision: str,
) -> None:
    """Over launch environments generated key by key: refused with the same line, else decided under the sharding
    the launch asks for (the recipe's own replacements applied)."""
    import importlib.util
    from unittest import mock

    from csekit.training.sharding import check_sharding_request, requested_sharding

    settings_asked = {
        "FSDP_VERSION": fsdp_version,
        "ACCELERATE_DEEPSPEED_ZERO_STAGE": stage,
        "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE": offload,
        "ACCELERATE_DEEPSPEED_CONFIG_FILE": config_file,
        "ACCELERATE_DEEPSPEED_ZERO3_INIT": zero3_init,
        "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": accumulation,
        "ACCELERATE_GRADIENT_CLIPPING": clipping,
    }
    launch = {**asked, **{key: value for key, value in settings_asked.items() if value is not None}}
    real = importlib.util.find_spec
    found = lambda name, *args: (object() if installed else None) if name == "deepspeed" else real(name)  # noqa: E731
    recipe = load_recipe(None, ["train.max_grad_norm=1.0"])
    with mock.patch.object(importlib.util, "find_spec", found):
        try:
            check_sharding_request(1.0, precision, launch)
            refusal = None
        except CsekitError as error:
            refusal = str(error)
        sharding = requested_sharding(launch)
        if refusal is not None:
            with pytest.raises(CsekitError) as decided:
                decide_execution(
                    recipe, device_type="cuda", sharding=sharding, precision=(precision, []), launch=launch
                )
            assert str(decided.value) == refusal
            return
        execution = decide_execution(
            recipe, device_type="cuda", sharding=sharding, precision=(precision, []), launch=launch
        )
    assert execution.sharding == sharding and (sharding is None or not execution.sync_free)


def test_the_launch_given_is_the_one_the_sharding_was_read_from() -> None:
    with pytest.raises(ValueError, match="sharding 'fsdp' is not the one the launch asks for"):
        decide_execution(load_recipe(None), device_type="cpu", sharding="fsdp", launch={})


def test_one_process_that_accelerate_leaves_unsharded_trains_unsharded(monkeypatch: pytest.MonkeyPatch) -> None:
    """An FSDP2 launch of one CPU process: accelerate keeps it unsharded (DistributedType.NO); one process has
    nothing to shard, so the run trains with the unsharded execution, as before the launch was read first."""
    from csekit.training.execution import start_execution

    for name, value in FSDP2.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    recipe = load_recipe(None, ["train.precision=fp32"])
    with own_accelerator_state():
        accelerator, execution = start_execution(recipe, [])
        assert accelerator.num_processes == 1 and active_sharding(accelerator) is None
    assert execution == decide_execution(recipe, [], "cpu")


def test_several_processes_that_do_not_run_the_decided_sharding_are_one_line() -> None:
    """Two processes that accelerate runs unsharded where the launch asked for FSDP: one line, not a run that
    silently trains every process with the whole model."""
    from csekit.training.execution import check_active_sharding

    class TwoUnshardedProcesses:
        num_processes = 2
        distributed_type = DistributedType.MULTI_CPU

    with pytest.raises(CsekitError) as refused:
        check_active_sharding(TwoUnshardedProcesses(), "fsdp")  # type: ignore[arg-type]
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("the accelerate launch asks for fsdp but accelerate runs unsharded (distributed_type")
    assert check_active_sharding(TwoUnshardedProcesses(), None) is None  # type: ignore[arg-type]


def test_an_accelerator_on_another_device_kind_gets_the_execution_decided_for_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Decided first for the device kind `training_device_type` names, then for the Accelerator's where it differs
    (mps: a kind it does not name), as when the execution was decided from the Accelerator."""
    from csekit.training.execution import start_execution

    monkeypatch.setattr(execution_module, "training_device_type", lambda: "cuda")
    with own_accelerator_state():
        accelerator, execution = start_execution(load_recipe(None, ["train.precision=fp32"]), [])
        assert accelerator.device.type == execution.device_type == "cpu"
    assert execution == decide_execution(load_recipe(None, ["train.precision=fp32"]), [], "cpu")

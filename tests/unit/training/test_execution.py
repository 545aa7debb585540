"""Execution apart from method: the recipe's `run:` section, its old places, resumes, and the one seam.

A recipe's `run:` section says how this machine executes a step (csekit/training/execution.py decides each
`auto`); nothing there changes what is learned beyond float rounding, so a resume may change it freely.
"""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

import pytest
import torch
import yaml
from conftest import make_corpus, read_metrics, run_cli, tiny_recipe
from hypothesis import given, settings
from hypothesis import strategies as st
from test_chunked import train_in_a_fresh_process

from csekit.core.errors import CsekitError
from csekit.training.execution import decide_execution
from csekit.training.recipe import LEGACY_RUN_KEYS, RUN_SECTION, RunConfig, load_recipe

REPO = Path(__file__).resolve().parents[3]
SRC = REPO / "src" / "csekit"


def test_every_execution_setting_has_one_old_place_and_every_old_place_one_setting() -> None:
    """The old places cover the whole section (a saved run of any age resumes with every setting it gave)."""
    # Settings added after the run: section existed have no old place (fused_qkv, packed_bucket: issue 47, Build 2;
    # compute_copies: issue 62).
    newer = {"gradient_checkpointing", "fused_qkv", "packed_bucket", "compute_copies"}
    fields = {field.name for field in dataclasses.fields(RunConfig)} - newer
    assert sorted(LEGACY_RUN_KEYS.values()) == sorted(fields)


def test_an_old_recipe_loads_its_settings_into_run_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "old.yaml"
    path.write_text("model:\n  packed: false\n  pooler: cls\ntrain:\n  chunk_size: 4\n  lr: 1.0e-5\n")
    recipe = load_recipe(path, ["data.num_workers=0"])
    assert (recipe.run.packed, recipe.run.chunk_size, recipe.run.num_workers) == (False, 4, 0)
    assert recipe.train.lr == 1e-5
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "run: section" in lines[0]
    for key in ("model.packed as run.packed", "train.chunk_size as run.chunk_size", "data.num_workers"):
        assert key in lines[0]
    assert "run:" in recipe.to_yaml() and "packed" not in yaml.safe_load(recipe.to_yaml())["model"]
    load_recipe(path, note_legacy_keys=False)
    assert capsys.readouterr().err == ""


def test_an_old_key_with_a_bad_value_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "old.yaml"
    path.write_text("model:\n  pooler: cls\ntrain:\n  lr: 1.0e-5\n  chunk_size: 0\n")
    with pytest.raises(CsekitError, match=rf"{path}:5: recipe key run\.chunk_size must be at least 1"):
        load_recipe(path)


def test_a_setting_given_in_both_places_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "both.yaml"
    path.write_text("model:\n  packed: false\nrun:\n  packed: true\n")
    with pytest.raises(CsekitError, match=rf"{path}:2: recipe key model\.packed is given again as run\.packed"):
        load_recipe(path)


def test_auto_is_decided_per_device_kind(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The figures behind each `auto` (docs/performance.md, "On a GPU III"): CPU training packs and groups by
    length; CUDA packs in one pass where the flash kernel runs it (bf16/fp16, Ampere on), its query, key and
    value as one product, and runs padded elsewhere; CUDA steps are sync-free, CPU steps not; a GPU collates in
    worker processes, a CPU in the main one."""
    from csekit.encoding import packed
    from csekit.encoding.encoder import SentenceEncoder
    from csekit.encoding.passes import PassPlan

    backbone = SentenceEncoder.load(tiny_model_dir).backbone
    capability = {"value": (9, 0)}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.backends.cuda, "is_flash_attention_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability["value"])

    def decided(kind: str, precision: str) -> object:
        return decide_execution(load_recipe(None, [f"train.precision={precision}"]), device_type=kind)

    cpu, cuda = decided("cpu", "fp32"), decided("cuda", "bf16")
    assert cpu.pass_plan(backbone) == PassPlan(True, False, 32)
    assert cuda.pass_plan(backbone) == PassPlan(True, False, 0, fused_qkv=True)
    unfused = decide_execution(load_recipe(None, ["train.precision=bf16", "run.fused_qkv=false"]), device_type="cuda")
    assert unfused.pass_plan(backbone) == PassPlan(True, False, 0)
    assert decided("cuda", "fp32").pass_plan(backbone) == PassPlan(False, False, 0)  # no flash kernel in fp32
    capability["value"] = (7, 5)  # a T4: no flash kernel, so the packed attention would run in groups
    assert decided("cuda", "bf16").pass_plan(backbone) == PassPlan(False, False, 0)
    assert not packed.flash_packing_runs(torch.device("cpu"), torch.bfloat16)
    assert not cpu.sync_free and cuda.sync_free
    assert cpu.loader.num_workers == 0 and not cpu.loader.pin_memory and cuda.loader.pin_memory
    monkeypatch.undo()
    compiled = decide_execution(load_recipe(None, ["run.compile=default"]), device_type="cpu")
    assert not compiled.pass_plan(backbone).packed  # the compiled forward runs padded to its buckets


def test_a_resume_may_change_every_execution_setting_of_an_old_run(tmp_path: Path, tiny_model_dir: Path) -> None:
    """A run saved before the run: section (its recipes give the settings under model/data/train) resumes with
    other execution settings and no --allow-changes; each change is recorded; a method key is still refused."""
    corpus = make_corpus(tmp_path / "corpus.txt", lines=64)
    common = ("train.eval_every=1", "train.max_steps=2")
    run = tmp_path / "run"
    train_in_a_fresh_process(tiny_recipe(tiny_model_dir, corpus, *common), run)
    for saved in (run / "recipe.yaml", run / "checkpoint" / "recipe.yaml"):  # as csekit 0.x wrote them
        values = yaml.safe_load(saved.read_text())
        for old, key in LEGACY_RUN_KEYS.items():
            section, name = old.split(".")
            values[section][name] = values[RUN_SECTION].pop(key)
        del values[RUN_SECTION]
        saved.write_text(yaml.safe_dump(values, sort_keys=False))
    changes = ["run.length_group_size=4", "run.eval_batch_size=7", "run.fast_dropout=false", "run.packed=false"]

    def resume(*overrides: str) -> tuple[int, str]:
        settings = [item for override in (*common, *overrides) for item in ("--set", override)]
        done = run_cli("train", "--output", str(run), "--resume", "--no-progress", *settings, cwd=tmp_path)
        return done.returncode, done.stderr

    code, stderr = resume(*changes, "train.lr=1e-3")
    assert code == 2 and "recipe key train.lr" in stderr
    code, stderr = resume(*changes)
    assert code == 0, stderr[-2000:]
    (record,) = [r for r in read_metrics(run) if r.get("event") == "recipe_changed"]
    assert record["changes"] == {
        "run.length_group_size": [32, 4],
        "run.fast_dropout": [True, False],
        "run.packed": ["auto", False],
        "run.eval_batch_size": [128, 7],
    }
    saved = yaml.safe_load((run / "recipe.yaml").read_text())
    assert saved[RUN_SECTION]["eval_batch_size"] == 7 and "length_group_size" not in saved["model"]


def _encoder_attribute_writes(source: str) -> list[str]:
    """Assignments (and setattr calls) whose target is an attribute of an object named like an encoder."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr" and node.args:
            targets = [ast.Attribute(value=node.args[0], attr="?")]
        else:
            continue
        for target in targets:
            for sub in ast.walk(target):
                owner = sub.value if isinstance(sub, ast.Attribute) else None
                name = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", "")
                if "encoder" in name.lower():
                    found.append(f"{node.lineno}: {ast.unparse(target)}")
    return found


def test_nothing_sets_attributes_on_a_built_encoder() -> None:
    """How a pass runs, which head is kept, what the model card says: given to the encoder when it is made or
    saved (encoding/encoder.py, its home), never set on it afterwards by training or evaluation code."""
    home = SRC / "encoding" / "encoder.py"
    found = {
        str(path.relative_to(REPO)): writes
        for path in sorted(SRC.rglob("*.py"))
        if path != home and (writes := _encoder_attribute_writes(path.read_text(encoding="utf-8")))
    }
    assert found == {}


def test_the_encoder_attribute_check_can_fail() -> None:
    source = (
        "def f(encoder, model):\n    encoder.packed = True\n    model.encoder.head = 1\n    setattr(encoder, 'x', 1)\n"
    )
    assert len(_encoder_attribute_writes(source)) == 3
    assert _encoder_attribute_writes("def f(self, encoder):\n    self.encoder = encoder\n") == []


def test_the_card_and_the_resume_exemptions_read_no_hand_kept_list() -> None:
    """The run folder compares the method part only: no list of exempt keys to forget a new setting in."""
    source = (SRC / "training" / "run_folder.py").read_text(encoding="utf-8")
    assert "SAME_UPDATE_KEYS" not in source and "RUN_SECTION" in source
    assert json.loads(json.dumps(dataclasses.asdict(RunConfig())))  # every setting serialises (metrics.jsonl)


def test_compile_auto_chooses_cuda_graphs_only_for_runs_that_repay_the_compile(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`run.compile: auto` (issue 62 item 5): CUDA graphs over the bucketed packed pass on CUDA in half precision
    when the run is at least the measured break-even long (5,800 steps at batch 64), none otherwise: on a CPU, for a
    short run, before the run's length is known, for ConSERT's views, with compute copies and where the fixed-shape
    pass cannot run."""
    from csekit.encoding.encoder import SentenceEncoder

    backbone = SentenceEncoder.load(tiny_model_dir).backbone
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.backends.cuda, "is_flash_attention_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))

    def decided(kind: str, steps: int | None, *extra: str):  # type: ignore[no-untyped-def]
        execution = decide_execution(load_recipe(None, ["train.precision=bf16", *extra]), device_type=kind)
        return execution if steps is None else execution.for_run_length(steps, 64)

    long = decided("cuda", 5_800)
    assert long.compile_for(backbone) == "reduce-overhead" and long.bucket_for(backbone, 32) == 256
    plan = long.pass_plan(backbone, 32)
    assert plan.packed and plan.token_bucket == 256 and plan.width_bound == 32 and plan.layer_stack is not None
    assert decided("cuda", 5_799).compile_for(backbone) == "none"
    assert decided("cuda", None).compile_for(backbone) == "none"  # the run's length not known yet
    assert decided("cpu", 10**6).compile_for(backbone) == "none"
    assert decided("cuda", 10**6, "train.precision=fp32").compile_for(backbone) == "none"  # no flash kernel in fp32
    assert decided("cuda", 10**6, "run.packed=false").compile_for(backbone) == "none"
    assert decided("cuda", 10**6, "data.views={name: consert}").compile_for(backbone) == "none"
    assert decided("cuda", 10**6, "run.compute_copies=true").compile_for(backbone) == "none"  # asked for instead
    short = decided("cuda", 1_000)
    assert short.bucket_for(backbone, 32) == 0 and short.pass_plan(backbone, 32).layer_stack is None
    asked = decided("cuda", 1_000, "run.compile=default", "run.packed_bucket=128")
    assert asked.compile_for(backbone) == "default" and asked.bucket_for(backbone, 32) == 128
    with pytest.raises(CsekitError, match=r"ConSERT's views .* need none"):
        decided("cpu", 10, "run.compile=default", "data.views={name: consert}").prepare_backbone(
            backbone, load_recipe(None, ["run.compile=default"])
        )


@given(st.integers(1, 1 << 16), st.integers(1, 1 << 16))
@settings(max_examples=80, deadline=None, derandomize=True)
def test_the_break_even_grows_with_the_batch_and_meets_the_measured_points(small: int, large: int) -> None:
    from csekit.training.compiled import BREAK_EVEN_STEPS, break_even_steps

    small, large = sorted((small, large))
    assert break_even_steps(small) <= break_even_steps(large)
    assert min(BREAK_EVEN_STEPS.values()) <= break_even_steps(small) <= max(BREAK_EVEN_STEPS.values())
    assert all(break_even_steps(batch) == steps for batch, steps in BREAK_EVEN_STEPS.items())

"""`precision: auto` picks bf16 only where the hardware runs it natively, and says so; explicit bf16 on a CPU
without it warns. Native support is monkeypatched, so both branches are tested on any machine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from accelerate import Accelerator
from conftest import auto_precision
from typer.testing import CliRunner

from csekit.cli import app
from csekit.core.errors import CsekitError
from csekit.core.precision import NATIVE_BF16_VARIABLE, choose_precision, cpu_has_native_bf16, resolve_precision
from csekit.training.recipe import load_recipe
from csekit.training.trainer import train

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def set_native_bf16(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """Set whether this CPU 'has' native bf16 (through CSEKIT_NATIVE_BF16, which the CPU check obeys)."""

    def set_native(value: bool) -> None:
        monkeypatch.setenv(NATIVE_BF16_VARIABLE, "1" if value else "0")

    return set_native


def test_auto_picks_bf16_only_on_a_cpu_with_native_bf16(set_native_bf16) -> None:  # type: ignore[no-untyped-def]
    set_native_bf16(True)
    assert resolve_precision("auto", "cpu")[0] == "bf16"
    set_native_bf16(False)
    chosen, reason = resolve_precision("auto", "cpu")
    assert chosen == "fp32" and "no native bf16" in reason
    assert resolve_precision("bf16", "cpu")[0] == "bf16"  # an explicit choice is kept
    assert resolve_precision("fp32", "cpu")[0] == "fp32"


def test_auto_on_cuda_follows_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    assert resolve_precision("auto", "cuda")[0] == "bf16"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)
    assert resolve_precision("auto", "cuda")[0] == "fp32"  # emulated bf16 (pre-Ampere) is not native


def test_auto_says_what_it_chose_and_explicit_bf16_warns_on_a_slow_cpu(set_native_bf16) -> None:  # type: ignore[no-untyped-def]
    set_native_bf16(False)
    lines: list[str] = []
    assert choose_precision("auto", "cpu", "train.precision", say=lines.append) == "fp32"
    assert choose_precision("bf16", "cpu", "--precision", say=lines.append) == "bf16"
    assert choose_precision("fp32", "cpu", "--precision", say=lines.append) == "fp32"
    assert len(lines) == 2
    assert lines[0].startswith("csekit: train.precision auto -> fp32") and "no native bf16" in lines[0]
    assert "warning: --precision bf16" in lines[1] and "slower" in lines[1]
    set_native_bf16(True)
    lines.clear()
    choose_precision("bf16", "cpu", say=lines.append)
    assert lines == []  # native bf16 asked for explicitly: nothing to say


def test_unknown_precision_is_a_clear_error() -> None:
    with pytest.raises(CsekitError, match='unknown precision "fp8"'):
        resolve_precision("fp8", "cpu")
    with pytest.raises(CsekitError, match=r"train\.precision must be auto, fp32, bf16 or fp16"):
        load_recipe(None, ["train.precision=fp8"])


FP32_RECIPES = {
    f"dclr-{name}.yaml"
    for name in (
        "bert-base",
        "roberta-base",
        "bert-base-authors-code",
        "ablation-no-noise",
        "ablation-no-weighting",
        "ablation-random-noise",
        "ablation-self-weighting",
    )
} | {"sncse-bert-base.yaml", "sncse-roberta-base.yaml", "mixcse-bert-base.yaml"}
"""DCLR's, SNCSE's and MixCSE's reproductions: the authors' numbers come from fp32 runs (DCLR's run.sh, --fp16
commented out; SNCSE's train_SNCSE.sh and MixCSE's run_unsup_example.sh, no --fp16)."""


def test_the_dclr_reproductions_train_in_fp32_the_others_use_auto_the_default() -> None:
    """The other methods' authors trained in mixed precision (--fp16, apex O1): auto is its counterpart."""
    assert load_recipe(None).train.precision == "auto"
    for path in sorted((REPO / "recipes").glob("*.yaml")):
        expected = "fp32" if path.name in FP32_RECIPES else "auto"
        assert load_recipe(path).train.precision == expected, path.name
        assert "precision:" in path.read_text(encoding="utf-8"), f"{path.name} says its precision"


def test_the_variable_overrides_the_cpu_check_and_a_wrong_value_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(NATIVE_BF16_VARIABLE, "1")
    assert cpu_has_native_bf16() and resolve_precision("auto", "cpu")[0] == "bf16"
    monkeypatch.setenv(NATIVE_BF16_VARIABLE, "0")
    assert not cpu_has_native_bf16() and resolve_precision("auto", "cpu")[0] == "fp32"
    monkeypatch.setenv(NATIVE_BF16_VARIABLE, "yes")
    with pytest.raises(CsekitError, match=f"{NATIVE_BF16_VARIABLE} must be 1 .* or 0"):
        cpu_has_native_bf16()


def _tiny_quickstart(tmp_path: Path, tiny_model_dir: Path, *extra: str):  # type: ignore[no-untyped-def]
    """The shipped quickstart recipe (precision auto) on the tiny model: 2 steps, no dev task."""
    from conftest import make_corpus

    tmp_path.mkdir(parents=True, exist_ok=True)
    corpus = make_corpus(tmp_path / "corpus.txt")
    overrides = [
        f"model.backbone={tiny_model_dir}",
        f"data.corpus={corpus}",
        "train.max_steps=2",
        "train.batch_size=8",
        "train.dev_task=none",
        *extra,
    ]
    return load_recipe(REPO / "recipes" / "quickstart.yaml", overrides)


def _trained_precision(run: Path) -> str:
    return json.loads((run / "metrics.jsonl").read_text().splitlines()[0])["precision"]


def test_quickstart_trains_in_what_auto_chooses_for_the_cpu(
    tmp_path: Path, tiny_model_dir: Path, native_bf16: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    """The shipped quickstart recipe trains in bf16 on a CPU with native bf16, in fp32 on an AVX2-only one."""
    train(_tiny_quickstart(tmp_path, tiny_model_dir), tmp_path / "run", show_progress=False)
    assert _trained_precision(tmp_path / "run") == auto_precision(native_bf16)
    assert f"train.precision auto -> {auto_precision(native_bf16)}" in capsys.readouterr().err


def test_train_twice_in_one_process_with_different_precisions(
    tmp_path: Path, tiny_model_dir: Path, native_bf16: bool
) -> None:
    """A notebook or a sweep trains again with another precision: accelerate's process-wide state is not
    carried from one training to the next (it raised "AcceleratorState has already been initialized"),
    and a caller's own accelerate state is as it was afterwards."""
    from accelerate.state import AcceleratorState

    Accelerator(cpu=True, mixed_precision="no")  # the caller's own, before csekit trains
    for name, extra in (("auto", ()), ("fp32", ("train.precision=fp32",)), ("bf16", ("train.precision=bf16",))):
        train(_tiny_quickstart(tmp_path / name, tiny_model_dir, *extra), tmp_path / name / "run", show_progress=False)
    assert _trained_precision(tmp_path / "auto" / "run") == auto_precision(native_bf16)
    assert _trained_precision(tmp_path / "fp32" / "run") == "fp32"
    assert _trained_precision(tmp_path / "bf16" / "run") == "bf16"
    assert AcceleratorState().mixed_precision == "no"


def test_encoding_commands_compute_in_fp32_unless_asked(
    tmp_path: Path, tiny_model_dir: Path, native_bf16: bool
) -> None:
    """evaluate, encode, probe and diagnose default to fp32 on any CPU (their numbers agree with
    sentence-transformers' and SentEval's); `--precision auto` takes bf16 where it is native."""
    from conftest import make_data_dir

    data = make_data_dir(tmp_path / "data")
    args = ["evaluate", str(tiny_model_dir), "--tasks", "stsb-dev", "--data-dir", str(data), "-o"]
    default = CliRunner().invoke(app, [*args, str(tmp_path / "default.json")])
    assert default.exit_code == 0, default.output
    assert json.loads((tmp_path / "default.json").read_text())["precision"] == "fp32"
    auto = CliRunner().invoke(app, [*args, str(tmp_path / "auto.json"), "--precision", "auto"])
    assert auto.exit_code == 0, auto.output
    assert json.loads((tmp_path / "auto.json").read_text())["precision"] == auto_precision(native_bf16)
    assert f"{auto_precision(native_bf16)} (auto: this CPU" in auto.output


def test_encode_warns_before_an_emulated_bf16_run(tmp_path: Path, tiny_model_dir: Path, set_native_bf16) -> None:  # type: ignore[no-untyped-def]
    set_native_bf16(False)
    (tmp_path / "in.txt").write_text("a man plays\n", encoding="utf-8")
    args = ["encode", str(tiny_model_dir), "-i", str(tmp_path / "in.txt"), "-o", str(tmp_path / "out.npy")]
    result = CliRunner().invoke(app, [*args, "--precision", "bf16"])
    assert result.exit_code == 0, result.output
    assert "warning: --precision bf16 on a CPU without native bf16" in result.output
    assert "(bf16)" in result.output
    quiet = CliRunner().invoke(app, [*args, "--precision", "fp32"])
    assert "warning" not in quiet.output and "(fp32)" in quiet.output


def test_fp16_on_a_cpu_is_listed_in_help_and_warned_about(tmp_path: Path, tiny_model_dir: Path) -> None:
    assert "fp16" in CliRunner().invoke(app, ["encode", "--help"]).output
    (tmp_path / "in.txt").write_text("a man plays\n", encoding="utf-8")
    args = ["encode", str(tiny_model_dir), "-i", str(tmp_path / "in.txt"), "-o", str(tmp_path / "out.npy")]
    result = CliRunner().invoke(app, [*args, "--precision", "fp16"])
    assert result.exit_code == 0, result.output
    assert "warning: --precision fp16 is meant for GPUs" in result.output

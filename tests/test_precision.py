"""`precision: auto` picks bf16 only where the hardware runs it natively, and says so; explicit bf16 on a CPU
without it warns. Native support is monkeypatched, so both branches are tested on any machine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from csekit.cli import app
from csekit.core import precision as precision_module
from csekit.core.errors import CsekitError
from csekit.core.precision import choose_precision, resolve_precision
from csekit.training.recipe import load_recipe
from csekit.training.trainer import train

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def native_bf16(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """Set whether this CPU 'has' native bf16."""

    def set_native(value: bool) -> None:
        monkeypatch.setattr(precision_module, "cpu_has_native_bf16", lambda: value)

    return set_native


def test_auto_picks_bf16_only_on_a_cpu_with_native_bf16(native_bf16) -> None:  # type: ignore[no-untyped-def]
    native_bf16(True)
    assert resolve_precision("auto", "cpu")[0] == "bf16"
    native_bf16(False)
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


def test_auto_says_what_it_chose_and_explicit_bf16_warns_on_a_slow_cpu(native_bf16) -> None:  # type: ignore[no-untyped-def]
    native_bf16(False)
    lines: list[str] = []
    assert choose_precision("auto", "cpu", "train.precision", say=lines.append) == "fp32"
    assert choose_precision("bf16", "cpu", "--precision", say=lines.append) == "bf16"
    assert choose_precision("fp32", "cpu", "--precision", say=lines.append) == "fp32"
    assert len(lines) == 2
    assert lines[0].startswith("csekit: train.precision auto -> fp32") and "no native bf16" in lines[0]
    assert "warning: --precision bf16" in lines[1] and "slower" in lines[1]
    native_bf16(True)
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
}
"""DCLR's reproductions: the authors' numbers come from fp32 runs (run.sh, --fp16 commented out)."""


def test_the_dclr_reproductions_train_in_fp32_the_others_use_auto_the_default() -> None:
    """The other methods' authors trained in mixed precision (--fp16, apex O1): auto is its counterpart."""
    assert load_recipe(None).train.precision == "auto"
    for path in sorted((REPO / "recipes").glob("*.yaml")):
        expected = "fp32" if path.name in FP32_RECIPES else "auto"
        assert load_recipe(path).train.precision == expected, path.name
        assert "precision:" in path.read_text(encoding="utf-8"), f"{path.name} says its precision"


def test_quickstart_trains_in_fp32_on_a_cpu_without_native_bf16(
    tmp_path: Path, tiny_model_dir: Path, native_bf16, capsys: pytest.CaptureFixture[str]
) -> None:  # type: ignore[no-untyped-def]
    """The shipped quickstart recipe, on an AVX2-only CPU, runs exactly as with train.precision=fp32."""
    from conftest import make_corpus

    native_bf16(False)
    corpus = make_corpus(tmp_path / "corpus.txt")
    overrides = [
        f"model.backbone={tiny_model_dir}",
        f"data.corpus={corpus}",
        "train.max_steps=2",
        "train.batch_size=8",
        "train.dev_task=none",
    ]
    recipe = load_recipe(REPO / "recipes" / "quickstart.yaml", overrides)
    train(recipe, tmp_path / "run", show_progress=False)
    start = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert start["precision"] == "fp32"
    assert "train.precision auto -> fp32" in capsys.readouterr().err


def test_evaluate_reports_the_precision_it_used(tmp_path: Path, tiny_model_dir: Path, native_bf16) -> None:  # type: ignore[no-untyped-def]
    from conftest import make_data_dir

    native_bf16(False)
    data = make_data_dir(tmp_path / "data")
    out = tmp_path / "dev.json"
    result = CliRunner().invoke(
        app, ["evaluate", str(tiny_model_dir), "--tasks", "stsb-dev", "--data-dir", str(data), "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["precision"] == "fp32"
    assert "fp32 (auto: this CPU has no native bf16" in result.output


def test_encode_warns_before_an_emulated_bf16_run(tmp_path: Path, tiny_model_dir: Path, native_bf16) -> None:  # type: ignore[no-untyped-def]
    native_bf16(False)
    (tmp_path / "in.txt").write_text("a man plays\n", encoding="utf-8")
    args = ["encode", str(tiny_model_dir), "-i", str(tmp_path / "in.txt"), "-o", str(tmp_path / "out.npy")]
    result = CliRunner().invoke(app, [*args, "--precision", "bf16"])
    assert result.exit_code == 0, result.output
    assert "warning: --precision bf16 on a CPU without native bf16" in result.output
    assert "(bf16)" in result.output
    quiet = CliRunner().invoke(app, [*args, "--precision", "fp32"])
    assert "warning" not in quiet.output and "(fp32)" in quiet.output

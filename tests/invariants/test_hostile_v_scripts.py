"""Hostile files V, the benchmark scripts: `suite_diagnose.py`'s diagnose reports, the stand-in's saved training state
and record, `gpu_suite.py`'s suite and output. Each test failed before its fix (a traceback, a hang, a value used
unchecked or a file written through a link)."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from conftest import hostile_examples
from hypothesis import given
from test_hostile_v import JSON_VALUES, _assert_one_line, _bench_folder

from csekit.bench import load_suite
from csekit.core.errors import CsekitError

# --- benchmarks/suite_diagnose.py reads each diagnose report bounded and checked --------------------------------------

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
METRICS = {"false_negative_rate": 0.4, "uniformity": -2.0, "alignment": 0.3, "anisotropy": 0.5}


def _diagnose_suite(root: Path) -> tuple[Any, Path]:
    """The suite of `_bench_folder` and a reports folder with a full report for every run but base-seed1's."""
    suite, _ = _bench_folder(root)
    reports = root / "reports"
    reports.mkdir()
    for name in ("base-seed2", "meth-seed1", "meth-seed2"):
        report = {"models": {f"runs/{name}/best": METRICS}}
        (reports / f"{name}.json").write_text(json.dumps(report), encoding="utf-8")
    return load_suite(suite), reports


@pytest.fixture
def suite_diagnose(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import suite_diagnose

    return suite_diagnose


@pytest.mark.parametrize(
    "content",
    ["not json", '{"x": 1}', '{"models": []}', '{"models": {"a": {}, "b": {}}}', '{"models": {"m": [1]}}',
     '{"models": {"m": {"uniformity": "low"}}}', '{"models": {"m": {"uniformity": 1e999}}}', "fifo", "dev-zero"],
    ids=["not-json", "no-models", "models-a-list", "two-models", "metrics-a-list", "metric-text", "metric-inf",
         "fifo", "dev-zero"],
)  # fmt: skip
def test_a_damaged_diagnose_report_is_one_line_naming_it(tmp_path: Path, suite_diagnose: Any, content: str) -> None:
    """suite_diagnose read each report with an unbounded `json.loads(read_text())` and indexed it blindly: a
    JSONDecodeError, KeyError, AttributeError or TypeError traceback, and a FIFO hung it."""
    import os

    suite, reports = _diagnose_suite(tmp_path)
    path = reports / "base-seed1.json"
    if content == "fifo":
        os.mkfifo(path)
    elif content == "dev-zero":
        path.symlink_to("/dev/zero")
    else:
        path.write_text(content, encoding="utf-8")
    with pytest.raises(CsekitError) as caught:
        suite_diagnose.table(suite, reports)
    _assert_one_line(caught.value, "base-seed1.json")


def test_a_metric_diagnose_wrote_as_null_is_left_out_not_a_traceback(tmp_path: Path, suite_diagnose: Any) -> None:
    """`csekit diagnose` writes a metric that is not a number as null (a Spearman correlation of constant
    embeddings): `scale * None` was a TypeError traceback. It is left out of the mean and of the pairs."""
    suite, reports = _diagnose_suite(tmp_path)
    report = {"models": {"runs/base-seed1/best": {**METRICS, "uniformity": None}}}
    (reports / "base-seed1.json").write_text(json.dumps(report), encoding="utf-8")
    markdown = suite_diagnose.table(suite, reports)
    uniformity = markdown.split("### uniformity")[1].split("###")[0]
    assert "| base | 1 | -2.0000 ± 0.0000 | - | - |" in uniformity
    assert "| meth | 2 | -2.0000 ± 0.0000 | +0.000 (p = -, 1 seeds) | - |" in uniformity


@hostile_examples(25)
@given(value=JSON_VALUES)
def test_any_metric_value_in_a_diagnose_report_is_tabulated_or_one_line(value: Any) -> None:
    import sys

    sys.path.insert(0, str(BENCHMARKS))
    try:
        import suite_diagnose
    finally:
        sys.path.remove(str(BENCHMARKS))
    root = Path(tempfile.mkdtemp())
    try:
        suite, reports = _diagnose_suite(root)
        report = {"models": {"m": {**METRICS, "alignment": value}}}
        (reports / "base-seed1.json").write_text(json.dumps(report), encoding="utf-8")
        number = type(value) in (int, float) and abs(value) < float("inf")
        try:
            suite_diagnose.table(suite, reports)
        except CsekitError as error:
            assert not (number or value is None)
            _assert_one_line(error, "base-seed1.json", "alignment")
        else:
            assert number or value is None
    finally:
        shutil.rmtree(root)


# --- the stand-in's saved training state: its optimizer state is checked as a checkpoint's is --------------------


def _tamper_optimizer(state: dict[str, Any], case: str) -> None:
    import torch

    optimizer = state["optimizer"]
    if case == "moment-shape":
        optimizer["state"][0]["exp_avg"] = torch.zeros(3)
    elif case == "lr-text":
        optimizer["param_groups"][0]["lr"] = "fast"
    elif case == "beta-one":
        optimizer["param_groups"][0]["betas"] = (1.0, 0.999)
    elif case == "negative-second-moment":
        optimizer["state"][0]["exp_avg_sq"] = -torch.ones_like(optimizer["state"][0]["exp_avg_sq"])


@pytest.mark.parametrize("case", ["moment-shape", "lr-text", "beta-one", "negative-second-moment"])
def test_a_crafted_optimizer_state_in_the_standins_training_state_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    """minilm_mlm_standin's `<output>.training-state.pt` was handed to `optimizer.load_state_dict` unchecked: a moment
    of the wrong shape or an lr of text was a RuntimeError or TypeError traceback at the first step, a beta of 1 or a
    negative second moment trained on to NaN. It goes through training/state_checks.py, as a checkpoint does."""
    import torch
    from conftest import make_corpus, make_tiny_mlm

    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import minilm_mlm_generator
    import minilm_mlm_standin

    corpus = make_corpus(tmp_path / "corpus.txt", lines=200)
    backbone = make_tiny_mlm(tmp_path / "backbone", initializer_range=0.3, layers=2)
    settings = ["--backbone", str(backbone), "--corpus", str(corpus), "--held-out", "32", "--reinit-top-layers", "1"]
    settings += ["--steps", "4", "--save-every", "2", "--output", str(tmp_path / "standin")]
    real, calls = minilm_mlm_generator.masked_logits, []

    def stop_at_step_three(model: Any, batch: Any) -> Any:
        calls.append(1)  # call 1 scores the held-out batch, calls 2.. are steps 1..
        if len(calls) == 4:
            raise KeyboardInterrupt
        return real(model, batch)

    monkeypatch.setattr(minilm_mlm_generator, "masked_logits", stop_at_step_three)
    with pytest.raises(SystemExit):
        minilm_mlm_standin.main(settings)
    monkeypatch.setattr(minilm_mlm_generator, "masked_logits", real)
    path = minilm_mlm_standin.state_path(tmp_path / "standin")
    state = torch.load(path, weights_only=True)
    _tamper_optimizer(state, case)
    torch.save(state, path)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        minilm_mlm_standin.main(settings)
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert exit_info.value.code == 2 and last.startswith("minilm_mlm_standin: "), last
    assert str(path) in last and "does not fit this model" in last
    assert not (tmp_path / "standin").exists()


# --- benchmarks/gpu_suite.py reads its suite as bench does and writes --out atomically ----------------------------


@pytest.mark.parametrize("case", ["alias-bomb", "key-twice", "out-a-link"])
def test_the_gpu_suite_script_reads_bounded_and_never_writes_through_a_link(tmp_path: Path, case: str) -> None:
    """gpu_suite.py read the suite and its recipes with a plain yaml.safe_load (an alias bomb and a key given twice
    passed unchecked, the second seeds silently replacing the first) and wrote --out with write_text (a link there
    was followed, its target overwritten)."""
    import subprocess
    import sys

    suite, _ = _bench_folder(tmp_path)
    suite.write_text("name: s\n" + suite.read_text(encoding="utf-8"), encoding="utf-8")
    target, out = tmp_path / "target.txt", tmp_path / "out.yaml"
    target.write_text("kept\n", encoding="utf-8")
    if case == "alias-bomb":
        bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
            f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
            f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n"
            for i in range(8)
        )
        (tmp_path / "a.yaml").write_text("name: a\n" + bomb, encoding="utf-8")
    elif case == "key-twice":
        suite.write_text(suite.read_text(encoding="utf-8") + "seeds: [3]\n", encoding="utf-8")
    else:
        out.symlink_to(target)
    command = [sys.executable, str(BENCHMARKS / "gpu_suite.py"), "subset", "--suite", str(suite), "--out", str(out)]
    command += ["--keep", "base", "--model", str(tmp_path / "model")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and len(lines) == 1 and lines[0].startswith("gpu_suite: "), done.stderr[-2000:]
    assert target.read_text(encoding="utf-8") == "kept\n"


def test_the_standins_record_is_read_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """check_output read an existing folder's standin.json whole (`read_text`): a sparse file of 256 MiB took
    256 MiB and more to refuse."""
    import tracemalloc

    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import minilm_mlm_standin

    (tmp_path / "out").mkdir()
    with (tmp_path / "out" / "standin.json").open("wb") as handle:
        handle.truncate(2**28)
    tracemalloc.start()
    try:
        with pytest.raises(CsekitError, match="holds no stand-in of these settings"):
            minilm_mlm_standin.check_output(tmp_path / "out", {"steps": 1})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2**24

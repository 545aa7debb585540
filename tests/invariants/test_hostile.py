"""Hostile files, signals and races (issue #28): a crafted or damaged file is one line naming it, never a crash,
never code run, never silent loss of work.

Every value csekit reads from a run folder, a model folder, a recipe or a suite may have been written by
someone else; each case here failed (a segmentation fault, a traceback, a hang, a prompt to run code, a
silently overwritten run) before its fix.
"""

from __future__ import annotations

import ast
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import (
    REPO,
    TinyTrainer,
    assert_one_line_error,
    make_corpus,
    make_tiny_encoder,
    run_cli,
    run_main,
    train_finished_run,
    write_recipe,
)
from test_untrusted import resume  # the one way these tests resume a run (`csekit train --resume`)

from csekit.core.errors import CsekitError
from csekit.encoding.encoder import SentenceEncoder
from csekit.training.recipe import load_recipe
from csekit.training.trainer import train

CaptureErr = pytest.CaptureFixture[str]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-step run with a checkpoint at step 2 (copy it before changing it)."""
    return train_finished_run(tmp_path_factory.mktemp("finished"))


@pytest.fixture
def run(finished_run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(finished_run / "run", tmp_path / "run"))


def rewrite(path: Path, change: Any) -> None:
    """Load a checkpoint file, let `change` edit it in place, save it back (only tensors and plain values)."""
    state = torch.load(path, weights_only=True)
    change(state)
    torch.save(state, path)


# --- crafted checkpoint values are checked before torch sees them ------------------------------------


def test_an_optimizer_state_of_the_wrong_shape_is_refused_not_a_segfault(run: Path, tmp_path: Path) -> None:
    """A moment of 368 elements for a larger parameter made the fused AdamW read past it: exit 139, no message."""

    def shrink(state: dict[str, Any]) -> None:
        entry = state["state"][0]
        entry["exp_avg"] = entry["exp_avg"].flatten()[:-16].clone()

    rewrite(run / "checkpoint" / "optimizer.pt", shrink)
    before = (run / "metrics.jsonl").read_text()
    result = run_cli("train", "--output", str(run), "--resume", "--no-progress", cwd=tmp_path)
    assert_one_line_error(result.returncode, result.stderr, str(run / "checkpoint" / "optimizer.pt"), "exp_avg")
    assert (run / "metrics.jsonl").read_text() == before


@pytest.mark.parametrize("change", ["another-shape", "integers", "dtype-a-list"])
def test_checkpoint_weights_of_another_shape_or_stored_as_integers_are_named_before_loading(
    run: Path, tmp_path: Path, change: str
) -> None:
    """A weight of another shape said only "Error(s) in loading state_dict" (no weight, no shapes); one stored as
    I32 loaded as its integer part and the run went on from it."""
    from safetensors.torch import load_file, save_file

    path = run / "checkpoint" / "model.safetensors"
    weights = load_file(path)
    name = next(key for key in sorted(weights) if key.endswith("attention.self.query.weight"))
    weights[name] = torch.zeros(5, 5) if change == "another-shape" else weights[name].to(torch.int32)
    path.unlink()
    save_file(weights, path)
    if change == "dtype-a-list":  # a crafted header: the dtype any JSON value (the data offsets stay valid)
        data = path.read_bytes()
        length = int.from_bytes(data[:8], "little")
        header = json.loads(data[8 : 8 + length])
        header[name]["dtype"] = [1]
        text = json.dumps(header).encode()
        path.write_bytes(len(text).to_bytes(8, "little") + text + data[8 + length :])
    before = (run / "metrics.jsonl").read_text()
    result = run_cli("train", "--output", str(run), "--resume", "--no-progress", cwd=tmp_path)
    needle = {"another-shape": "is [5, 5], the model's is", "integers": "is stored as I32"}.get(change, "stored as [1]")
    assert_one_line_error(result.returncode, result.stderr, str(path), name, needle)
    assert (run / "metrics.jsonl").read_text() == before


def _set_group(key: str, value: Any) -> Any:
    return lambda state: [group.__setitem__(key, value) for group in state["param_groups"]]


def _set_moment(key: str, value: Any) -> Any:
    return lambda state: [entry.__setitem__(key, value(entry[key])) for entry in state["state"].values()]


CRAFTED = {
    "lr-text": ("optimizer.pt", _set_group("lr", "fast"), "param_groups[0].lr"),
    "lr-nan": ("optimizer.pt", _set_group("lr", float("nan")), "param_groups[0].lr"),
    "betas-one": ("optimizer.pt", _set_group("betas", (1.0, 0.999)), "betas"),
    "amsgrad-on": ("optimizer.pt", _set_group("amsgrad", True), "amsgrad"),
    "moment-int": ("optimizer.pt", _set_moment("exp_avg", lambda t: t.long()), "exp_avg"),
    "moment-negative": ("optimizer.pt", _set_moment("exp_avg_sq", lambda t: -t - 1), "negative"),
    "moment-inf": ("optimizer.pt", _set_moment("exp_avg", lambda t: t / 0), "not finite"),
    "step-text": ("optimizer.pt", _set_moment("step", lambda t: "one"), "step"),
    "no-parameter": ("optimizer.pt", lambda s: s["state"].__setitem__(999, s["state"][0]), "999"),
    "last-epoch-text": ("scheduler.pt", lambda s: s.__setitem__("last_epoch", "y"), "last_epoch"),
    "last-epoch-huge": ("scheduler.pt", lambda s: s.__setitem__("last_epoch", 10**30), "last_epoch"),
    "base-lrs-short": ("scheduler.pt", lambda s: s.__setitem__("base_lrs", []), "base_lrs"),
    "lambda-attribute": ("scheduler.pt", lambda s: s["lr_lambdas"][0].__setitem__("func", "x"), "lr_lambdas"),
}


@pytest.mark.parametrize("case", CRAFTED)
def test_a_crafted_checkpoint_value_is_one_line_naming_the_file_and_the_value(
    case: str, run: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr
) -> None:
    """Text for a learning rate or an epoch was a TypeError traceback; NaN, betas of 1, int moments trained on."""
    name, change, needle = CRAFTED[case]
    rewrite(run / "checkpoint" / name, change)
    before = (run / "metrics.jsonl").read_text()
    code, err = resume(monkeypatch, capsys, run)
    assert_one_line_error(code, err, str(run / "checkpoint" / name), "does not fit this run", needle)
    assert (run / "metrics.jsonl").read_text() == before


def test_an_unchanged_checkpoint_still_resumes(run: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr) -> None:
    """Guard: the checks accept what csekit itself wrote."""
    code, err = resume(monkeypatch, capsys, run, "--set", "train.max_steps=3", "--allow-changes")
    assert code == 0, err


# --- YAML: bounded, no duplicate keys, not empty, numbers read as text explained --------------------

ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{name}: &{name} [{', '.join([f'*{previous}'] * 10)}]\n"
    for previous, name in zip("abcdefgh", "bcdefghi", strict=True)
)
"""Nine levels of ten aliases: a few hundred bytes that expand to 10^9 values (it hung csekit)."""


@pytest.mark.parametrize(("command", "file"), [("train", "bomb.yaml"), ("bench", "suite.yaml")])
def test_an_alias_bomb_in_a_recipe_or_a_bench_suite_is_one_line(
    command: str, file: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr
) -> None:
    bomb = tmp_path / file
    bomb.write_text(ALIAS_BOMB, encoding="utf-8")
    code, err = run_main(monkeypatch, capsys, command, str(bomb), "--output", str(tmp_path / "out"))
    assert_one_line_error(code, err, f"{bomb}:", "expands to more than")
    assert not (tmp_path / "out").exists()


def test_an_alias_bomb_in_a_saved_recipe_is_one_line(
    run: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr
) -> None:
    (run / "recipe.yaml").write_text(ALIAS_BOMB, encoding="utf-8")
    code, err = resume(monkeypatch, capsys, run)
    assert_one_line_error(code, err, str(run / "recipe.yaml"), "expands to more than")


def test_a_recursive_alias_is_one_line(tmp_path: Path) -> None:
    recipe = tmp_path / "loop.yaml"
    recipe.write_text("objectives: &loop\n  - *loop\n", encoding="utf-8")
    with pytest.raises(CsekitError, match=r"loop\.yaml:\d+: the recipe refers to itself"):
        load_recipe(recipe)


def test_a_key_given_twice_in_a_recipe_names_both_lines(tmp_path: Path) -> None:
    """YAML kept the last value silently (train.lr 2e-5 trained with 3e-5)."""
    recipe = tmp_path / "twice.yaml"
    recipe.write_text("train:\n  lr: 2.0e-5\n  batch_size: 32\n  lr: 3.0e-5\n", encoding="utf-8")
    with pytest.raises(CsekitError, match=r'twice\.yaml:4: key "lr" is given twice in the recipe \(lines 2 and 4\)'):
        load_recipe(recipe)


def test_an_empty_recipe_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr) -> None:
    """It ran bert-base-uncased on the default corpus with every default."""
    recipe = tmp_path / "empty.yaml"
    recipe.write_text("# nothing yet\n", encoding="utf-8")
    code, err = run_main(monkeypatch, capsys, "train", str(recipe), "--output", str(tmp_path / "run"))
    assert_one_line_error(code, err, str(recipe), "is empty")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (
            "train:\n  batch_size: 1e2\n",
            "YAML read 1e2 as text, not a number (a YAML number with an exponent needs a dot: 1.0e2)",
        ),
        ("objectives:\n  - {name: infonce, temperature: 5e-2}\n", "YAML read 5e-2 as text"),
    ],
)
def test_a_number_yaml_reads_as_text_is_explained(tmp_path: Path, text: str, needle: str) -> None:
    """`1e-30` without a dot is a string in YAML 1.1; the message quoted it as if it were a number."""
    from csekit.parts.objectives import OBJECTIVES
    from csekit.training.part_building import build_part

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(text, encoding="utf-8")
    with pytest.raises(CsekitError) as error:
        loaded = load_recipe(recipe)
        build_part(OBJECTIVES, loaded.objectives[0], "objectives[0]")
    assert needle in str(error.value)


# --- a model folder's own Python code is never run; its metadata is checked --------------------------


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("model")
    make_tiny_encoder(root / "tokenizer").save(root / "model")
    return root / "model"


@pytest.fixture
def model(tiny_model: Path, tmp_path: Path) -> Path:
    """A private copy of a saved tiny model (csekit.json, modules.json, 1_Pooling/)."""
    return Path(shutil.copytree(tiny_model, tmp_path / "model"))


def ask_for_own_code(model: Path, marker: Path, file: str = "config.json") -> None:
    """Make `model` name its own code (`auto_map`, an unknown model type or tokenizer class) that creates `marker`."""
    (model / "evil.py").write_text(f"open({str(marker)!r}, 'w').close()\n", encoding="utf-8")
    values = json.loads((model / file).read_text())
    if file == "config.json":
        values.update(model_type="evil-bert", auto_map={"AutoConfig": "evil.Config", "AutoModel": "evil.Model"})
    else:
        values.update(tokenizer_class="EvilTokenizer", auto_map={"AutoTokenizer": ["evil.EvilTokenizer", None]})
    (model / file).write_text(json.dumps(values), encoding="utf-8")


@pytest.mark.parametrize("file", ["config.json", "tokenizer_config.json"])
def test_a_model_folder_that_asks_to_run_its_code_is_refused_in_encode(model: Path, tmp_path: Path, file: str) -> None:
    """transformers asked "Do you wish to run the custom code? [y/N]" and ran evil.py on y."""
    marker = tmp_path / "code-ran"
    ask_for_own_code(model, marker, file)
    (tmp_path / "in.txt").write_text("a dog runs\n", encoding="utf-8")
    command = [sys.executable, "-m", "csekit.cli", "encode", str(model), "-i", "in.txt", "-o", "out.npy"]
    result = subprocess.run(command, input="y\n" * 5, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert_one_line_error(result.returncode, result.stderr, str(model), "asks to run its own Python code")
    assert not marker.exists() and not (tmp_path / "out.npy").exists()


def test_a_backbone_that_asks_to_run_its_code_is_refused_in_train(
    model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr
) -> None:
    marker = tmp_path / "code-ran"
    ask_for_own_code(model, marker)
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))
    recipe = write_recipe(tmp_path, model, make_corpus(tmp_path / "corpus.txt", lines=32))
    code, err = run_main(monkeypatch, capsys, "train", str(recipe), "--output", str(tmp_path / "run"))
    assert_one_line_error(code, err, str(model), "asks to run its own Python code", "csekit never runs")
    assert not marker.exists() and not (tmp_path / "run").exists()


def test_every_transformers_load_passes_trust_remote_code_false() -> None:
    """Rule: csekit's one from_pretrained (encoding/model_folder.py; tests/test_architecture.py finds any other)
    says trust_remote_code=False (None would prompt, and run on y)."""
    calls = 0
    for path in (REPO / "src" / "csekit").rglob("*.py"):
        for call in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(call, ast.Call) and getattr(call.func, "attr", None) == "from_pretrained":
                calls += 1
                keywords = {k.arg: k.value for k in call.keywords}
                assert "trust_remote_code" in keywords, f"{path}:{call.lineno}"
                assert isinstance(keywords["trust_remote_code"], ast.Constant), f"{path}:{call.lineno}"
                assert keywords["trust_remote_code"].value is False, f"{path}:{call.lineno}"
    assert calls >= 1


def _write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value), encoding="utf-8")


def _modules(model: Path, pooling: dict[str, Any]) -> None:
    (model / "csekit.json").unlink()
    _write_json(model / "modules.json", [{"path": "", "type": "sentence_transformers.models.Transformer"}, pooling])


DAMAGED_METADATA = {
    "pooling-without-path": (
        lambda m: _modules(m, {"type": "sentence_transformers.models.Pooling"}),
        "modules.json",
        'Pooling module has no "path"',
    ),
    "pooling-config-a-list": (
        lambda m: (
            _modules(m, {"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}),
            _write_json(m / "1_Pooling" / "config.json", ["cls"]),
        ),
        "1_Pooling/config.json",
        "expected a JSON object, found a list",
    ),
    "module-path-outside": (
        lambda m: _modules(m, {"path": "../../..", "type": "sentence_transformers.models.Pooling"}),
        "modules.json",
        "leads outside",
    ),
    "pooler-a-list": (lambda m: _write_json(m / "csekit.json", {"pooler": ["cls"]}), "csekit.json", '"pooler"'),
    "templates-a-number": (
        lambda m: _write_json(m / "csekit.json", {"pooler": "mask", "templates": 3}),
        "csekit.json",
        '"templates" must be a list of strings',
    ),
    "endless-device": (
        lambda m: ((m / "csekit.json").unlink(), (m / "csekit.json").symlink_to("/dev/zero")),
        "csekit.json",
        "not a regular file",
    ),
    "head-outside": (
        lambda m: _write_json(m / "csekit.json", {"pooler": "cls", "head": {"dim": 32, "path": "/etc"}}),
        "csekit.json",
        "leads outside",
    ),
    "head-huge": (
        lambda m: _write_json(m / "csekit.json", {"pooler": "cls", "head": {"dim": 10**12, "path": "2_Dense"}}),
        "csekit.json",
        "the model's width is 32",
    ),
}


@pytest.mark.parametrize("case", DAMAGED_METADATA)
def test_damaged_model_metadata_is_one_line_naming_the_file(
    case: str, model: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr
) -> None:
    """A KeyError, AttributeError or TypeError traceback, a hang reading /dev/zero, a 4 TB head allocation."""
    damage, file, needle = DAMAGED_METADATA[case]
    damage(model)
    with pytest.raises(CsekitError) as error:
        SentenceEncoder.load(model)
    message = str(error.value)
    assert "\n" not in message and str(model / file) in message and needle in message, message


# --- no silent loss of work --------------------------------------------------------------------------


def test_a_run_that_finished_while_this_one_started_is_not_overwritten(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two `csekit train` into one new folder a moment apart: both checked the empty folder before either held
    the lock, and the second overwrote the first's finished run. The folder is checked again under the lock."""
    from csekit.training import trainer

    corpus = make_corpus(tmp_path / "corpus.txt", lines=64)
    recipe = load_recipe(write_recipe(tmp_path, tiny_model_dir, corpus, "  max_steps: 2\n"))
    output = tmp_path / "run"
    create_output = trainer.create_output
    raced: list[bool] = []

    def the_other_run_finishes_first(folder: Path, process: int) -> None:
        if not raced:  # between this run's checks and its lock, another run trains to its end in the folder
            raced.append(True)
            train(recipe, output, show_progress=False)
        create_output(folder, process)

    monkeypatch.setattr(trainer, "create_output", the_other_run_finishes_first)
    finished = (output / "checkpoint" / "model.safetensors", output / "metrics.jsonl")
    with pytest.raises(CsekitError, match="already holds a run"):
        train(recipe, output, show_progress=False)
    before = [path.read_bytes() for path in finished]
    assert raced and [path.read_bytes() for path in finished] == before
    assert not (output / ".lock").exists()


@pytest.mark.parametrize("damage", ["no-state", "empty", "a-file"])
def test_resume_refuses_an_incomplete_checkpoint(
    damage: str, run: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr
) -> None:
    """A checkpoint/ without trainer_state.json, or empty, restarted at step 0 and emptied metrics.jsonl."""
    checkpoint = run / "checkpoint"
    if damage == "no-state":
        (checkpoint / "trainer_state.json").unlink()
    else:
        shutil.rmtree(checkpoint)
        checkpoint.mkdir() if damage == "empty" else checkpoint.write_text("not a folder", encoding="utf-8")
    before = (run / "metrics.jsonl").read_text()
    code, err = resume(monkeypatch, capsys, run)
    needle = {"no-state": "has no trainer_state.json", "empty": "is empty", "a-file": "is not a folder"}[damage]
    assert_one_line_error(code, err, str(checkpoint), needle)
    assert (run / "metrics.jsonl").read_text() == before


def test_a_best_score_that_is_text_is_refused_on_resume(
    run: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr
) -> None:
    """It was found only at the first evaluation, as a TypeError traceback."""
    path = run / "checkpoint" / "trainer_state.json"
    path.write_text(path.read_text().replace('"best_score": null', '"best_score": "0.9"'), encoding="utf-8")
    assert '"0.9"' in path.read_text()
    code, err = resume(monkeypatch, capsys, run)
    assert_one_line_error(code, err, str(path), "best_score")


def test_a_full_disk_while_saving_is_one_line_and_keeps_the_checkpoint(
    run: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr
) -> None:
    import errno

    from csekit.training import checkpoint

    def disk_full(*args: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint, "save_shared_state", disk_full)
    before = (run / "checkpoint" / "model.safetensors").read_bytes()
    code, err = resume(monkeypatch, capsys, run, "--set", "train.max_steps=4", "--allow-changes")
    last = err.strip().splitlines()[-1]  # after the precision note: the error comes once the run has started
    assert code == 2 and last.startswith("csekit: error: cannot write checkpoint/"), err
    assert "No space left on device" in last and "--resume" in last and "Traceback" not in err
    assert (run / "checkpoint" / "model.safetensors").read_bytes() == before
    assert json.loads((run / "checkpoint" / "trainer_state.json").read_text())["step"] == 2


def test_weights_that_become_nan_stop_the_run_and_keep_the_last_good_checkpoint(
    tmp_path: Path, train_tiny: TinyTrainer, test_parts: None
) -> None:
    """train.lr=1e308 trained to exit status 0 with 101 of 103 tensors NaN; the loss did not show it."""
    from safetensors.torch import load_file

    parts = "objectives=[{name: infonce}, {name: nan_weights_after, after: 3}]"
    with pytest.raises(CsekitError, match=r"no longer finite after step 4.*last good checkpoint"):
        train_tiny(parts, steps=6, eval_every=2)
    assert json.loads((tmp_path / "run" / "checkpoint" / "trainer_state.json").read_text())["step"] == 2
    for folder in ("checkpoint", "best", "last"):
        weights = load_file(tmp_path / "run" / folder / "model.safetensors")
        assert all(bool(torch.isfinite(tensor).all()) for tensor in weights.values()), folder


def test_a_model_with_nan_weights_is_refused_by_encode_and_evaluate_and_never_saved(
    model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr
) -> None:
    """encode wrote NaN rows and evaluate bare NaN into its JSON (not valid JSON)."""
    from safetensors.torch import load_file, save_file

    weights = load_file(model / "model.safetensors")
    name = next(iter(weights))
    weights[name] = torch.full_like(weights[name], float("nan"))
    save_file(weights, model / "model.safetensors", metadata={"format": "pt"})
    (tmp_path / "in.txt").write_text("a dog runs\n", encoding="utf-8")
    code, err = run_main(monkeypatch, capsys, "encode", str(model), "-i", str(tmp_path / "in.txt"), "-o", "o.npy")
    assert_one_line_error(code, err, str(model), "NaN or infinity")
    code, err = run_main(
        monkeypatch, capsys, "evaluate", str(model), "--tasks", "align", "-o", str(tmp_path / "r.json")
    )
    assert_one_line_error(code, err, str(model), "NaN or infinity")
    assert not (tmp_path / "r.json").exists()
    encoder = make_tiny_encoder(tmp_path / "tokenizer")
    with torch.no_grad():
        next(encoder.parameters()).fill_(float("inf"))
    with pytest.raises(CsekitError, match="refusing to save"):
        encoder.save(tmp_path / "saved")
    assert not (tmp_path / "saved").exists()


EXACT_RESUME_RECIPES = {
    "consert": ("consert-views-minilm.yaml", 0),
    "consert-2-workers": ("consert-views-minilm.yaml", 2),
    "osscse": ("osscse-minilm.yaml", 0),
}


@pytest.mark.parametrize("case", EXACT_RESUME_RECIPES)
def test_views_with_their_own_randomness_resume_exactly(case: str, tmp_path: Path, tiny_model_dir: Path) -> None:
    """Ctrl-C during step 3, then --resume: the losses and weights of the uninterrupted run (ConSERT's views drew
    other shuffles and cutoffs after the resume, from the next step on, with 0 and 2 data workers)."""
    from resumed_runs import interrupted_and_resumed

    name, workers = EXACT_RESUME_RECIPES[case]
    recipe = load_recipe(REPO / "recipes" / name)
    corpus = tmp_path / "corpus.jsonl"
    lines = make_corpus(tmp_path / "plain.txt", lines=96).read_text(encoding="utf-8").splitlines()
    rows = [{"text": s, "paraphrase": " ".join(reversed(s.split())), "negation": f"not {s}"} for s in lines]
    corpus.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    objectives = list(recipe.objectives)
    interrupted_and_resumed(
        tmp_path, REPO / "recipes" / name, tiny_model_dir, corpus, objectives, f"run.num_workers={workers}"
    )


@pytest.mark.parametrize("command", ["evaluate", "freq", "probe", "diagnose", "encode"])
def test_an_output_that_is_a_folder_is_refused_before_the_work(
    command: str, tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr
) -> None:
    """`--output DIR` was found only when writing, after the whole evaluation or count."""
    folder = tmp_path / "results"
    folder.mkdir()
    corpus = make_corpus(tmp_path / "corpus.txt", lines=8)
    args = {
        "evaluate": ["evaluate", str(tiny_model_dir), "--tasks", "stsb-dev"],
        "freq": ["freq", "--corpus", str(corpus), "--tokenizer", str(tiny_model_dir)],
        "probe": ["probe", str(tiny_model_dir)],
        "diagnose": ["diagnose", str(tiny_model_dir)],
        "encode": ["encode", str(tiny_model_dir), "--input", str(corpus)],
    }[command]
    if command in ("evaluate", "probe", "diagnose"):
        args += ["--data-dir", str(tmp_path / "none")]
    code, err = run_main(monkeypatch, capsys, *args, "--output", str(folder))
    assert_one_line_error(code, err, f"--output {folder} is a folder")
    assert list(folder.iterdir()) == []


def test_json_reports_write_null_for_a_score_that_is_not_a_number(tmp_path: Path) -> None:
    """A Spearman correlation of constant embeddings is NaN: JSON readers refuse a bare NaN."""
    from csekit.core.json_text import json_text
    from csekit.training.run_folder import MetricsLog

    assert json.loads(json_text({"stsb-dev": float("nan"), "rows": [1.0, float("inf")]})) == {
        "stsb-dev": None,
        "rows": [1.0, None],
    }
    log = MetricsLog(tmp_path / "metrics.jsonl", True)
    log.write({"step": 2, "stsb-dev": float("nan")})
    text = (tmp_path / "metrics.jsonl").read_text(encoding="utf-8")
    assert "NaN" not in text and json.loads(text.splitlines()[-1])["stsb-dev"] is None

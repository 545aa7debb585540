"""Files from someone else: run folders, recipes and downloads are data, never code.

Every case goes through the CLI (exit status 2, one line naming the file or key, nothing created
or lost) or through the function the CLI calls.
"""

from __future__ import annotations

import fcntl
import io
import json
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import warnings
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import ClassVar

import pytest
import torch
from conftest import assert_one_line_error, make_corpus, make_tiny_encoder, read_metrics, run_main, tiny_recipe
from parts_for_tests import KillOnce, write_entry_points

import csekit
from csekit.core.errors import CsekitError
from csekit.data import data_dir as data_dir_module
from csekit.parts.heads import HEADS
from csekit.parts.objectives import OBJECTIVES, InfoNCE
from csekit.training.part_building import build_part
from csekit.training.recipe import load_recipe
from csekit.training.run_folder import recipe_changes
from csekit.training.trainer import train

CaptureErr = pytest.CaptureFixture[str]


class Poison:
    """Unpickling this object opens (creates) `marker`: what a hostile pickle could do, harmlessly."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[Callable[..., object], tuple[str, str]]:
        return (open, (self.marker, "w"))


def write_poison(path: Path, marker: Path) -> None:
    """A torch file whose unpickling creates `marker`; checked on a twin that an unsafe load does run it."""
    torch.save(Poison(marker), path)
    twin, twin_marker = path.with_name(path.name + ".twin"), marker.with_name(marker.name + ".twin")
    torch.save(Poison(twin_marker), twin)
    torch.load(twin, weights_only=False)
    assert twin_marker.exists()
    twin.unlink()


def write_recipe_file(path: Path, model: Path, corpus: Path) -> Path:
    path.write_text(
        f"""
model: {{backbone: "{model}", pooler: mean, max_length: 16}}
data: {{corpus: "{corpus}"}}
train: {{batch_size: 16, lr: 5.0e-4, max_steps: 50, eval_every: 2, log_every: 1, dev_task: none}}
""",
        encoding="utf-8",
    )
    return path


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of 2 steps (a checkpoint at step 2) started with `--set train.max_steps=2`; copy before use."""
    root = tmp_path_factory.mktemp("finished")
    model = root / "tiny-model"
    make_tiny_encoder(root / "tokenizer").save(model)
    recipe = write_recipe_file(root / "recipe.yaml", model, make_corpus(root / "corpus.txt", lines=64))
    train(load_recipe(recipe, ["train.max_steps=2"]), root / "run", show_progress=False)
    return root


@pytest.fixture
def run(finished_run: Path, tmp_path: Path) -> Path:
    """A private copy of the finished run (its recipe file stays in `finished_run`)."""
    return Path(shutil.copytree(finished_run / "run", tmp_path / "run"))


def resume(monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr, run: Path, *args: str) -> tuple[int, str]:
    return run_main(monkeypatch, capsys, "train", *args, "--output", str(run), "--resume", "--no-progress")


# --- 1. checkpoints are loaded without unpickling objects -----------------------------------------


@pytest.mark.parametrize("name", ["optimizer.pt", "scheduler.pt", "rng_state_0.pt"])
def test_a_poisoned_checkpoint_file_is_never_unpickled(
    name: str, run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr
) -> None:
    marker = tmp_path / "code-ran"
    write_poison(run / "checkpoint" / name, marker)
    before = (run / "metrics.jsonl").read_text()
    code, err = resume(monkeypatch, capsys, run)
    assert_one_line_error(code, err, str(run / "checkpoint" / name), "not written by csekit")
    assert not marker.exists()
    assert (run / "metrics.jsonl").read_text() == before


def test_a_checkpoint_in_accelerates_pickle_format_is_refused(
    run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr
) -> None:
    """What csekit wrote before (accelerate's save_state): its pickles are not opened at all."""
    marker = tmp_path / "code-ran"
    checkpoint = run / "checkpoint"
    for name in ("optimizer.pt", "scheduler.pt", "rng_state_0.pt"):
        (checkpoint / name).unlink()
    for name in ("custom_checkpoint_0.pkl", "random_states_0.pkl", "optimizer.bin", "scheduler.bin"):
        write_poison(checkpoint / name, marker)
    code, err = resume(monkeypatch, capsys, run)
    assert_one_line_error(code, err, str(checkpoint), "older format that stores pickles")
    assert not marker.exists()


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


DAMAGE: dict[str, tuple[str, Callable[[Path], None]]] = {
    "truncated weights": ("model.safetensors", truncate),
    "garbage optimizer": ("optimizer.pt", lambda p: p.write_bytes(os.urandom(300))),
    "truncated scheduler": ("scheduler.pt", truncate),
    "garbage state": ("trainer_state.json", lambda p: p.write_text('{"step": "many"}')),
    "missing random states": ("rng_state_0.pt", Path.unlink),
    "random states of another kind": ("rng_state_0.pt", lambda p: torch.save({"python": 1}, p)),
}


@pytest.mark.parametrize("case", DAMAGE)
def test_a_damaged_checkpoint_gives_one_clear_error(
    case: str, run: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr
) -> None:
    name, damage = DAMAGE[case]
    damage(run / "checkpoint" / name)
    before = (run / "metrics.jsonl").read_text()
    code, err = resume(monkeypatch, capsys, run)
    assert_one_line_error(code, err, str(run / "checkpoint" / name))
    assert (run / "metrics.jsonl").read_text() == before


def test_a_damaged_metrics_log_names_its_line(run: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr) -> None:
    with open(run / "metrics.jsonl", "a", encoding="utf-8") as handle:
        handle.write("not json\n")
    code, err = resume(monkeypatch, capsys, run)
    lines = len((run / "metrics.jsonl").read_text().splitlines())
    assert_one_line_error(code, err, f"{run / 'metrics.jsonl'}:{lines}")


# --- 2. a recipe names only registered parts ------------------------------------------------------


@pytest.mark.parametrize(
    "override", ["objectives=[{name: 'os:mkdir', path: '{target}'}]", "model.head={name: 'os:mkdir', path: '{target}'}"]
)
def test_a_recipe_cannot_import_and_call_code(
    override: str,
    finished_run: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: CaptureErr,
) -> None:
    target = tmp_path / "made-by-the-recipe"
    args = ["train", str(finished_run / "recipe.yaml"), "--output", str(tmp_path / "out")]
    code, err = run_main(monkeypatch, capsys, *args, "--set", override.replace("{target}", str(target)))
    key = "objectives[0].name" if override.startswith("objectives") else "model.head.name"
    assert_one_line_error(code, err, f"recipe key {key}", '"os:mkdir"', "register")
    assert not target.exists() and not (tmp_path / "out").exists()


class ZeroLoss(InfoNCE):
    """A user's own objective: InfoNCE times zero, under its own name."""

    def forward(self, state):  # type: ignore[no-untyped-def]
        return {"zero": super().forward(state)["infonce"] * 0.0}


@pytest.fixture
def zero_loss() -> Iterator[None]:
    csekit.register_part("objective", "zero_loss", ZeroLoss)
    yield
    OBJECTIVES.unregister("zero_loss")


def test_a_registered_part_trains(tmp_path: Path, tiny_model_dir: Path, zero_loss: None) -> None:
    corpus = make_corpus(tmp_path / "corpus.txt", lines=64)
    objectives = "objectives=[{name: infonce}, {name: zero_loss, temperature: 0.1}]"
    train(tiny_recipe(tiny_model_dir, corpus, "train.max_steps=2", objectives), tmp_path / "run", show_progress=False)
    steps = [r for r in read_metrics(tmp_path / "run") if "loss" in r]
    assert [r["zero"] for r in steps] == [0.0, 0.0] and all(r["loss"] == r["infonce"] for r in steps)


def test_register_part_refuses_to_change_a_part(zero_loss: None) -> None:
    csekit.register_part("objective", "zero_loss", ZeroLoss)  # the same again: harmless
    with pytest.raises(CsekitError, match='"infonce" is taken'):
        csekit.register_part("objective", "infonce", ZeroLoss)
    with pytest.raises(CsekitError, match='unknown part kind "objectives"'):
        csekit.register_part("objectives", "other", ZeroLoss)
    with pytest.raises(CsekitError, match="letters, digits"):
        csekit.register_part("objective", "mypkg:Loss", ZeroLoss)
    assert OBJECTIVES.get("infonce") is InfoNCE


def test_an_installed_plugin_part_is_loaded_when_a_recipe_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(write_entry_points(tmp_path / "site")))
    assert "kill_once" in OBJECTIVES and "kill_once" not in HEADS
    part = build_part(OBJECTIVES, {"name": "kill_once", "at_call": 3, "marker": str(tmp_path / "m")}, "objectives[1]")
    assert isinstance(part, KillOnce) and part.at_call == 3


# --- 4. --resume continues the run in the folder, with its saved recipe ---------------------------


def test_resume_without_a_recipe_continues_the_saved_one(
    run: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr
) -> None:
    """Started with --set train.max_steps=2 (the file says 50): a resume without the recipe stops at 2."""
    shutil.rmtree(run / "checkpoint")  # as if stopped before its first checkpoint (an incomplete one is refused)
    code, err = resume(monkeypatch, capsys, run)
    assert code == 0, err
    assert [r["step"] for r in read_metrics(run) if "loss" in r] == [1, 2]


@pytest.mark.parametrize(
    ("overrides", "key"),
    [((), "train.max_steps"), (("--set", "train.max_steps=2", "--set", "train.lr=1e-3"), "train.lr")],
)
def test_resume_refuses_a_changed_recipe_and_names_the_key(
    overrides: tuple[str, ...],
    key: str,
    run: Path,
    finished_run: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: CaptureErr,
) -> None:
    """The run was started with --set train.max_steps=2; the file says 50."""
    before = (run / "metrics.jsonl").read_text()
    code, err = resume(monkeypatch, capsys, run, str(finished_run / "recipe.yaml"), *overrides)
    assert_one_line_error(code, err, f"recipe key {key}", "--allow-changes")
    assert (run / "metrics.jsonl").read_text() == before


def test_allow_changes_records_the_change(run: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr) -> None:
    code, err = resume(monkeypatch, capsys, run, "--set", "train.max_steps=3", "--allow-changes")
    assert code == 0, err
    records = read_metrics(run)
    assert [r["step"] for r in records if "loss" in r] == [1, 2, 3]
    changed = [r for r in records if r.get("event") == "recipe_changed"]
    assert changed == [{"event": "recipe_changed", "step": 2, "changes": {"train.max_steps": [2, 3]}}]
    assert load_recipe(run / "recipe.yaml").train.max_steps == 3


@pytest.mark.parametrize("with_recipe", [False, True])
def test_resume_with_nothing_to_resume_says_so(
    with_recipe: bool, finished_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr
) -> None:
    recipe = [str(finished_run / "recipe.yaml")] if with_recipe else []
    code, err = resume(monkeypatch, capsys, tmp_path / "none", *recipe)
    assert_one_line_error(code, err, str(tmp_path / "none"), "nothing to resume")
    assert not (tmp_path / "none").exists()


def test_recipe_changes_compares_key_by_key() -> None:
    old = load_recipe(None, ["objectives=[{name: infonce, temperature: 0.05}]"])
    new = load_recipe(None, ["objectives=[{name: infonce, temperature: 0.1}, {name: infonce}]", "train.lr=3e-5"])
    assert recipe_changes(old, new) == {
        "objectives[0].temperature": (0.05, 0.1),
        "objectives[1].name": (None, "infonce"),
    }
    assert recipe_changes(old, old) == {}


# --- 5. one run per output folder -----------------------------------------------------------------


@pytest.fixture
def held_lock(tmp_path: Path) -> Iterator[Callable[[Path], None]]:
    """Hold `folder/.lock` as a running csekit train would (this test process is the holder)."""
    handles = []

    def hold(folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        handle = open(folder / ".lock", "w", encoding="utf-8")  # noqa: SIM115 - closed at teardown
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        handle.write(json.dumps({"pid": 4242, "host": "elsewhere"}))
        handle.flush()
        handles.append(handle)

    yield hold
    for handle in handles:
        handle.close()


def test_a_running_run_refuses_a_resume_and_a_new_run(
    run: Path,
    finished_run: Path,
    tmp_path: Path,
    held_lock: Callable[[Path], None],
    monkeypatch: pytest.MonkeyPatch,
    capsys: CaptureErr,
) -> None:
    held_lock(run)
    before = (run / "metrics.jsonl").read_text()
    code, err = resume(monkeypatch, capsys, run)
    assert_one_line_error(code, err, str(run), "in use by a running csekit train (pid 4242 on elsewhere)")
    assert (run / "metrics.jsonl").read_text() == before

    held_lock(tmp_path / "starting")  # a run that has not written anything yet
    args = ["train", str(finished_run / "recipe.yaml"), "--output", str(tmp_path / "starting")]
    code, err = run_main(monkeypatch, capsys, *args)
    assert_one_line_error(code, err, "in use by a running csekit train")
    assert sorted(p.name for p in (tmp_path / "starting").iterdir()) == [".lock"]


def test_a_stale_lock_of_a_dead_process_is_cleared(
    run: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr
) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (run / ".lock").write_text(json.dumps({"pid": int(dead.stdout), "host": os.uname().nodename}))
    code, err = resume(monkeypatch, capsys, run, "--set", "train.max_steps=3", "--allow-changes")
    assert code == 0, err
    assert [r["step"] for r in read_metrics(run) if "loss" in r] == [1, 2, 3]
    assert not (run / ".lock").exists()  # released at the end


def test_a_lock_that_links_elsewhere_is_not_followed(
    run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr
) -> None:
    """A shared run folder whose .lock points at one of your files: the file is not truncated."""
    victim = tmp_path / "precious.txt"
    victim.write_text("keep me", encoding="utf-8")
    (run / ".lock").symlink_to(victim)
    code, err = resume(monkeypatch, capsys, run)
    assert_one_line_error(code, err, str(run / ".lock"), "symbolic link")
    assert victim.read_text(encoding="utf-8") == "keep me"


def test_a_lock_that_is_a_fifo_is_refused_and_kept(
    run: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr
) -> None:
    """A FIFO as .lock was opened (with a reader present it would block), written to and deleted."""
    os.mkfifo(run / ".lock")
    code, err = resume(monkeypatch, capsys, run)
    assert_one_line_error(code, err, str(run / ".lock"), "not a regular file")
    assert stat.S_ISFIFO(os.lstat(run / ".lock").st_mode)


# --- 3. download-data: https only, every file checked before use ----------------------------------


def senteval_archives(data: Path) -> dict[str, bytes]:
    """Archives laid out as the hosts serve them, made from the staged SentEval files (by URL)."""

    def zipped(files: dict[str, bytes]) -> bytes:
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as archive:
            for name, content in files.items():
                archive.writestr(name, content)
        return buffer.getvalue()

    archives = {}
    for year, (url, subdir) in data_dir_module._STS_URLS.items():
        prefix = "STS2016" if year == "STS16" else "STS"
        files = {}
        for subset in data_dir_module.STS_SUBSETS[year]:
            for kind in ("input", "gs"):
                files[f"{subdir}/{prefix}.{kind}.{subset}.txt"] = (
                    data / f"sts/{year}/STS.{kind}.{subset}.txt"
                ).read_bytes()
        archives[url] = zipped(files)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for split in ("train", "dev", "test"):
            archive.add(data / f"sts/STSBenchmark/sts-{split}.csv", f"stsbenchmark/sts-{split}.csv")
    archives[data_dir_module._STSB_URL] = buffer.getvalue()
    for split in ("train", "trial", "test_annotated"):
        content = (data / f"sts/SICK/SICK_{split}.txt").read_bytes()
        archives[data_dir_module._SICK_URL.format(split=split)] = zipped({f"SICK_{split}.txt": content})
    return archives


def fake_fetch(monkeypatch: pytest.MonkeyPatch, archives: dict[str, bytes]) -> None:
    def fetch(url: str, target: Path) -> None:
        data_dir_module._require_https(url)
        target.write_bytes(archives[url])

    monkeypatch.setattr(data_dir_module, "_fetch", fetch)


def test_download_checks_every_file_and_keeps_the_scores(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_fetch(monkeypatch, senteval_archives(data_dir))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # without sacremoses the sentences stay untokenised
        data_dir_module.download_senteval_data(tmp_path / "data")
    for relative in ("sts/STS12/STS.gs.MSRpar.txt", "sts/STS16/STS.gs.headlines.txt"):
        assert (tmp_path / "data" / relative).read_bytes() == (data_dir / relative).read_bytes()
    assert (tmp_path / "data/sts/SICK/SICK_test_annotated.txt").exists()


@pytest.mark.parametrize(
    ("url_of", "member", "relative"),
    [
        (lambda m: m._STS_URLS["STS13"][0], "test-gs/STS.gs.headlines.txt", "sts/STS13/STS.gs.headlines.txt"),
        (lambda m: m._STSB_URL, "stsbenchmark/sts-test.csv", "sts/STSBenchmark/sts-test.csv"),
    ],
)
def test_a_tampered_download_names_the_file_and_is_not_used(
    url_of: Callable[..., str],
    member: str,
    relative: str,
    data_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: CaptureErr,
) -> None:
    archives = senteval_archives(data_dir)
    url = url_of(data_dir_module)
    original = (data_dir / relative).read_bytes()
    tampered = original.replace(b"5.000", b"0.000", 1) if b"5.000" in original else original.replace(b"4", b"1", 1)
    assert tampered != original
    buffer = io.BytesIO()
    if url.endswith(".zip"):
        with zipfile.ZipFile(io.BytesIO(archives[url])) as source, zipfile.ZipFile(buffer, "w") as archive:
            for name in source.namelist():
                archive.writestr(name, tampered if name == member else source.read(name))
    else:
        with (
            tarfile.open(fileobj=io.BytesIO(archives[url])) as source,
            tarfile.open(fileobj=buffer, mode="w:gz") as out,
        ):
            for info in source.getmembers():
                content = tampered if info.name == member else source.extractfile(info).read()  # type: ignore[union-attr]
                info.size = len(content)
                out.addfile(info, io.BytesIO(content))
    archives[url] = buffer.getvalue()
    fake_fetch(monkeypatch, archives)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        code, err = run_main(monkeypatch, capsys, "download-data", str(tmp_path / "data"))
    assert_one_line_error(code, err, f"downloaded file {relative}", url, "does not match its pinned checksum")
    assert not (tmp_path / "data" / relative).exists()


def test_download_refuses_http(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[str] = []
    monkeypatch.setattr(data_dir_module.urllib.request, "urlopen", lambda url, timeout: opened.append(url))
    with pytest.raises(CsekitError, match="https only"):
        data_dir_module._fetch("http://ixa2.si.ehu.es/stswiki/images/4/40/STS2012-en-test.zip", tmp_path / "a.zip")
    assert opened == [] and not (tmp_path / "a.zip").exists()
    urls = [url for url, _ in data_dir_module._STS_URLS.values()]
    urls += [data_dir_module._STSB_URL, data_dir_module._SICK_URL]
    assert all(url.startswith("https://") for url in urls)


def test_download_refuses_a_redirect_to_http(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class Redirected(io.BytesIO):
        headers: ClassVar[dict[str, str]] = {}

        def geturl(self) -> str:
            return "http://mirror.example/STS2012-en-test.zip"

    monkeypatch.setattr(data_dir_module.urllib.request, "urlopen", lambda url, timeout: Redirected(b"PK"))
    with pytest.raises(CsekitError, match="refused: csekit fetches data over https only"):
        data_dir_module._fetch("https://ixa2.si.ehu.es/stswiki/images/4/40/STS2012-en-test.zip", tmp_path / "a.zip")

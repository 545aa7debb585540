"""Shared fixtures and helpers: a tiny randomly initialised BERT with its own WordPiece vocabulary (no
downloads), made-up corpora and data folders, tiny recipes, and the ways tests run the CLI and read a run."""

from __future__ import annotations

import functools
import json
import os
import random
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import torch
from hypothesis import HealthCheck, settings
from safetensors.torch import load_file
from transformers import (
    AutoConfig,
    AutoModelForMaskedLM,
    BertTokenizerFast,
    PretrainedConfig,
    PreTrainedTokenizerFast,
)

from csekit import cli
from csekit.core.precision import NATIVE_BF16_VARIABLE
from csekit.encoding.encoder import SentenceEncoder
from csekit.training.recipe import Recipe, load_recipe

if TYPE_CHECKING:
    from csekit.training.best_model import TrainResult

WORDS = """
a the man woman dog cat is are was plays playing runs running sits on in with guitar ball park
house red blue big small and not of to . , ! ? he she it they eats food music quickly slowly
""".split()

REPO = Path(__file__).resolve().parents[1]

DISTINCT_SENTENCES = [
    "a man plays the guitar",
    "the dog runs in the park",
    "she eats food quickly",
    "a small cat sits on the house",
    "they are playing music",
    "the red ball is big",
    "he runs slowly with the dog",
    "a woman plays with a blue ball",
    "the cat eats the red food",
    "a man runs in the house",
    "she plays the blue guitar slowly",
    "they sit on a small ball",
]
"""Twelve distinct short sentences in the tiny vocabulary (batches of known rows: DDP, duplicates)."""


def shared_data_dir() -> Path | None:
    """The SentEval data folder: $CSEKIT_DATA, else ../shared/data beside the repository."""
    env = os.environ.get("CSEKIT_DATA")
    candidates = [Path(env)] if env else []
    candidates.append(REPO.parent / "shared" / "data")
    return next((path for path in candidates if (path / "sts").is_dir()), None)


def make_tokenizer(folder: Path) -> BertTokenizerFast:
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, *"abcdefghijklmnopqrstuvwxyz"]
    vocab += [f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz"]
    vocab = list(dict.fromkeys(vocab))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    try:  # transformers >= 5 takes the vocabulary itself
        tokenizer = BertTokenizerFast(vocab={token: i for i, token in enumerate(vocab)}, do_lower_case=True)
    except TypeError:  # transformers 4
        tokenizer = BertTokenizerFast(vocab_file=str(folder / "vocab.txt"), do_lower_case=True)
    assert tokenizer.vocab_size == len(vocab) and tokenizer.unk_token_id not in tokenizer("the dog")["input_ids"]
    return tokenizer


def make_tiny_encoder(
    folder: Path, pooler: str = "cls", seed: int = 0, model_type: str = "bert", initializer_range: float = 0.02
) -> SentenceEncoder:
    """A 2-layer, 32-dimension model of `model_type` (a transformers model type) with the tiny vocabulary.

    `initializer_range` is the weights' standard deviation (transformers' default, 0.02, makes every
    sentence's [CLS] vector almost the same; about 0.2 makes them differ as a trained model's do).
    """
    torch.manual_seed(seed)
    tokenizer = make_tokenizer(folder)
    config = tiny_config(model_type, tokenizer.vocab_size, 32, initializer_range)
    return SentenceEncoder.from_config(config, tokenizer, pooler=pooler)


def tiny_config(
    model_type: str, vocab_size: int, hidden_size: int, initializer_range: float, **settings: Any
) -> PretrainedConfig:
    """The tests' one shape of tiny model: `hidden_size` wide, 2 layers of 2 heads, a feed-forward twice the width,
    64 positions and [PAD] at id 0 (RoBERTa's and MPNet's configs default to 1), then `settings` on top."""
    shape = {
        "hidden_size": hidden_size,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 2 * hidden_size,
        "max_position_embeddings": 64,
        "pad_token_id": 0,
    }
    return AutoConfig.for_model(
        model_type, vocab_size=vocab_size, initializer_range=initializer_range, **{**shape, **settings}
    )


def make_tiny_mlm(
    folder: Path, seed: int = 0, model_type: str = "bert", initializer_range: float = 0.02, layers: int = 1
) -> Path:
    """A saved masked-LM model of `model_type`, 16 wide, with the tiny vocabulary: 1 layer, a DiffCSE generator;
    2 layers with wide weights, a stand-in for a trained model. Its folder."""
    torch.manual_seed(seed)
    tokenizer = make_tokenizer(folder)
    config = tiny_config(model_type, tokenizer.vocab_size, 16, initializer_range, num_hidden_layers=layers)
    AutoModelForMaskedLM.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def make_byte_level_bpe_tokenizer(
    texts: Sequence[str], vocab_size: int = 400, min_frequency: int = 1
) -> PreTrainedTokenizerFast:
    """A RoBERTa-style tokenizer (byte-level BPE, <s>=0, <pad>=1, </s>=2, <mask> with lstrip) learnt offline from
    `texts` (each counted 5 times, so `min_frequency` counts in fives). benchmarks/cuda_recipes.py uses it too."""
    from tokenizers import AddedToken, ByteLevelBPETokenizer
    from tokenizers.processors import RobertaProcessing

    bpe = ByteLevelBPETokenizer()
    # <mask> takes the space before it, as in roberta-base's tokenizer ("Ġmeans", "<mask>", not "Ġ", "<mask>").
    specials = ["<s>", "<pad>", "</s>", "<unk>", AddedToken("<mask>", lstrip=True, special=True)]
    bpe.train_from_iterator(
        list(texts) * 5, vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=specials
    )
    bpe.post_processor = RobertaProcessing(("</s>", bpe.token_to_id("</s>")), ("<s>", bpe.token_to_id("<s>")))
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token="<s>",
        eos_token="</s>",
        cls_token="<s>",
        sep_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        mask_token=AddedToken("<mask>", lstrip=True),
    )


HYPOTHESIS_PROFILE_VARIABLE = "CSEKIT_HYPOTHESIS"
LONG_RUN_FACTOR = 40
"""`make test` runs every property test with a fixed seed (profile `bounded`: the same examples on every run, so a
failure reproduces and CI time is known); `make test-hostile` sets CSEKIT_HYPOTHESIS=long: fresh random examples,
and LONG_RUN_FACTOR times as many for the tests of hostile input (`hostile_examples`)."""
_QUIET_FIXTURES = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
settings.register_profile("bounded", derandomize=True, deadline=None, suppress_health_check=_QUIET_FIXTURES)
settings.register_profile("long", derandomize=False, deadline=None, suppress_health_check=_QUIET_FIXTURES)
settings.load_profile(os.environ.get(HYPOTHESIS_PROFILE_VARIABLE, "bounded"))


def hostile_examples(bounded: int) -> settings:
    """The settings of a property test of hostile input: `bounded` examples in `make test`, LONG_RUN_FACTOR times
    as many in `make test-hostile`."""
    long_run = os.environ.get(HYPOTHESIS_PROFILE_VARIABLE) == "long"
    return settings(max_examples=bounded * LONG_RUN_FACTOR if long_run else bounded)


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (`make test` runs `-n auto`), each worker gets its share of the cores.

    PyTorch runs a thread a core by default, so 2 workers on 2 cores would run 4 busy threads and slow
    each other down. A worker sets its own thread count, and OMP_NUM_THREADS and MKL_NUM_THREADS to the
    same for the processes its tests start (CLI runs, torchrun); tests that set their own still do.
    """
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if "PYTEST_XDIST_WORKER" not in os.environ or not workers:
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    threads = max(1, cores // int(workers))
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)


TESTS = REPO / "tests"
TIERS = ("unit", "methods", "runs", "invariants")
"""The tiers: folders of tests/ whose tests carry the folder's name as a marker (`pytest -m unit`). unit/<area>/ tests
one package of src/csekit, methods/ a method's parts and recipes, runs/ commands end to end, invariants/ the rules
every recipe, file and source file keeps. Helpers stay in tests/ (invariants/architecture/test_tiers.py)."""
FAST_FOLDERS = ("unit", "invariants/architecture")
"""The folders of `make test-fast` (marked `fast` too): the unit tests and the checks on the source, a tier that
imports every module of src/csekit (tests/invariants/architecture/test_tiers.py checks it)."""


def tier_markers(path: Path, tests: Path = TESTS) -> list[str]:
    """The markers of the test file `path` by its folder under `tests`: its tier, and `fast` inside FAST_FOLDERS."""
    path = path.resolve()
    folder = path.relative_to(tests).parent if path.is_relative_to(tests) else Path()
    if not folder.parts or folder.parts[0] not in TIERS:
        return []  # no tier: test_tiers.py fails for such a file
    return [folder.parts[0], *(["fast"] if any(folder.is_relative_to(fast) for fast in FAST_FOLDERS) else [])]


def slow_first(items: list[pytest.Item]) -> None:
    """Put the tests marked `slow` first, each group in its collected order.

    `make test` shares the tests among workers that steal from each other's queues: a long test collected
    last would run alone while the other workers stand idle (the 140 s gpu_check test ended CI's run
    alone), whereas long tests run first leave only short ones to share at the end.
    """
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test by its folder (`tier_markers`), in one place rather than in each file; slow ones first."""
    for item in items:
        for marker in tier_markers(item.path):
            item.add_marker(marker)
    slow_first(items)


@pytest.fixture(autouse=True)
def cpu_without_native_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test sees the same hardware answer, an AVX2-only CPU, whatever CPU runs the suite.

    A test whose result depends on what `auto` chooses takes `native_bf16` instead, which runs it with the
    answer forced both ways, so that a green run on one kind of CPU cannot hide a red one on the other.
    The variable reaches the csekit processes a test starts too.
    """
    monkeypatch.setenv(NATIVE_BF16_VARIABLE, "0")


@pytest.fixture(params=[False, True], ids=["avx2-cpu", "native-bf16-cpu"])
def native_bf16(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Run the test twice: on a CPU without native bf16 (`auto` is fp32) and on one with it (`auto` is bf16)."""
    monkeypatch.setenv(NATIVE_BF16_VARIABLE, "1" if request.param else "0")
    return bool(request.param)


def auto_precision(native: bool) -> str:
    """What `precision: auto` trains in on the CPU `native_bf16` stands for."""
    return "bf16" if native else "fp32"


@pytest.fixture
def tiny_encoder(tmp_path: Path) -> SentenceEncoder:
    return make_tiny_encoder(tmp_path / "tokenizer")


@pytest.fixture
def tiny_model_dir(tmp_path: Path) -> Path:
    """A saved tiny model directory, usable as a recipe's `model.backbone`."""
    path = tmp_path / "tiny-model"
    make_tiny_encoder(tmp_path / "tokenizer").save(path)
    return path


@pytest.fixture
def data_dir() -> Path:
    path = shared_data_dir()
    if path is None:
        pytest.skip("SentEval data folder not found (set CSEKIT_DATA)")
    return path


@pytest.fixture
def test_parts() -> Iterator[None]:
    """The objectives of parts_for_tests, registered for this test (kill_once, raise_once, interrupt_once, ...)."""
    from parts_for_tests import TEST_PARTS

    import csekit
    from csekit.parts.objectives import OBJECTIVES

    for name, part in TEST_PARTS.items():
        csekit.register_part("objective", name, part)
    yield
    for name in TEST_PARTS:
        OBJECTIVES.unregister(name)


def make_corpus(path: Path, lines: int = 256, seed: int = 0) -> Path:
    """A made-up training corpus of `lines` sentences (3 to 9 words of the tiny vocabulary each)."""
    rng = random.Random(seed)
    words = [w for w in WORDS if w.isalpha()]
    path.write_text("\n".join(" ".join(rng.choices(words, k=rng.randint(3, 9))) for _ in range(lines)) + "\n")
    return path


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    """The default made-up corpus (256 sentences) at tmp_path/corpus.txt."""
    return make_corpus(tmp_path / "corpus.txt")


def make_data_dir(root: Path, pairs: int = 40, seed: int = 1) -> Path:
    """A made-up data folder with an STS-B dev split (SentEval's 7 tab-separated fields)."""
    rng = random.Random(seed)
    words = [w for w in WORDS if w.isalpha()]
    folder = root / "sts" / "STSBenchmark"
    folder.mkdir(parents=True)
    rows = []
    for i in range(pairs):
        a = " ".join(rng.choices(words, k=6))
        b = " ".join(rng.choices(words, k=6))
        rows.append(f"main-captions\tMSRvid\t2012test\t{i:04d}\t{rng.uniform(0, 5):.3f}\t{a}\t{b}")
    (folder / "sts-dev.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return root


def add_sick_trial(root: Path, pairs: int = 30, seed: int = 2) -> Path:
    """A made-up SICK trial split (SentEval's SICK_trial.txt: header, then id, A, B, score, label)."""
    rng = random.Random(seed)
    words = [w for w in WORDS if w.isalpha()]
    rows = ["pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment"]
    for i in range(pairs):
        a, b = " ".join(rng.choices(words, k=5)), " ".join(rng.choices(words, k=5))
        rows.append(f"{i}\t{a}\t{b}\t{rng.uniform(1, 5):.2f}\tNEUTRAL")
    folder = root / "sts" / "SICK"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "SICK_trial.txt").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return root


def tiny_recipe(model_dir: Path, corpus: Path, *extra: str) -> Recipe:
    """The default recipe on a tiny model and corpus: short sentences, batches of 16, a log record every step."""
    return load_recipe(
        None,
        [
            f"model.backbone={model_dir}",
            "model.max_length=16",
            f"data.corpus={corpus}",
            "train.batch_size=16",
            "train.lr=5e-4",
            "train.log_every=1",
            "train.dev_task=none",
            *extra,
        ],
    )


def read_metrics(folder: Path) -> list[dict[str, Any]]:
    """A run folder's metrics.jsonl, one dict a record."""
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


@dataclass(frozen=True)
class TinyRun:
    """A finished `train_tiny` run: its folder, what `train` returned and the recipe it trained."""

    folder: Path
    result: TrainResult
    recipe: Recipe

    @property
    def metrics(self) -> list[dict[str, Any]]:
        """metrics.jsonl as it is now (read each time: a later run into the folder appends to it)."""
        return read_metrics(self.folder)

    @property
    def losses(self) -> list[dict[str, Any]]:
        """The records of training steps: those with a loss (not the start, evaluation or event records)."""
        return [record for record in self.metrics if "loss" in record]


@dataclass(frozen=True)
class TinyTrainer:
    """What the `train_tiny` fixture gives: a call that trains a tiny run in the test's tmp_path."""

    tmp_path: Path
    tiny_model_dir: Path

    def __call__(
        self,
        *overrides: str,
        steps: int = 3,
        lines: int = 64,
        eval_every: int = 0,
        name: str = "run",
        model: Path | None = None,
        corpus: Path | None = None,
        data_dir: Path | None = None,
        resume: bool = False,
    ) -> TinyRun:
        """`tiny_recipe` on `model` (default: `tiny_model_dir`) and `corpus` (default: a made-up corpus of `lines`
        sentences at tmp_path/corpus.txt) for `steps` steps, evaluating and checkpointing every `eval_every` (0: at
        the end only), then `overrides` (recipe keys, applied last); trained into tmp_path/`name` (a second run in
        the same test names its own, `resume`: from its checkpoint) with the dev data of `data_dir`."""
        from csekit.training.trainer import train

        backbone = model if model is not None else self.tiny_model_dir
        sentences = corpus if corpus is not None else make_corpus(self.tmp_path / "corpus.txt", lines=lines)
        schedule = (f"train.max_steps={steps}", f"train.eval_every={eval_every}")
        recipe = tiny_recipe(backbone, sentences, *schedule, *overrides)
        result = train(recipe, self.tmp_path / name, data_dir=data_dir, resume=resume, show_progress=False)
        return TinyRun(self.tmp_path / name, result, recipe)


@pytest.fixture
def train_tiny(tmp_path: Path, tiny_model_dir: Path) -> TinyTrainer:
    """The block most training tests began with (tiny corpus, tiny recipe, train, read the metrics), in one place:
    each test states only what its run changes, and a change to how tests train is made here once."""
    return TinyTrainer(tmp_path, tiny_model_dir)


FRESH_INTERPRETER_COMMANDS = ("train",)
"""Commands `run_cli` runs in a process of their own: accelerate keeps one precision (and state) a process."""


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`csekit ARGS` as a user runs it in `cwd`: exit status, stdout and stderr.

    `train` runs in a fresh process (FRESH_INTERPRETER_COMMANDS; forked by `run_csekit`); other commands run in
    this process, which has every library imported already."""
    if not args or args[0] in FRESH_INTERPRETER_COMMANDS:
        return run_csekit(*args, cwd=cwd)
    return run_cli_in_this_process(*args, cwd=cwd)


class CsekitForkServer:
    """tests/cli_forkserver.py, started on first use: each command in a fresh process forked from one that has
    imported the command line (a new interpreter spends about 7 s of CPU on imports first)."""

    def __init__(self) -> None:
        self.log = Path(tempfile.mkdtemp(prefix="csekit-forkserver-")) / "server.log"
        server = Path(__file__).resolve().parent / "cli_forkserver.py"
        with open(self.log, "w", encoding="utf-8") as log:
            self.process = subprocess.Popen(
                [sys.executable, str(server)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
                cwd=REPO,
            )  # fmt: skip
        assert self.process.stdout is not None and self.process.stdout.readline() == "ready\n", self.log.read_text()

    def run(
        self, args: Sequence[str], cwd: Path | None, env: dict[str, str] | None
    ) -> subprocess.CompletedProcess[str]:
        assert self.process.stdin is not None and self.process.stdout is not None
        with tempfile.TemporaryDirectory() as folder:
            out, err = Path(folder) / "stdout", Path(folder) / "stderr"
            request = {
                "argv": list(args), "cwd": str(cwd or Path.cwd()), "env": dict(os.environ if env is None else env),
                "stdout": str(out), "stderr": str(err),
            }  # fmt: skip
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
            answer = self.process.stdout.readline()
            assert answer, f"the csekit fork server stopped: {self.log.read_text()[-3000:]}"
            code = json.loads(answer)["returncode"]
            text = {path: path.read_text(encoding="utf-8", errors="replace") for path in (out, err)}
        command = [sys.executable, "-m", "csekit.cli", *args]
        return subprocess.CompletedProcess(command, code, text[out], text[err])


@functools.cache
def fork_server() -> CsekitForkServer:
    """This pytest process's fork server (one a worker, started the first time a test runs a command)."""
    return CsekitForkServer()


def run_csekit(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`python -m csekit.cli ARGS` in `cwd` with `env` (default: this process's), in a fresh process of its own
    group: exit status (negative: the signal that ended it), stdout and stderr, as subprocess.run gives them."""
    return fork_server().run(args, cwd, env)


def run_cli_in_this_process(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`csekit ARGS` through `cli.main` here, in `cwd`, its output captured: the result a subprocess gives."""
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    argv, here = sys.argv, Path.cwd()
    code: int | str | None = 0
    try:
        sys.argv = ["csekit", *args]
        os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                cli.main()
            except SystemExit as stop:
                code = stop.code
    finally:
        sys.argv = argv
        os.chdir(here)
    if isinstance(code, str):  # sys.exit("message"): Python prints it and exits with 1
        err.write(code + "\n")
        code = 1
    return subprocess.CompletedProcess(["csekit", *args], int(code or 0), out.getvalue(), err.getvalue())


def run_cli_with_test_parts(
    *args: str, plugin_dir: Path, cwd: Path | None = None, stderr: Path | None = None, own_group: bool = False
) -> subprocess.CompletedProcess[str]:
    """`csekit ARGS` in a fresh process (`run_csekit`) that sees parts_for_tests' parts as an installed plugin (in
    `plugin_dir`).

    With `stderr`, the error stream goes to that file (as a user redirecting it), not to a pipe. The process leads
    its own process group (a signal to the group reaches it and its children only), so `own_group` is always met.
    """
    from parts_for_tests import write_entry_points

    tests = Path(__file__).resolve().parent
    path = [str(tests), str(write_entry_points(plugin_dir)), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    done = run_csekit(*args, cwd=cwd, env=env)  # its own process group, whatever own_group says
    if stderr is not None:  # the error stream into a file, as a user redirecting it (the server writes files)
        stderr.write_text(done.stderr, encoding="utf-8")
        done.stderr = None
    return done


def assert_same_checkpoint_weights(expected_run: Path, actual_run: Path) -> None:
    """The two runs' checkpoints hold the same tensors, bit for bit (an exact resume)."""
    expected = load_file(expected_run / "checkpoint" / "model.safetensors")
    actual = load_file(actual_run / "checkpoint" / "model.safetensors")
    assert set(actual) == set(expected)
    for name, tensor in expected.items():
        torch.testing.assert_close(actual[name], tensor, rtol=0, atol=0, msg=name)


def run_main(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """`csekit ARGS` in this process: (exit status, stderr)."""
    monkeypatch.setattr(sys, "argv", ["csekit", *args])
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    return int(exit_info.value.code or 0), capsys.readouterr().err


def write_recipe(tmp_path: Path, model: Path, corpus: Path | str, extra: str = "") -> Path:
    """A recipe file for the CLI: the model, the corpus, no dev task, batches of 8, then `extra` train keys."""
    path = tmp_path / "recipe.yaml"
    text = f'model:\n  backbone: "{model}"\ndata:\n  corpus: "{corpus}"\n'
    path.write_text(text + f"train:\n  dev_task: none\n  batch_size: 8\n{extra}", encoding="utf-8")
    return path


def train_finished_run(root: Path, extra: str = "  max_steps: 2\n  eval_every: 2\n") -> Path:
    """In `root`: a tiny model, a 64-line corpus and a recipe with `extra` train keys, trained into `root/run`
    (a checkpoint at its last step); returns `root`. The run fixtures of the resume and hostile-file tests."""
    from csekit.training.trainer import train

    model = root / "tiny-model"
    make_tiny_encoder(root / "tokenizer").save(model)
    recipe = write_recipe(root, model, make_corpus(root / "corpus.txt", lines=64), extra)
    train(load_recipe(recipe), root / "run", show_progress=False)
    return root


def assert_one_line_error(code: int, err: str, *needles: str) -> None:
    """Exit status 2 and one `csekit: error:` line that contains every needle (after any `csekit: warning:` lines
    the run printed before it found the error, e.g. that it has no dev task)."""
    assert code == 2
    lines = [line for line in err.strip().splitlines() if not line.startswith("csekit: warning: ")]
    assert len(lines) == 1 and lines[0].startswith("csekit: error: "), err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


@pytest.fixture
def tiny_combined_recipe(tmp_path: Path, tiny_model_dir: Path) -> Recipe:
    """combined-minilm.yaml on the tiny model, with a made-up corpus and counts; every term active from step 1."""
    corpus = tmp_path / "corpus.jsonl"
    plain = make_corpus(tmp_path / "plain.txt", lines=64).read_text(encoding="utf-8").splitlines()
    with open(corpus, "w", encoding="utf-8") as handle:
        for line in plain:
            row = {"text": line, "paraphrase": " ".join(reversed(line.split())), "negation": f"not {line}"}
            handle.write(json.dumps(row) + "\n")
    counts = tmp_path / "counts.json"
    vocabulary = SentenceEncoder.load(tiny_model_dir).tokenizer.get_vocab()
    common = set(WORDS[::2])  # every other word is frequent, the rest (and the word pieces) rare
    counts.write_text(json.dumps({t: 1000 if t in common else 1 + i % 7 for t, i in vocabulary.items()}), "utf-8")
    recipe = load_recipe(REPO / "recipes" / "combined-minilm.yaml")
    overrides = [
        f"model.backbone={tiny_model_dir}",
        "model.max_length=16",
        "model.head.num_groups=4",  # groups of 8 of the tiny model's 32 channels
        f"data.corpus={corpus}",
        "train.batch_size=16",
        "train.max_steps=3",
        "train.eval_every=0",
        "train.log_every=1",
        "train.dev_task=none",
        "train.precision=fp32",
        "weighting={name: dclr, model: self, phi: 0.9}",
    ]
    objectives = [dict(spec) for spec in recipe.objectives]
    for spec in objectives:
        if "counts" in spec:
            spec.update(counts=str(counts), start_after_epochs=0.0)
        if spec["name"] == "slt_fai_isf":
            spec["min_masked_words"] = 1  # the tiny corpus is short: mask a word in every sentence that has one
    overrides.append(f"objectives={json.dumps(objectives)}")
    return load_recipe(REPO / "recipes" / "combined-minilm.yaml", overrides)

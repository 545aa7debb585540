"""Generated attacks on every reader of a file csekit did not write (issue "Hostile files IV"): a valid file of each
kind, with one value replaced by a hostile one of any type (huge, tiny, non-finite, the wrong type, control
characters, deep nesting), a key added, or its bytes cut or changed. The rule: the reader succeeds, or raises one
line naming the file (the CLI's exit 2); never another exception (a traceback), a hang or a write.

READERS is the table; test_reader_inventory.py reads the source for the calls of the core readers and fails on one
that no entry here (or another test of hostile input) covers, or that is not listed as reading csekit's own files."""

from __future__ import annotations

import json
import math
import signal
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import hostile_examples
from hypothesis import given
from hypothesis import strategies as st
from test_architecture import SRC

from csekit.core.errors import CsekitError

# --- the hostile values --------------------------------------------------------------------------------------

CONTROL_TEXT = st.text(
    alphabet=st.one_of(st.characters(codec="utf-8"), st.sampled_from("\x00\n\r\t\x1b\u2028\ufeff|'\"{}[]:#&*!%@`")),
    max_size=12,
)
HOSTILE_SCALARS = st.one_of(
    st.sampled_from([0, -1, 1, 2, 2**31, -(2**63), 2**64, 10**30, -(10**400), 1e308, -1e-308, 5e-324, -0.0]),
    st.sampled_from([math.nan, math.inf, -math.inf]),
    st.floats(),
    st.integers(),
    CONTROL_TEXT,
    st.sampled_from(["x" * 100_000, "", " ", "true", "null", "1e999", "-", "..", "/", "~"]),
    st.booleans(),
    st.none(),
)
HOSTILE_VALUES = st.recursive(
    HOSTILE_SCALARS,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(CONTROL_TEXT, children, max_size=3),
    max_leaves=6,
)


@dataclass(frozen=True)
class Attack:
    """How a valid file is made hostile: a value replaced or a key added (at the node `path` leads to), the whole
    file replaced by brackets nested `depth` deep, or its bytes cut at `cut` or one changed at `flip`."""

    kind: str
    path: list[int] = field(default_factory=list)
    value: Any = None
    depth: int = 0
    cut: int = 0
    flip: tuple[int, int] = (0, 0)


ATTACKS = st.one_of(
    st.builds(Attack, st.just("value"), st.lists(st.integers(0, 40), max_size=4), HOSTILE_VALUES),
    st.builds(Attack, st.just("key"), st.lists(st.integers(0, 40), max_size=3), HOSTILE_VALUES),
    st.builds(Attack, st.just("nest"), depth=st.sampled_from([2, 50, 1_000, 100_000])),
    st.builds(Attack, st.just("cut"), cut=st.integers(0, 400)),
    st.builds(Attack, st.just("flip"), flip=st.tuples(st.integers(0, 400), st.integers(0, 255))),
)


def _replace(value: Any, path: list[int], new: Callable[[Any], Any]) -> Any:
    """`value` with the node `path` leads to (each step an index into a list or a dict's items) given to `new`."""
    if not path or not isinstance(value, dict | list) or not value:
        return new(value)
    items = list(value.items()) if isinstance(value, dict) else list(enumerate(value))
    key, child = items[path[0] % len(items)]
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[key] = _replace(child, path[1:], new)
    return copy


def _with_key(value: Any, attack: Attack) -> Any:
    """A dict with one more key (an unknown setting, or a known one given a hostile value)."""
    if not isinstance(value, dict):
        return attack.value
    key = str(attack.value)[:20] if not isinstance(attack.value, str) else attack.value
    return {**value, key: attack.value}


# --- the file forms -----------------------------------------------------------------------------------------


def _render(form: str, content: Any) -> bytes:
    if form == "json":
        return json.dumps(content).encode()  # NaN and Infinity as Python writes them
    if form == "yaml":
        return yaml.safe_dump(content, allow_unicode=True, sort_keys=False).encode("utf-8", "surrogatepass")
    if not isinstance(content, list):  # a lines file attacked as a whole: its one line
        return (json.dumps(content) if form == "jsonl" else str(content)).encode("utf-8", "replace") + b"\n"
    if form == "jsonl":
        return "".join(json.dumps(row) + "\n" for row in content).encode()
    delimiter = {"tsv": "\t", "csv": ","}[form]
    rows = (row if isinstance(row, list) else [row] for row in content)
    return "".join(delimiter.join(str(cell) for cell in row) + "\n" for row in rows).encode("utf-8", "replace")


def hostile_bytes(form: str, valid: Any, attack: Attack) -> bytes:
    """The valid content `valid` of a file of `form`, attacked."""
    if attack.kind == "nest":
        return b"[" * attack.depth + b"]" * attack.depth
    if attack.kind in ("value", "key"):
        change = (lambda _: attack.value) if attack.kind == "value" else (lambda node: _with_key(node, attack))
        return _render(form, _replace(valid, attack.path, change))
    data = bytearray(_render(form, valid))
    if attack.kind == "cut":
        return bytes(data[: attack.cut % (len(data) + 1)])
    position, byte = attack.flip
    data[position % len(data)] = byte
    return bytes(data)


# --- the readers --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reader:
    """A reader of `target` (inside a folder also holding `others`, valid), called on the folder."""

    form: str
    target: str
    valid: Any
    read: Callable[[Path], object]
    others: dict[str, str] = field(default_factory=dict)


def _pairs(folder: Path, name: str) -> object:
    from csekit.evaluation.pairs import read_pairs

    return read_pairs(folder / name)


def _retrieval(folder: Path) -> object:
    from csekit.evaluation.retrieval_data import corpus_texts, read_retrieval_set

    retrieval = read_retrieval_set(folder)
    return [texts for texts in corpus_texts(retrieval, 2)]


def _recipe(folder: Path) -> object:
    from csekit.training.recipe import load_recipe

    return load_recipe(folder / "recipe.yaml")


def _suite(folder: Path) -> object:
    from csekit.bench.suite import load_suite

    return load_suite(folder / "suite.yaml")


def _published(folder: Path) -> object:
    from csekit.evaluation.published import load_published

    return load_published(folder / "published.yaml")


def _trainer_state(folder: Path) -> object:
    from csekit.training.run_folder import read_trainer_state

    return read_trainer_state(folder / "trainer_state.json")


def _results(folder: Path) -> object:
    from csekit.bench.results import read_results

    return read_results(folder / "results.json")


def _model_folder(folder: Path) -> object:
    from csekit.encoding.model_folder import check_model_folder, local_model_layout

    return local_model_layout(folder), check_model_folder(folder)


def _st_folder(folder: Path) -> object:
    from csekit.encoding.folder_pooling import read_folder_pooling
    from csekit.encoding.model_folder import local_model_layout

    return local_model_layout(folder), read_folder_pooling(folder)


def _instructions(folder: Path) -> object:
    from csekit.evaluation.instructions import read_instruction_set

    return read_instruction_set(str(folder / "instructions.json"), "STSBenchmark")


def _recipe_rows(folder: Path) -> object:
    from csekit.commands.recipes import recipe_rows

    return recipe_rows(folder, folder / "published.yaml")


def _counts(folder: Path) -> object:
    from csekit.prep.frequency import _read_counts_cached

    return _read_counts_cached(str(folder / "counts.json"), 0.0)


def _training_facts(folder: Path) -> object:
    from csekit.evaluation.mteb_meta import read_training_facts

    return read_training_facts(folder)


VOCABULARY = "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"abcdefghij"]) + "\n"
CONFIG = {
    "model_type": "bert",
    "vocab_size": 60,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "max_position_embeddings": 64,
    "pad_token_id": 0,
    "hidden_act": "gelu",
    "layer_norm_eps": 1e-12,
}
MODULES = [
    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
    {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
]
POOLING = {
    "word_embedding_dimension": 32,
    "pooling_mode_cls_token": False,
    "pooling_mode_mean_tokens": True,
    "pooling_mode_max_tokens": False,
    "pooling_mode_mean_sqrt_len_tokens": False,
    "pooling_mode_weightedmean_tokens": False,
    "pooling_mode_lasttoken": False,
    "include_prompt": True,
}
ST_FILES = {
    "config.json": json.dumps(CONFIG),
    "vocab.txt": VOCABULARY,
    "modules.json": json.dumps(MODULES),
    "1_Pooling/config.json": json.dumps(POOLING),
    "2_Normalize/.keep": "",
    "sentence_bert_config.json": '{"max_seq_length": 64, "do_lower_case": false}',
    "config_sentence_transformers.json": '{"prompts": {}, "default_prompt_name": null, "similarity_fn_name": "cosine"}',
}
MODEL_FILES = {"config.json": json.dumps(CONFIG), "vocab.txt": VOCABULARY}
TRAINING_FACTS = {"base_model": "b", "corpus": "c.txt", "saved_on": "2026-01-01", "dev_task": "stsb-dev", "step": 3}
RECIPE = yaml.safe_load((SRC.parent / "recipes" / "simcse-bert-base.yaml").read_text(encoding="utf-8"))
STATE = {"step": 4, "batches": 4, "best_score": 0.5, "best_step": 2, "skipped_steps": 0, "history": []}
STATE |= {"evaluations_without_improvement": 1, "start_scores": {"stsb-dev": 0.4}, "best_scores": {"stsb-dev": 0.5}}
STATE |= {"selected_on": "stsb-dev"}


def _keys(tree: Any, prefix: str = "") -> list[str]:
    if not isinstance(tree, dict):
        return [prefix]
    return [key for name, value in tree.items() for key in _keys(value, f"{prefix}{name}.") if key] or [prefix]


RECIPE_KEYS = sorted({key.rstrip(".") for key in _keys(RECIPE)} | {"train.lr", "data.views.num_views", "model.pooler"})
"""Every key the shipped SimCSE recipe sets (a part's options included), and a few more, for `--set`."""

READERS: dict[str, Reader] = {
    "pairs .tsv": Reader(
        "tsv",
        "p.tsv",
        [["sentence1", "sentence2", "score"], ["a b", "c d", "3.5"], ["e f", "g", "1"]],
        lambda f: _pairs(f, "p.tsv"),
    ),
    "pairs .csv": Reader(
        "csv",
        "p.csv",
        [["sentence1", "sentence2", "score"], ["a b", "c d", "0.5"], ["e f", "g", "1"]],
        lambda f: _pairs(f, "p.csv"),
    ),
    "pairs .jsonl": Reader(
        "jsonl",
        "p.jsonl",
        [{"sentence1": "a", "sentence2": "b", "score": 1}, {"sentence1": "c", "sentence2": "d", "score": 2.5}],
        lambda f: _pairs(f, "p.jsonl"),
    ),
    "retrieval corpus.jsonl": Reader(
        "jsonl",
        "corpus.jsonl",
        [{"_id": "d1", "title": "t", "text": "a doc"}, {"_id": "d2", "text": "b doc"}],
        _retrieval,
        {"queries.jsonl": '{"_id": "q1", "text": "a"}\n', "qrels/test.tsv": "query-id\tcorpus-id\tscore\nq1\td1\t1\n"},
    ),
    "retrieval queries.jsonl": Reader(
        "jsonl",
        "queries.jsonl",
        [{"_id": "q1", "text": "a query"}],
        _retrieval,
        {"corpus.jsonl": '{"_id": "d1", "text": "a"}\n', "qrels/test.tsv": "query-id\tcorpus-id\tscore\nq1\td1\t1\n"},
    ),
    "retrieval qrels": Reader(
        "tsv",
        "qrels/test.tsv",
        [["query-id", "corpus-id", "score"], ["q1", "d1", "1"], ["q1", "d2", "0"]],
        _retrieval,
        {
            "corpus.jsonl": '{"_id": "d1", "text": "a"}\n{"_id": "d2", "text": "b"}\n',
            "queries.jsonl": '{"_id": "q1", "text": "a"}\n',
        },
    ),
    "recipe": Reader("yaml", "recipe.yaml", RECIPE, _recipe),
    "suite": Reader(
        "yaml",
        "suite.yaml",
        {
            "name": "s",
            "seeds": [1, 2],
            "tasks": "stsb-dev",
            "recipes": [{"recipe": "a.yaml", "name": "a"}, {"recipe": "a.yaml", "name": "b", "set": ["train.lr=1e-5"]}],
            "baseline": "a",
        },
        _suite,
        {"a.yaml": "name: a\n"},
    ),
    "published numbers": Reader(
        "yaml",
        "published.yaml",
        {
            "simcse": {"source": "a paper", "scores": {"STS12": 68.4, "STS Avg.": 76.25}, "note": "n"},
            "other": {"reason": "none"},
        },
        _published,
    ),
    "checkpoint trainer_state.json": Reader("json", "trainer_state.json", STATE, _trainer_state),
    "bench results.json": Reader(
        "json",
        "results.json",
        {
            "tasks": {"stsb-dev": 0.8, "align": {"align": 0.3, "uniform": -2.0}},
            "averages": {},
            "wall_seconds": {"train": 1, "evaluate": 2},
        },
        _results,
    ),
    "model config.json": Reader("json", "config.json", CONFIG, _model_folder, {"vocab.txt": VOCABULARY}),
    "tokenizer_config.json": Reader(
        "json",
        "tokenizer_config.json",
        {"model_max_length": 64, "do_lower_case": True},
        _model_folder,
        MODEL_FILES,
    ),
    "weights index": Reader(
        "json",
        "model.safetensors.index.json",
        {"metadata": {"total_size": 8}, "weight_map": {"embeddings.weight": "model-00001-of-00001.safetensors"}},
        _model_folder,
        {**MODEL_FILES, "model-00001-of-00001.safetensors": "\x13" + "\x00" * 7 + '{"__metadata__":{}}'},  # no tensor
    ),
    "csekit.json": Reader(
        "json",
        "csekit.json",
        {"pooler": "cls", "templates": None, "normalize": False, "training": {"step": 3}},
        _model_folder,
        MODEL_FILES,
    ),
    "csekit.json representation": Reader(
        "json",
        "csekit.json",
        {
            "csekit_version": "0",
            "representation": {
                "pooler": "mask",
                "templates": ["a [X] means [MASK] ."],
                "demonstration": None,
                "normalize": False,
                "sentence_end": "sncse",
                "test_template": "the [X] is [MASK]",
                "head": None,
            },
        },
        _model_folder,
        MODEL_FILES,
    ),
    "csekit.json training facts": Reader(
        "json",
        "csekit.json",
        {"pooler": "cls", "training": TRAINING_FACTS},
        _training_facts,
        MODEL_FILES,
    ),
    "sentence-transformers modules.json": Reader(
        "json", "modules.json", MODULES, _st_folder, {k: v for k, v in ST_FILES.items() if k != "modules.json"}
    ),
    "sentence-transformers Pooling config": Reader(
        "json",
        "1_Pooling/config.json",
        POOLING,
        _st_folder,
        {k: v for k, v in ST_FILES.items() if k != "1_Pooling/config.json"},
    ),
    "sentence-transformers config": Reader(
        "json",
        "config_sentence_transformers.json",
        {"prompts": {"query": "q: "}, "default_prompt_name": None, "similarity_fn_name": "cosine"},
        _st_folder,
        {k: v for k, v in ST_FILES.items() if k != "config_sentence_transformers.json"},
    ),
    "sentence-transformers Transformer config": Reader(
        "json",
        "sentence_bert_config.json",
        {"max_seq_length": 64, "do_lower_case": False},
        _st_folder,
        {k: v for k, v in ST_FILES.items() if k != "sentence_bert_config.json"},
    ),
    "peft adapter_config.json": Reader(
        "json",
        "adapter_config.json",
        {"peft_type": "LORA", "r": 8, "target_modules": ["query"]},
        _model_folder,
        MODEL_FILES,
    ),
    "freq counts": Reader("json", "counts.json", {"the": 3, "a": 1}, _counts),
    "mteb instruction set": Reader(
        "json", "instructions.json", {"STSBenchmark": "Retrieve semantically similar text."}, _instructions
    ),
    "csekit recipes' list": Reader(
        "yaml",
        "simcse-bert-base.yaml",
        {"model": {"backbone": "bert-base-uncased"}},
        _recipe_rows,
        {"published.yaml": "simcse: {source: a paper, scores: {STS Avg.: 76.25}}\n"},
    ),
}


def _snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.lstat().st_size, p.lstat().st_mtime_ns) for p in folder.rglob("*")}


@contextmanager
def _no_hang(seconds: int) -> Iterator[None]:
    """Fail (TimeoutError) when the block runs longer than `seconds`: a reader must not hang on any input."""

    def expire(*_: object) -> None:
        raise TimeoutError(f"the reader ran longer than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def assert_read_or_one_line(reader: Reader, data: bytes) -> None:
    """The rule, for one reader on one hostile file."""
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        for relative, text in reader.others.items():
            (folder / relative).parent.mkdir(parents=True, exist_ok=True)
            (folder / relative).write_text(text, encoding="utf-8")
        target = folder / reader.target
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        before = _snapshot(folder)
        try:
            with _no_hang(30):
                reader.read(folder)
        except CsekitError as error:
            message = str(error)
            assert "\n" not in message and "\r" not in message, message
            assert str(folder) in message or target.name in message, message
        assert _snapshot(folder) == before, "the reader wrote into the folder"


@pytest.mark.parametrize("name", sorted(READERS))
@hostile_examples(12)
@given(attack=ATTACKS)
def test_a_hostile_file_is_read_or_one_line_naming_it(name: str, attack: Attack) -> None:
    reader = READERS[name]
    assert_read_or_one_line(reader, hostile_bytes(reader.form, reader.valid, attack))


@pytest.mark.parametrize("name", sorted(READERS))
def test_each_readers_valid_file_is_read(name: str) -> None:
    """The attacks start from a file the reader accepts (else every attack would only test the first check)."""
    reader = READERS[name]
    with tempfile.TemporaryDirectory() as folder:
        for relative, text in {**reader.others, reader.target: _render(reader.form, reader.valid).decode()}.items():
            (Path(folder) / relative).parent.mkdir(parents=True, exist_ok=True)
            (Path(folder) / relative).write_text(text, encoding="utf-8")
        if name == "peft adapter_config.json":
            with pytest.raises(CsekitError, match="adapter"):  # any adapter file is refused: csekit cannot honour it
                reader.read(Path(folder))
        else:
            reader.read(Path(folder))


# --- `--set`: hostile values for every key of the schema -------------------------------------------------------


@hostile_examples(12)
@given(st.data())
def test_any_set_value_for_any_recipe_key_loads_or_is_one_line(data: st.DataObject) -> None:
    from csekit.training.recipe import load_recipe

    key = data.draw(st.sampled_from(RECIPE_KEYS))
    value = data.draw(HOSTILE_VALUES)
    text = data.draw(st.one_of(st.just(json.dumps(value)), CONTROL_TEXT, st.just("[" * 5_000)))
    try:
        with _no_hang(30):
            load_recipe(None, [f"{key}={text}"])
    except CsekitError as error:
        assert "\n" not in str(error) and (key in str(error) or "--set" in str(error)), str(error)


def test_hostile_values_include_the_named_kinds() -> None:
    """The generator draws each kind the issue names (a strategy that lost one would test less silently)."""
    kinds = {
        "huge": lambda v: (isinstance(v, int) and abs(v) > 2**63) or (isinstance(v, str) and len(v) >= 100_000),
        "non-finite": lambda v: isinstance(v, float) and not math.isfinite(v),
        "control": lambda v: isinstance(v, str) and any(not c.isprintable() for c in v),
    }
    seen = set()

    @hostile_examples(120)
    @given(HOSTILE_SCALARS)  # the leaves of every hostile value
    def draw(value: Any) -> None:
        seen.update(kind for kind, test in kinds.items() if test(value))

    draw()
    assert seen == set(kinds)


@hostile_examples(30)
@given(CONTROL_TEXT)
def test_an_error_message_is_one_line_by_construction(value: str) -> None:
    """A value quoted into a message (a `--set` text with a line break gave a two-line error) is escaped there."""
    from csekit.core.errors import message_line

    error = CsekitError(f"--set model.pooler: unknown pooler {value!s}")
    assert len(str(error).splitlines()) == 1 and str(error) == message_line(error)
    qualified = f"{CsekitError.__module__}.{CsekitError.__qualname__}"
    worker = CsekitError(f"Caught CsekitError in DataLoader worker process 0.\nTraceback:\n  x\n{qualified}: a b")
    assert str(worker) == "a b"  # PyTorch's re-raise of a worker's error: its own message, as before


def test_a_name_too_long_for_the_file_system_is_one_line() -> None:
    """Found by `make test-hostile`: a suite's recipe path of 300 characters made Path.exists raise ENAMETOOLONG
    (an OSError traceback); it does not exist, and the line says so."""
    suite = READERS["suite"]
    assert_read_or_one_line(suite, _render("yaml", {**suite.valid, "recipes": [{"recipe": "x" * 300}]}))


@pytest.mark.parametrize("item", ["objectives.0=true", "objectives=[1, 2]", "negatives=[true]", "run=true"])
def test_a_set_value_omegaconf_cannot_place_names_the_set_key(item: str) -> None:
    """Found by `make test-hostile`: OmegaConf gave no key, and the line said `recipe: recipe key : ...`."""
    from csekit.training.recipe import load_recipe

    with pytest.raises(CsekitError, match=rf"^--set {item.split('=')[0]}: ") as error:
        load_recipe(None, [item])
    assert "\n" not in str(error.value)


def test_a_module_path_too_long_for_the_file_system_is_one_line() -> None:
    """Found by `make test-hostile`: a modules.json path of 300 characters made Path.exists raise ENAMETOOLONG;
    core/safe_names.check_name refuses a name no file system holds, for every name read from a file."""
    reader = READERS["sentence-transformers modules.json"]
    assert_read_or_one_line(reader, hostile_bytes("json", reader.valid, Attack("value", [0, 2], "x" * 300)))


@pytest.mark.parametrize("command", [["evaluate", "LONG"], ["diagnose", "LONG"]])
def test_a_path_too_long_for_the_os_is_one_line_exit_2(
    command: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """`csekit evaluate NAME` with a name of 300 characters: Path.exists raised ENAMETOOLONG, a traceback; the CLI's
    one exit point turns that OSError into one line (exit 2), whichever command looked at the path first."""
    from conftest import assert_one_line_error, run_main

    monkeypatch.chdir(tmp_path)
    code, err = run_main(monkeypatch, capsys, *[arg.replace("LONG", "x" * 300) for arg in command])
    assert_one_line_error(code, err, "x" * 80)


def test_a_name_of_lone_surrogates_is_measured_not_a_traceback() -> None:
    """YAML reads "\\ud800\\udc00" as two lone surrogates, which os.fsencode cannot encode: the length check measures
    them as their 3 bytes each."""
    from csekit.core.safe_names import check_name

    check_name("\ud800\udc00", "a name")
    with pytest.raises(CsekitError, match="a name of 300 bytes"):
        check_name("\ud800" * 100, "a name")

"""The test-time representation is one value (`csekit.encoding.representation`): written whole as csekit.json's
"representation" object, read back equal; every bad value refused in one line naming csekit.json and the key; the
flat keys older csekit wrote read into the same value; both layouts at once refused; and no other module of csekit
reads those keys itself."""

from __future__ import annotations

import ast
import json
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import make_tiny_encoder
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_architecture import SRC

from csekit.core.errors import CsekitError
from csekit.encoding.encoder import SentenceEncoder
from csekit.encoding.kept_head import DenseTanh
from csekit.encoding.model_folder import local_model_layout
from csekit.encoding.prompteol import Demonstration
from csekit.encoding.representation import (
    CONFIG_KEYS,
    REPRESENTATION_KEY,
    KeptHead,
    Reading,
    Representation,
    read_csekit_meta,
)
from csekit.encoding.sentence_end import SENTENCE_ENDS

WORDS = st.text(alphabet="abcdefghij .,'?!:", min_size=1, max_size=12)
TEMPLATES = st.builds(lambda a, b, c: f"{a}[X]{b}[MASK]{c}", WORDS, WORDS, WORDS)
DEMONSTRATIONS = st.builds(Demonstration, WORDS.filter(str.strip), WORDS.filter(str.strip))
HEADS = st.builds(KeptHead, st.integers(1, 4096), st.sampled_from(["2_Dense", "3_Dense", "head", "a/b"]))
SENTENCES = ["a man plays the guitar", "the dog runs?", 'she said "no"']


@st.composite
def representations(draw: st.DrawFn) -> Representation:
    """Any valid representation: a prompt pooler with templates and maybe a test template, prompteol with maybe a
    demonstration, or another pooler; any rule, normalisation and kept head."""
    pooler = draw(st.sampled_from(["cls", "mean", "max", "mask", "prompteol", "last_token", None]))
    prompt = pooler == "mask"
    return Representation(
        pooler=pooler,
        templates=tuple(draw(st.lists(TEMPLATES, min_size=1, max_size=3))) if prompt else None,
        demonstration=draw(st.none() | DEMONSTRATIONS) if pooler == "prompteol" else None,
        normalize=draw(st.booleans()),
        sentence_end=draw(st.sampled_from(sorted(SENTENCE_ENDS))),
        test_template=draw(TEMPLATES) if prompt and draw(st.booleans()) else "none",
        head=draw(st.none() | HEADS),
    )


def old_layout(representation: Representation) -> dict[str, Any]:
    """csekit.json as csekit wrote it before the representation was one object: flat keys, defaults left out."""
    written = representation.as_json()
    meta: dict[str, Any] = {"csekit_version": "0.9", "pooler": written["pooler"]}
    defaults = Representation().as_json()
    meta |= {key: value for key, value in written.items() if key != "pooler" and value != defaults[key]}
    return meta


def where(key: str, nested: bool) -> str:
    return f'csekit.json: "{REPRESENTATION_KEY}.{key}"' if nested else f'csekit.json: "{key}"'


# --- one value, read back equal ---------------------------------------------------------------------------------


@given(representations())
def test_as_json_reads_back_equal_in_either_layout(representation: Representation) -> None:
    text = json.loads(json.dumps({"csekit_version": "1", REPRESENTATION_KEY: representation.as_json()}))
    assert read_csekit_meta(text, "csekit.json") == representation
    assert Representation.from_json(representation.as_json(), str) == representation
    assert read_csekit_meta(json.loads(json.dumps(old_layout(representation))), "csekit.json") == representation
    assert set(representation.as_json()) == set(CONFIG_KEYS)  # every setting written, as sentence-transformers does


@st.composite
def savable(draw: st.DrawFn) -> tuple[Representation, bool]:
    """A representation a tiny BERT can be saved with (the head's folder is the export's to name), and whether a head
    is kept."""
    value = draw(representations().filter(lambda r: r.pooler in ("cls", "mean", "max", "mask")))
    return replace(value, head=None), draw(st.booleans())


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(savable())
def test_a_saved_representation_is_read_back_by_the_folder_reader_and_encodes_the_same(
    tiny_encoder: SentenceEncoder, case: tuple[Representation, bool]
) -> None:
    wanted, kept_head = case
    encoder = tiny_encoder.with_representation(wanted)
    if kept_head:
        encoder = encoder.with_head(DenseTanh(encoder.dim, 0.2))
    with tempfile.TemporaryDirectory() as folder:
        encoder.save(folder)
        meta = json.loads((Path(folder) / "csekit.json").read_text(encoding="utf-8"))
        assert set(meta) == {"csekit_version", REPRESENTATION_KEY}  # one object, no flat key
        read = local_model_layout(Path(folder)).representation
        assert replace(read, head=None) == wanted == replace(encoder.representation, head=None)
        assert (read.head is not None) == kept_head
        if read.head is not None:
            assert read.head.dim == encoder.dim and (Path(folder) / str(read.head.path) / "model.safetensors").is_file()
        loaded = SentenceEncoder.load(folder)
        assert loaded.representation == read
        np.testing.assert_allclose(loaded.encode(SENTENCES), encoder.encode(SENTENCES), rtol=0, atol=1e-6)


def test_a_folder_in_the_old_flat_layout_loads_as_the_new_one(tmp_path: Path) -> None:
    encoder = make_tiny_encoder(tmp_path / "tok", pooler="mask", initializer_range=0.2)
    encoder = encoder.with_representation(sentence_end="sncse", test_template="the [X] is [MASK] .")
    encoder = encoder.with_head(DenseTanh(encoder.dim, 0.2))
    encoder.save(tmp_path / "new")
    encoder.save(tmp_path / "old")
    meta = tmp_path / "old" / "csekit.json"
    saved = json.loads(meta.read_text(encoding="utf-8"))
    flat = old_layout(read_csekit_meta(saved, meta))
    assert {"pooler", "templates", "sentence_end", "test_template", "head"} <= set(flat)
    meta.write_text(json.dumps(flat), encoding="utf-8")
    new, old = SentenceEncoder.load(tmp_path / "new"), SentenceEncoder.load(tmp_path / "old")
    assert old.representation == new.representation and old.head is not None
    assert old.representation.sentence_end == "sncse"
    np.testing.assert_array_equal(old.encode(SENTENCES), new.encode(SENTENCES))
    np.testing.assert_allclose(new.encode(SENTENCES), encoder.encode(SENTENCES), rtol=0, atol=1e-6)


def test_both_layouts_in_one_file_are_refused_in_one_line() -> None:
    meta = {REPRESENTATION_KEY: Representation("cls").as_json(), "pooler": "cls", "sentence_end": "none"}
    with pytest.raises(CsekitError, match=r'^csekit.json: holds both a "representation" object and the older flat ke'):
        read_csekit_meta(meta, "csekit.json")
    with pytest.raises(CsekitError) as error:
        read_csekit_meta(meta, "csekit.json")
    assert "\n" not in str(error.value) and "pooler, sentence_end" in str(error.value)


# --- every bad value: one line naming the file and the key ------------------------------------------------------

BAD = [
    ("pooler", ["cls"], "must be a pooler's name"),
    ("pooler", 3, "must be a pooler's name"),
    ("templates", 3, "must be a list of strings"),
    ("templates", [1], "must be a list of strings"),
    ("templates", [], "at least one prompt template"),
    ("templates", ["no slot here"], "needs exactly one"),
    ("demonstration", {"sentence": "a"}, "must be {sentence: ..., word: ...}"),
    ("demonstration", {"sentence": 'a "q"', "word": "w"}, "double quote"),
    ("normalize", "yes", "must be true or false"),
    ("normalize", None, "must be true or false"),
    ("sentence_end", "period", "must be one of none, promptbert"),
    ("sentence_end", None, "must be one of none, promptbert"),
    ("test_template", "[MASK] before [X]", "is not a prompt template"),
    ("test_template", 3, "must be none or a prompt template"),
    ("head", [1], 'must give the head\'s "dim" and "path"'),
    ("head", {"dim": 32}, 'must give the head\'s "dim" and "path"'),
    ("head", {"dim": "32", "path": "x"}, '"dim" must be a whole number'),
    ("head", {"dim": 0, "path": "x"}, '"dim" must be a whole number'),
    ("head", {"dim": 32, "path": ""}, '"path" must name the head\'s folder'),
]


@pytest.mark.parametrize("nested", [True, False], ids=["representation", "flat"])
@pytest.mark.parametrize(("key", "value", "needle"), BAD, ids=[f"{k}-{i}" for i, (k, _, _) in enumerate(BAD)])
def test_each_bad_value_is_one_line_naming_csekit_json_and_the_key(
    key: str, value: object, needle: str, nested: bool
) -> None:
    values = {**Representation("prompteol" if key == "demonstration" else "mask").as_json(), key: value}
    meta = {REPRESENTATION_KEY: values} if nested else values
    with pytest.raises(CsekitError) as error:
        read_csekit_meta(meta, "csekit.json")
    message = str(error.value)
    assert message.startswith(where(key, nested)) and needle in message and "\n" not in message


def test_a_demonstration_for_another_pooler_and_unknown_keys_are_refused() -> None:
    demonstration = {"sentence": "A man is smoking.", "word": "Smoking"}
    values = {**Representation("mean").as_json(), "demonstration": demonstration}
    with pytest.raises(CsekitError, match=r'^csekit.json: "representation.demonstration" is for the prompteol pooler'):
        read_csekit_meta({REPRESENTATION_KEY: values}, "csekit.json")
    with pytest.raises(CsekitError, match=r'^csekit.json: "representation" has \'pool\', none of its keys'):
        read_csekit_meta({REPRESENTATION_KEY: {"pool": "cls"}}, "csekit.json")
    with pytest.raises(CsekitError, match=r'^csekit.json: "representation" must be an object, found a list'):
        read_csekit_meta({REPRESENTATION_KEY: ["cls"]}, "csekit.json")


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 5000) | st.text(max_size=20) | st.sampled_from(["[X] [MASK]", "sncse"]),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.sampled_from(["dim", "path", "x"]), children),
    max_leaves=5,
)


@given(st.sampled_from(CONFIG_KEYS), JSON_VALUES, st.booleans(), representations())
def test_any_value_of_any_key_is_read_back_equal_or_one_line_naming_the_key(
    key: str, value: object, nested: bool, base: Representation
) -> None:
    values = {**base.as_json(), key: value}
    try:
        read = read_csekit_meta({REPRESENTATION_KEY: values} if nested else values, "csekit.json")
    except CsekitError as error:
        message = str(error)
        assert "\n" not in message and message.startswith("csekit.json: ")
        assert any(message.startswith(where(name, nested)) for name in CONFIG_KEYS)
        return
    assert Representation.from_json(read.as_json(), str) == read


# --- the encoder holds it and passes it whole -----------------------------------------------------------------


def test_views_share_the_pooler_while_the_representation_keeps_it(tiny_encoder: SentenceEncoder) -> None:
    written = tiny_encoder.with_representation(sentence_end="sncse")
    assert written.pooler is tiny_encoder.pooler and written.representation.sentence_end == "sncse"
    assert tiny_encoder.representation == Representation("cls")  # a view leaves the original unchanged
    masked = tiny_encoder.with_representation(pooler="mask", templates=("the [X] is [MASK] .",))
    assert masked.pooler is not tiny_encoder.pooler and masked.pooler.templates == ("the [X] is [MASK] .",)
    with pytest.raises(CsekitError, match="no head to apply at test time"):
        tiny_encoder.with_representation(head=KeptHead(tiny_encoder.dim, "2_Dense"))
    with pytest.raises(CsekitError, match="a test template is for the prompt poolers"):
        tiny_encoder.with_representation(test_template="the [X] is [MASK]")
    headed = tiny_encoder.with_head(DenseTanh(tiny_encoder.dim))
    assert headed.representation.head == KeptHead(tiny_encoder.dim)
    assert headed.with_representation(sentence_end="sncse").head is headed.head


def test_a_reading_overrides_what_the_folder_saved(tmp_path: Path) -> None:
    encoder = make_tiny_encoder(tmp_path / "tok", pooler="mask").with_representation(sentence_end="promptbert")
    encoder.save(tmp_path / "model")
    loaded = SentenceEncoder.load(tmp_path / "model", reading=Reading(sentence_end="sncse"))
    assert loaded.representation == replace(encoder.representation, sentence_end="sncse")
    with pytest.raises(CsekitError, match="Reading: sentence_end must be one of"):
        Reading(sentence_end="period")


# --- the rule's guard -----------------------------------------------------------------------------------------

KEYS = {"sentence_end", "test_template", "demonstration", "templates"}
HOME = "csekit/encoding/representation.py"
OTHER_FILES = {"csekit/bench/papers.py": "reads results.json's protocol facts (written by Representation.report_facts)"}
"""Modules that name one of KEYS as a string for a file other than csekit.json."""


def test_only_the_representations_home_reads_the_csekit_json_keys() -> None:
    """csekit.json's representation keys are named as strings in one module: every other reads the value whole."""
    found = set()
    for path in sorted(SRC.rglob("*.py")):
        module = path.relative_to(SRC).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and node.value in KEYS and module not in (HOME, *OTHER_FILES):
                found.add(f"{module}:{node.lineno} {node.value!r}")
    assert not found, f"csekit.json's representation keys read outside {HOME}: {sorted(found)}"

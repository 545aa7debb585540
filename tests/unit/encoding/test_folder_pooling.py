"""A sentence-transformers folder's own representation (issue 61 item 3, issue 64's rule): `model.pooler: auto`, and a
load that names no pooler, encode what `SentenceTransformer(folder).encode` gives, Normalize included, and save it so;
every Pooling setting read is honoured or refused in one line, never ignored (a max-pooling folder was mean-pooled)."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import TinyTrainer, assert_one_line_error, make_corpus, make_tiny_encoder, run_main, tiny_recipe
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from csekit.core.errors import CsekitError
from csekit.encoding.encoder import SentenceEncoder
from csekit.encoding.folder_pooling import (
    MODE_FLAGS,
    POOLER_OF_MODE,
    POOLING_KEYS,
    FolderPooling,
    read_folder_pooling,
)
from csekit.training.model import load_encoder
from csekit.training.recipe import load_recipe

sentence_transformers = pytest.importorskip("sentence_transformers")
try:
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
except ImportError:  # sentence-transformers < 6
    from sentence_transformers.models import Pooling, Transformer
try:
    from sentence_transformers.base.modules import Normalize
except ImportError:  # sentence-transformers < 6
    from sentence_transformers.models import Normalize

SENTENCES = [
    "a man plays the guitar",
    "the dog runs in the park with a red ball and a small cat",
    "she eats",
    "they are playing music quickly",
    "a",
]
WIDTH = 32
CaptureErr = pytest.CaptureFixture[str]


def sentence_transformers_folder(root: Path, mode: str, normalize: bool, seed: int = 0) -> Path:
    """A tiny BERT saved by sentence-transformers itself: Transformer, Pooling(`mode`), and Normalize if asked."""
    encoder = make_tiny_encoder(root / "tokenizer", seed=seed, initializer_range=0.2)
    encoder.backbone.save_pretrained(root / "hf")
    encoder.tokenizer.save_pretrained(root / "hf")
    modules = [Transformer(str(root / "hf"), max_seq_length=64), Pooling(WIDTH, pooling_mode=mode)]
    if normalize:
        modules.append(Normalize())
    folder = root / f"st-{mode}{'-normalized' if normalize else ''}"
    sentence_transformers.SentenceTransformer(modules=modules, device="cpu").save(str(folder))
    return folder


def st_embeddings(folder: Path) -> np.ndarray:
    return sentence_transformers.SentenceTransformer(str(folder), device="cpu").encode(SENTENCES)


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, bool], Path]:
    root = tmp_path_factory.mktemp("st")
    cases = [(mode, normalize) for mode in ("mean", "max", "cls") for normalize in (False, True)]
    cases += [("mean_sqrt_len_tokens", False), ("weightedmean", True)]
    return {case: sentence_transformers_folder(root / f"{case[0]}-{case[1]}", *case) for case in cases}


def private_copy(folder: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(folder, tmp_path / folder.name))


def _set_modules(folder: Path, modules: Any) -> None:
    (folder / "modules.json").write_text(json.dumps(modules), encoding="utf-8")


def _modules(folder: Path) -> list[dict[str, Any]]:
    return json.loads((folder / "modules.json").read_text(encoding="utf-8"))


def _set_pooling(folder: Path, config: Any) -> None:
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(config), encoding="utf-8")


ST_SETTINGS = "config_sentence_transformers.json"
"""The folder's sentence-transformers settings (prompts, similarity, model type, truncation)."""


def _st_settings(text: str) -> Callable[[Path], int]:
    """A damage for REFUSALS: `text` as the folder's sentence-transformers settings file."""
    return lambda folder: (folder / ST_SETTINGS).write_text(text, "utf-8")


def _with_module(folder: Path, kind: str) -> None:
    entry = {"idx": 3, "name": "3", "path": f"3_{kind}", "type": f"sentence_transformers.models.{kind}"}
    _set_modules(folder, [*_modules(folder), entry])


# --- auto encodes exactly as sentence-transformers ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "normalize"),
    [("mean", False), ("mean", True), ("max", False), ("max", True), ("cls", False), ("cls", True),
     ("mean_sqrt_len_tokens", False), ("weightedmean", True)],
)  # fmt: skip
def test_a_recipe_with_pooler_auto_encodes_as_sentence_transformers(
    folders: dict[tuple[str, bool], Path], tmp_path: Path, mode: str, normalize: bool
) -> None:
    folder = folders[mode, normalize]
    recipe = tiny_recipe(folder, make_corpus(tmp_path / "corpus.txt", lines=8), "model.pooler=auto")
    encoder = load_encoder(recipe)
    assert (encoder.pooler.name, encoder.pooler.normalized) == (POOLER_OF_MODE[mode], normalize)
    ours, theirs = encoder.encode(SENTENCES), st_embeddings(folder)
    assert np.abs(ours - theirs).max() <= 2e-6
    if normalize:
        np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-6)


def _as_flags(folder: Path, mode: str) -> None:
    """The folder's Pooling config in the flags sentence-transformers before 6 wrote (and csekit writes)."""
    _set_pooling(folder, {"word_embedding_dimension": WIDTH, **{flag: mode == m for flag, m in MODE_FLAGS.items()}})


@pytest.mark.parametrize("flags", [False, True], ids=["pooling_mode", "flags"])
@pytest.mark.parametrize("mode", ["max", "cls", "mean_sqrt_len_tokens"])
def test_a_folder_loaded_without_a_pooler_is_read_with_its_own_pooling_not_mean(
    folders: dict[tuple[str, bool], Path], tmp_path: Path, mode: str, flags: bool
) -> None:
    """The defect: a Pooling config that said max (or mean_sqrt_len_tokens) was read as mean when written as flags,
    as cls when written as sentence-transformers 6's `pooling_mode`, silently."""
    folder = private_copy(folders[mode, False], tmp_path)
    if flags:
        _as_flags(folder, mode)
    encoder = SentenceEncoder.load(folder)
    assert encoder.pooler.name == POOLER_OF_MODE[mode]
    assert np.abs(encoder.encode(SENTENCES) - st_embeddings(folder)).max() <= 2e-6


def test_an_explicit_pooler_reads_the_transformer_alone(folders: dict[tuple[str, bool], Path]) -> None:
    encoder = SentenceEncoder.load(folders["max", True], pooler="mean")
    assert (encoder.pooler.name, encoder.pooler.normalized) == ("mean", False)


def test_the_model_trained_with_pooler_auto_loads_in_sentence_transformers_as_csekit_encodes_it(
    folders: dict[tuple[str, bool], Path], train_tiny: TinyTrainer
) -> None:
    saved = train_tiny("model.pooler=auto", steps=2, lines=32, model=folders["mean", True]).folder / "last"
    modules = json.loads((saved / "modules.json").read_text(encoding="utf-8"))
    assert [module["type"].rsplit(".", 1)[-1] for module in modules] == ["Transformer", "Pooling", "Normalize"]
    assert json.loads((saved / "csekit.json").read_text(encoding="utf-8"))["representation"]["normalize"] is True
    reloaded = SentenceEncoder.load(saved)
    assert (reloaded.pooler.name, reloaded.pooler.normalized) == ("mean", True)
    ours = reloaded.encode(SENTENCES)
    assert np.abs(ours - st_embeddings(saved)).max() <= 2e-6
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-6)
    assert np.abs(ours - st_embeddings(folders["mean", True])).max() > 1e-4  # it trained


@pytest.mark.parametrize("pooler", ["max", "mean_sqrt_len"])
def test_the_new_poolers_export_to_sentence_transformers(tmp_path: Path, pooler: str) -> None:
    encoder = make_tiny_encoder(tmp_path / "tokenizer", pooler=pooler, initializer_range=0.2)
    encoder.save(tmp_path / "model")
    assert np.abs(encoder.encode(SENTENCES) - st_embeddings(tmp_path / "model")).max() <= 2e-6
    assert SentenceEncoder.load(tmp_path / "model").pooler.name == pooler


# --- what cannot be read is refused in one line -----------------------------------------------------------------


def test_auto_on_a_plain_transformers_folder_asks_for_a_pooler(tmp_path: Path) -> None:
    encoder = make_tiny_encoder(tmp_path / "tokenizer")
    encoder.backbone.save_pretrained(tmp_path / "hf")
    encoder.tokenizer.save_pretrained(tmp_path / "hf")
    assert SentenceEncoder.load(tmp_path / "hf").pooler.name == "cls"  # no pooler named: cls, as before
    with pytest.raises(CsekitError, match=r"plain transformers model .*choose a pooler") as error:
        SentenceEncoder.load(tmp_path / "hf", "auto")
    assert str(tmp_path / "hf") in str(error.value)


def test_auto_on_a_hub_name_is_refused_before_anything_is_downloaded(monkeypatch: pytest.MonkeyPatch) -> None:
    import csekit.encoding.encoder as encoder_module

    def no_load(*args: object, **kwargs: object) -> None:
        raise AssertionError("load_model was called")

    monkeypatch.setattr(encoder_module, "load_model", no_load)
    with pytest.raises(CsekitError, match=r'"bert-base-uncased": pooler auto .*hub name.*choose a pooler'):
        SentenceEncoder.load("bert-base-uncased", "auto")


REFUSALS: dict[str, tuple[Any, str, str]] = {
    "modules.json not JSON": (lambda f: (f / "modules.json").write_text("[{", "utf-8"), "modules.json", "not valid"),
    "modules.json oversized": (
        lambda f: (f / "modules.json").write_text(" " * 2**21 + "[]", "utf-8"),
        "modules.json",
        "more than the",
    ),
    "modules.json an object": (lambda f: _set_modules(f, {"0": "Transformer"}), "modules.json", "a list of modules"),
    "no Pooling module": (lambda f: _set_modules(f, _modules(f)[:1]), "modules.json", "the modules Transformer"),
    "a Dense module": (lambda f: _with_module(f, "Dense"), "modules.json", "a Dense module"),
    "an unknown module": (lambda f: _with_module(f, "Whatever"), "modules.json", "a Whatever module"),
    "another library's module": (
        lambda f: _set_modules(f, [*_modules(f)[:2], {"path": "", "type": "evil.Normalize"}]),
        "modules.json",
        '"type" must name a sentence-transformers module',
    ),
    "module keyword arguments": (
        lambda f: _set_modules(f, [{**_modules(f)[0], "kwargs": ["task"]}, *_modules(f)[1:]]),
        "modules.json",
        '"kwargs"',
    ),
    "an unknown module key": (
        lambda f: _set_modules(f, [{**_modules(f)[0], "device": "cuda"}, *_modules(f)[1:]]),
        "modules.json",
        "'device'",
    ),
    "Pooling config missing": (lambda f: (f / "1_Pooling" / "config.json").unlink(), "config.json", "does not exist"),
    "Pooling config not JSON": (
        lambda f: (f / "1_Pooling" / "config.json").write_text("{", "utf-8"),
        "config.json",
        "not valid JSON",
    ),
    "Pooling config oversized": (
        lambda f: (f / "1_Pooling" / "config.json").write_text(" " * 2**17 + "{}", "utf-8"),
        "config.json",
        "more than the",
    ),
    "Pooling config a list": (lambda f: _set_pooling(f, ["max"]), "config.json", "expected a JSON object"),
    "two modes at once": (
        lambda f: _set_pooling(f, {"embedding_dimension": WIDTH, "pooling_mode": ["mean", "max"]}),
        "config.json",
        "2 pooling modes at once",
    ),
    "two mode flags": (
        lambda f: _set_pooling(f, {"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": True}),
        "config.json",
        "2 pooling modes at once",
    ),
    "an unknown Pooling key": (
        lambda f: _set_pooling(f, {"embedding_dimension": WIDTH, "pooling_mode": "mean", "pooling_temperature": 2}),
        "config.json",
        "'pooling_temperature' is no Pooling setting",
    ),
    "a flag that is no boolean": (
        lambda f: _set_pooling(f, {"pooling_mode_max_tokens": 1}),
        "config.json",
        '"pooling_mode_max_tokens" must be true or false',
    ),
    "an unknown mode": (lambda f: _set_pooling(f, {"pooling_mode": "median"}), "config.json", "'median'"),
    "mode and flags disagree": (
        lambda f: _set_pooling(f, {"pooling_mode": "mean", "pooling_mode_max_tokens": True}),
        "config.json",
        "the mode flags say ['max']",
    ),
    "another width": (
        lambda f: _set_pooling(f, {"embedding_dimension": 384, "pooling_mode": "mean"}),
        "config.json",
        "width is 384, the model's is 32",
    ),
    "a Normalize that does something else": (
        lambda f: (
            (f / "2_Normalize").mkdir(exist_ok=True),
            (f / "2_Normalize" / "config.json").write_text('{"module_input_name": "token_embeddings"}', "utf-8"),
        ),
        "2_Normalize/config.json",
        "anything but normalise the sentence embedding",
    ),
    "a default prompt": (_st_settings('{"default_prompt_name": "query"}'), ST_SETTINGS, "default_prompt_name"),
    "a dot-product similarity": (_st_settings('{"similarity_fn_name": "dot"}'), ST_SETTINGS, "similarity_fn_name"),
    "a sparse model": (_st_settings('{"model_type": "SparseEncoder"}'), ST_SETTINGS, "model_type"),
    "a truncated embedding": (_st_settings('{"truncate_dim": 64}'), ST_SETTINGS, "truncate_dim"),
    "an unknown setting": (_st_settings('{"pooling_after": 1}'), ST_SETTINGS, "a setting csekit does not know"),
    "lasttoken without EOS": (lambda f: _set_pooling(f, {"pooling_mode": "lasttoken"}), "config.json", "no EOS"),
}


@pytest.mark.parametrize("case", REFUSALS)
@pytest.mark.parametrize("pooler", [None, "auto"])
def test_what_csekit_cannot_reproduce_is_one_line_naming_the_file(
    folders: dict[tuple[str, bool], Path], tmp_path: Path, case: str, pooler: str | None
) -> None:
    damage, file, needle = REFUSALS[case]
    folder = private_copy(folders["mean", True], tmp_path)
    damage(folder)
    with pytest.raises(CsekitError) as error:
        SentenceEncoder.load(folder, pooler)
    message = str(error.value)
    assert "\n" not in message and str(folder) in message and file in message and needle in message, message


def test_the_command_line_refuses_with_one_line_and_exit_2(
    folders: dict[tuple[str, bool], Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: CaptureErr
) -> None:
    folder = private_copy(folders["max", False], tmp_path)
    _with_module(folder, "Dense")
    (tmp_path / "in.txt").write_text("a dog runs\n", encoding="utf-8")
    args = ["encode", str(folder), "-i", str(tmp_path / "in.txt"), "-o", str(tmp_path / "out.npy")]
    code, err = run_main(monkeypatch, capsys, *args, "--pooler", "auto")
    assert_one_line_error(code, err, str(folder / "modules.json"), "a Dense module", "choose a pooler")
    code, err = run_main(monkeypatch, capsys, *args, "--pooler", "max")  # the transformer alone: no module read
    assert code == 0, err


def test_a_recipe_with_pooler_auto_refuses_templates() -> None:
    with pytest.raises(CsekitError, match=r"model\.templates.*not model\.pooler auto"):
        load_recipe(None, ["model.pooler=auto", 'model.templates=["This : [X] means [MASK] ."]'])
    assert load_recipe(None, ["model.pooler=auto"]).model.pooler == "auto"


# --- any Pooling config: a representation sentence-transformers agrees with, or one line --------------------------

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 500) | st.floats(allow_nan=True) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)
MODES = st.sampled_from([*POOLER_OF_MODE, "median", "MEAN", ""])
WELL_FORMED_POOLING = st.fixed_dictionaries(
    {},
    optional={
        **{flag: st.booleans() for flag in MODE_FLAGS},
        "pooling_mode": MODES | st.lists(MODES, min_size=1, max_size=2),
        "include_prompt": st.booleans(),
        "word_embedding_dimension": st.just(WIDTH),
        "embedding_dimension": st.just(WIDTH),
    },
)
"""Configs of the keys sentence-transformers reads and the types it writes: one mode or several, or none."""
ANY_KEY = st.sampled_from(sorted(POOLING_KEYS)) | st.text(max_size=20)
POOLING_CONFIGS = (
    WELL_FORMED_POOLING
    | st.builds(lambda config, key, value: {**config, key: value}, WELL_FORMED_POOLING, ANY_KEY, JSON_VALUES)
    | st.dictionaries(ANY_KEY, JSON_VALUES, max_size=4)
    | JSON_VALUES
)
"""Well-formed configs, the same with one key of any name and value, any object, any JSON."""


def _st_mode(folder: Path) -> Any:
    """The mode sentence-transformers' own Pooling reads from the folder's config (None: it fails to load it)."""
    try:
        return Pooling.load(str(folder), subfolder="1_Pooling").pooling_mode
    except (TypeError, ValueError):
        return None


@FUZZ
@given(config=POOLING_CONFIGS)
def test_any_pooling_config_is_read_as_sentence_transformers_reads_it_or_refused_in_one_line(config: Any) -> None:
    with tempfile.TemporaryDirectory() as temporary:
        folder = Path(temporary)
        (folder / "1_Pooling").mkdir()
        _set_pooling(folder, config)
        modules = [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        ]
        _set_modules(folder, modules)
        try:
            pooling = read_folder_pooling(folder)
        except CsekitError as error:
            assert "\n" not in str(error) and "config.json" in str(error), str(error)
            return
        assert isinstance(pooling, FolderPooling) and not pooling.normalize
        assert pooling.pooler == POOLER_OF_MODE[pooling.mode]
        if pooling.width is not None:  # sentence-transformers needs the width to build the module
            assert _st_mode(folder) == pooling.mode


MODULE_PATHS = {"Transformer": "", "Pooling": "1_Pooling", "Normalize": "2_Normalize", "Dense": "3_Dense"}
SENTENCE_MODELS = st.sampled_from([["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]])
WELL_FORMED_MODULES = (SENTENCE_MODELS | st.lists(st.sampled_from(sorted(MODULE_PATHS)), max_size=4)).map(
    lambda kinds: [
        {"idx": i, "name": str(i), "path": MODULE_PATHS[kind], "type": f"sentence_transformers.models.{kind}"}
        for i, kind in enumerate(kinds)
    ]
)
"""Lists of modules as sentence-transformers writes them: a sentence model's, or any in any order and number."""
ENTRY_KEYS = st.sampled_from(["idx", "name", "path", "type", "kwargs", "device"])
MODULE_LISTS = (
    WELL_FORMED_MODULES
    | st.builds(
        lambda modules, index, key, value: [
            {**module, key: value} if i == index else module for i, module in enumerate(modules)
        ],
        WELL_FORMED_MODULES,
        st.integers(0, 3),
        ENTRY_KEYS,
        JSON_VALUES | st.sampled_from(["../x", "/etc", "evil.Pooling", "sentence_transformers.base.modules.Dense"]),
    )
    | JSON_VALUES
)
"""Well-formed lists, the same with one entry's key set to any value, any JSON."""


@FUZZ
@given(modules=MODULE_LISTS)
def test_any_modules_list_is_read_or_refused_in_one_line(modules: Any) -> None:
    with tempfile.TemporaryDirectory() as temporary:
        folder = Path(temporary) / "model"
        (folder / "1_Pooling").mkdir(parents=True)
        _set_pooling(folder, {"word_embedding_dimension": WIDTH, "pooling_mode_max_tokens": True})
        _set_modules(folder, modules)
        try:
            pooling = read_folder_pooling(folder)
        except CsekitError as error:
            assert "\n" not in str(error) and str(folder) in str(error), str(error)
            return
        assert pooling.pooler == "max" and len(modules) in (2, 3) and pooling.normalize == (len(modules) == 3)

"""The authors' end punctuation at evaluation (issue #53 items 1 and 2): PromptBERT's test-time period and SNCSE's
" ." at test and dev time, as a rule the model carries (csekit.json), applied by `encode`, refused by
sentence-transformers, on in the recipes whose authors evaluated that way."""

from __future__ import annotations

import json
import string
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import REPO, assert_one_line_error, make_tiny_encoder, run_main

from csekit.core.errors import CsekitError
from csekit.encoding.encoder import SentenceEncoder
from csekit.encoding.representation import Reading
from csekit.encoding.sentence_end import end_sentences
from csekit.evaluation.sts_data import load_sts_task
from csekit.training.dev_scoring import dev_encoder
from csekit.training.recipe import load_recipe


def promptbert_batcher(s: str) -> str:
    """kongds/Prompt-BERT `evaluation.py`, `batcher` (with --mask_embedding_sentence_template), the line as written."""
    if len(s) > 0 and s[-1] not in ".?\"'":
        s += "."
    return s


PUNCTUATION = list(string.punctuation)


def sncse_scripts(texts: list[str]) -> list[str]:
    """Sense-GVT/SNCSE `bert_prediction.py`, `roberta_prediction.py`, `bert_evaluation.py`: the line as written."""
    return [_ + " ." if _.strip()[-1] not in PUNCTUATION else _ for _ in texts]


EDGES = ["a man plays", "a man plays .", 'he said "no"', "it's Bob's'", "why?", "wow!", "x )", "tail  ", "é", "a."]


def test_the_rules_write_what_the_authors_scripts_write() -> None:
    assert end_sentences(EDGES, "promptbert") == [promptbert_batcher(s) for s in EDGES]
    assert end_sentences(EDGES, "sncse") == sncse_scripts(EDGES)
    assert end_sentences(["", " "], "promptbert") == ["", " ."]  # the batcher's len(s) > 0 guard
    assert end_sentences(["", " "], "sncse") == ["", " "]  # the scripts would fail on a blank line; csekit keeps it
    assert end_sentences(EDGES, "none") == EDGES


@pytest.mark.parametrize("task", ["STS13", "SICKRelatedness", "stsb-dev"])
def test_the_rules_equal_the_authors_scripts_on_every_sts_sentence(data_dir: Path, task: str) -> None:
    sentences = [s for subset in load_sts_task(data_dir, task) for s in subset.sentences1 + subset.sentences2]
    assert end_sentences(sentences, "promptbert") == [promptbert_batcher(s) for s in sentences]
    assert end_sentences(sentences, "sncse") == sncse_scripts(sentences)
    if task == "SICKRelatedness":  # issue #53: PromptBERT's batcher touches 99.7% of SICK-R's test sentences
        changed = np.mean([a != b for a, b in zip(end_sentences(sentences, "promptbert"), sentences, strict=True)])
        assert changed > 0.99


SENTENCES = ["alpha beta gamma", "delta epsilon .", "zeta eta?"]


@pytest.mark.parametrize("rule", ["promptbert", "sncse"])
def test_encode_writes_the_models_rule_and_the_saved_model_keeps_it(tmp_path: Path, rule: str) -> None:
    plain = make_tiny_encoder(tmp_path / "tok", pooler="mean", initializer_range=0.2)
    written = [promptbert_batcher(s) for s in SENTENCES] if rule == "promptbert" else sncse_scripts(SENTENCES)
    expected = plain.encode(written)
    assert not np.allclose(plain.encode(SENTENCES), expected)
    model = plain.with_representation(sentence_end=rule)
    np.testing.assert_allclose(model.encode(SENTENCES), expected, rtol=0, atol=1e-6)
    model.save(tmp_path / "model")
    assert json.loads((tmp_path / "model" / "csekit.json").read_text())["representation"]["sentence_end"] == rule
    loaded = SentenceEncoder.load(tmp_path / "model")
    assert loaded.representation == model.representation
    np.testing.assert_allclose(loaded.encode(SENTENCES), expected, rtol=0, atol=1e-6)
    as_given = SentenceEncoder.load(tmp_path / "model", reading=Reading(sentence_end="none"))
    assert as_given.representation.sentence_end == "none"
    assert plain.representation.sentence_end == "none"  # a view: the original is unchanged


def test_sentence_transformers_refuses_a_model_with_a_rule_in_one_line(tmp_path: Path) -> None:
    st = pytest.importorskip("sentence_transformers")
    make_tiny_encoder(tmp_path / "tok", pooler="cls").with_representation(sentence_end="sncse").save(tmp_path / "model")
    with pytest.raises(ValueError, match="SentenceEndNotExported"):  # sentence-transformers 6 refuses the class
        st.SentenceTransformer(str(tmp_path / "model"), device="cpu")
    with pytest.raises(CsekitError, match="adds end punctuation to each sentence"):  # and the class itself
        st.SentenceTransformer(str(tmp_path / "model"), device="cpu", trust_remote_code=True)
    make_tiny_encoder(tmp_path / "tok2", pooler="cls").save(tmp_path / "plain")
    modules = json.loads((tmp_path / "plain" / "modules.json").read_text())
    assert all("NotExported" not in module["type"] for module in modules)


def test_a_bad_rule_is_one_line_naming_where(tmp_path: Path) -> None:
    make_tiny_encoder(tmp_path / "tok").save(tmp_path / "model")
    meta = tmp_path / "model" / "csekit.json"
    saved = json.loads(meta.read_text())
    meta.write_text(json.dumps({**saved, "representation": {**saved["representation"], "sentence_end": "period"}}))
    with pytest.raises(
        CsekitError, match=r'csekit.json: "representation.sentence_end" must be one of none, promptbert'
    ):
        SentenceEncoder.load(tmp_path / "model")
    with pytest.raises(CsekitError, match=r"recipe key model.sentence_end must be one of none, promptbert, sncse"):
        load_recipe(None, ["model.sentence_end=period"])


def test_csekit_evaluate_takes_the_rule_and_names_it(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = run_main(monkeypatch, capsys, "evaluate", str(tiny_model_dir), "--sentence-end", "dot")
    assert_one_line_error(code, err, "--sentence-end must be one of none, promptbert, sncse")


@pytest.mark.parametrize(
    ("recipe_file", "rule", "at_dev"),
    [
        ("promptbert-bert-base.yaml", "promptbert", False),
        ("promptbert-roberta-base.yaml", "promptbert", False),
        ("sncse-bert-base.yaml", "sncse", True),
        ("sncse-roberta-base.yaml", "sncse", True),
        ("simcse-bert-base.yaml", "none", True),
    ],
)
def test_the_recipes_evaluate_as_their_authors_and_dev_follows_their_dev_script(
    tmp_path: Path, recipe_file: str, rule: str, at_dev: bool
) -> None:
    recipe = load_recipe(REPO / "recipes" / recipe_file)
    assert (recipe.model.sentence_end, recipe.train.dev_sentence_end) == (rule, at_dev or rule == "none")
    saved = make_tiny_encoder(tmp_path / "tok").with_representation(sentence_end=rule)
    with dev_encoder(saved, torch.nn.Identity(), recipe.train.__class__(dev_sentence_end=at_dev)) as dev:
        assert dev.representation.sentence_end == (rule if at_dev else "none")
    assert saved.representation.sentence_end == rule

"""The authors' test-time token ids for prompt models (issue #53 item 3): PromptBERT's and SNCSE's evaluations put
the sentence into the template's text and tokenise the whole string at once. A model carries it as its test
template (`model.test_template`, csekit.json), `encode` applies it, dev follows the authors' dev code, and it is on
in the two RoBERTa recipes; on BERT's WordPiece the authors' whole string and csekit's training ids are the same."""

from __future__ import annotations

import json
import string
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import (
    REPO,
    TinyTrainer,
    assert_one_line_error,
    make_byte_level_bpe_tokenizer,
    make_tiny_encoder,
    run_main,
    tiny_config,
)
from transformers import AutoModel, BertTokenizerFast, PreTrainedTokenizerBase

from csekit import cli
from csekit.bench.papers import protocol
from csekit.commands.evaluate import protocol_label
from csekit.core.errors import CsekitError
from csekit.encoding.encoder import SentenceEncoder
from csekit.encoding.pooling import MaskPooler, Pooler, make_pooler
from csekit.encoding.representation import Reading, Representation
from csekit.encoding.sentence_end import end_sentences
from csekit.encoding.whole_template import evaluation_ids
from csekit.evaluation.sts_data import load_sts_task
from csekit.evaluation.suite import parse_tasks, protocol_facts
from csekit.training.dev_scoring import dev_encoder
from csekit.training.recipe import Recipe, load_recipe

# --- the authors' test strings, as their code builds them ---------------------------------------------------------

PROMPTBERT_TEMPLATES = {
    "roberta": "*cls*_This_sentence_:_'_*sent_0*_'_means*mask*.*sep+*",  # eval_only.sh unsup-roberta, run.sh L80
    "bert": '*cls*_This_sentence_of_"*sent_0*"_means*mask*.*sep+*',  # eval_only.sh unsup-bert, run.sh unsup-bert
}


def promptbert_test_strings(tokenizer: PreTrainedTokenizerBase, model_type: str, sentences: Sequence[str]) -> list[str]:
    """kongds/Prompt-BERT `evaluation.py` `batcher` L193-202 as written (`sentences` already `' '.join(s)`); the
    strings go to `batch_encode_plus` whole (L221-231)."""
    template = PROMPTBERT_TEMPLATES[model_type]
    template = template.replace("*mask*", tokenizer.mask_token).replace("_", " ").replace("*sep+*", "")
    template = template.replace("*cls*", "")
    out = []
    for s in sentences:
        if len(s) > 0 and s[-1] not in ".?\"'":
            s += "."
        out.append(template.replace("*sent 0*", s).strip())
    return out


PUNCTUATION = list(string.punctuation)


def sncse_test_strings(tokenizer: PreTrainedTokenizerBase, texts: Sequence[str]) -> list[str]:
    """Sense-GVT/SNCSE `roberta_prediction.py` L68-70 (test) and `roberta_evaluation.py` L83-85 (dev); the BERT
    scripts write `[MASK]` for `<mask>` (`bert_prediction.py` L68-70): the tokenizer's mask token."""
    texts = [_ + " ." if _.strip()[-1] not in PUNCTUATION else _ for _ in texts]
    return ["""This sentence : " """ + t + f""" " means {tokenizer.mask_token} .""" for t in texts]


AUTHORS = {"promptbert": promptbert_test_strings, "sncse": lambda tok, _, s: sncse_test_strings(tok, s)}


def recipe_pooler(recipe: Recipe, tokenizer: PreTrainedTokenizerBase) -> Pooler:
    """The recipe's prompt pooler (its templates, else the pooler's own), bound to `tokenizer`."""
    options = {} if recipe.model.templates is None else {"templates": recipe.model.templates}
    pooler = make_pooler(recipe.model.pooler, **options)
    pooler.bind(tokenizer)
    return pooler


def sts_sentences(data_dir: Path) -> list[str]:
    """Every STS13 and SICK-R test sentence and every STS-B dev sentence, as SentEval hands them to a batcher."""
    tasks = ("STS13", "SICKRelatedness", "stsb-dev")
    subsets = [subset for task in tasks for subset in load_sts_task(data_dir, task)]
    return list(dict.fromkeys(s for subset in subsets for s in subset.sentences1 + subset.sentences2))


def bpe_tokenizer(sentences: Sequence[str]) -> PreTrainedTokenizerBase:
    """A RoBERTa-style tokenizer that knows the templates' words and the sentences' (with and without their space)."""
    templates = ["This sentence : ' a ' means.", 'This sentence : " a " means .', "The sentence of"]
    return make_byte_level_bpe_tokenizer([*templates, *sentences, *(" " + s for s in sentences)], vocab_size=3000)


def wordpiece_tokenizer(sentences: Sequence[str]) -> BertTokenizerFast:
    """A BERT-style (WordPiece, lower-cased) tokenizer learnt from `sentences` and the templates' words."""
    from tokenizers import BertWordPieceTokenizer

    learner = BertWordPieceTokenizer(lowercase=True)
    texts = ['This sentence of " a " means .', 'This sentence : " a " means .', *sentences]
    learner.train_from_iterator(texts, vocab_size=2000, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    return BertTokenizerFast(vocab=learner.get_vocab(), do_lower_case=True)


ROBERTA = {"promptbert": "promptbert-roberta-base.yaml", "sncse": "sncse-roberta-base.yaml"}
BERT = {"promptbert": "promptbert-bert-base.yaml", "sncse": "sncse-bert-base.yaml"}


# --- RoBERTa: the recipes' test ids are the authors' ------------------------------------------------------------


@pytest.mark.parametrize("method", ["promptbert", "sncse"])
def test_the_roberta_recipes_test_ids_are_the_authors_whole_string_on_every_sts_sentence(
    data_dir: Path, method: str
) -> None:
    sentences = sts_sentences(data_dir)
    tokenizer = bpe_tokenizer(sentences)
    recipe = load_recipe(REPO / "recipes" / ROBERTA[method])
    pooler = recipe_pooler(recipe, tokenizer)
    written = end_sentences(sentences, recipe.model.sentence_end)
    ids = evaluation_ids(pooler, tokenizer, written, recipe.model.test_template, 512)["input_ids"]
    authors = tokenizer(AUTHORS[method](tokenizer, "roberta", sentences))["input_ids"]
    assert ids == authors
    training = pooler.encode_ids(tokenizer, written, None, max_positions=512)["input_ids"]
    assert np.mean([a != b for a, b in zip(training, authors, strict=True)]) > 0.95  # what the option changes


def test_the_first_word_takes_its_space_and_snces_lone_space_token_goes() -> None:
    sentences = ["She eats food.", "a man plays the guitar ."]
    tokenizer = bpe_tokenizer(sentences)
    for method in ("promptbert", "sncse"):
        recipe = load_recipe(REPO / "recipes" / ROBERTA[method])
        pooler = recipe_pooler(recipe, tokenizer)
        whole = evaluation_ids(pooler, tokenizer, sentences, recipe.model.test_template, 512)["input_ids"][0]
        apart = pooler.encode_ids(tokenizer, sentences, None)["input_ids"][0]
        assert tokenizer.convert_ids_to_tokens(whole)[5] == "ĠShe", method  # <s> This Ġsentence Ġ: Ġ' ĠShe
        assert "ĠShe" not in tokenizer.convert_ids_to_tokens(apart), method
    assert tokenizer.convert_ids_to_tokens(apart)[5:7] == ["Ġ", "She"]  # SNCSE's training ids: a lone space token


# --- BERT: WordPiece gives the same ids either way, so the BERT recipes keep the training ids -------------------


@pytest.mark.parametrize("method", ["promptbert", "sncse"])
def test_on_bert_the_authors_whole_string_is_the_training_ids_on_every_sts_sentence(
    data_dir: Path, method: str
) -> None:
    sentences = sts_sentences(data_dir)
    tokenizer = wordpiece_tokenizer(sentences)
    recipe = load_recipe(REPO / "recipes" / BERT[method])
    assert recipe.model.test_template == "none"  # the default, unchanged
    pooler = recipe_pooler(recipe, tokenizer)
    written = end_sentences(sentences, recipe.model.sentence_end)
    ids = evaluation_ids(pooler, tokenizer, written, recipe.model.test_template, 512)["input_ids"]
    assert ids == tokenizer(AUTHORS[method](tokenizer, "bert", sentences))["input_ids"]
    assert tokenizer.unk_token_id not in ids[0]


# --- encode, save, reload, export ------------------------------------------------------------------------------

PROMPTBERT_TEST_TEMPLATE = "This sentence : ' [X] ' means[MASK]."
SENTENCES = ["She eats food", "a man plays the guitar .", "the dog runs in the park"]


def tiny_roberta(templates: Sequence[str], **options: str) -> SentenceEncoder:
    """A 2-layer RoBERTa with the byte-level BPE tokenizer and a mask pooler."""
    torch.manual_seed(0)
    tokenizer = bpe_tokenizer(SENTENCES)
    config = tiny_config("roberta", len(tokenizer), 32, 0.2, pad_token_id=tokenizer.pad_token_id)
    reading = Representation(**options)  # type: ignore[arg-type]
    return SentenceEncoder(AutoModel.from_config(config), tokenizer, MaskPooler(templates), representation=reading)


def by_hand(encoder: SentenceEncoder, texts: Sequence[str]) -> np.ndarray:
    """The authors' `calculate_cosine` embeddings: the whole strings tokenised, the last layer at <mask>."""
    inputs = encoder.tokenizer(list(texts), padding=True, return_tensors="pt")
    encoder.eval()
    with torch.no_grad():
        states = encoder.backbone(**inputs).last_hidden_state
    return states[inputs["input_ids"] == encoder.tokenizer.mask_token_id].numpy()


def test_encode_reads_the_authors_ids_and_the_saved_model_keeps_its_test_template(tmp_path: Path) -> None:
    recipe = load_recipe(REPO / "recipes" / ROBERTA["promptbert"])
    model = tiny_roberta(
        recipe.model.templates or (), sentence_end="promptbert", test_template=PROMPTBERT_TEST_TEMPLATE
    )
    expected = by_hand(model, promptbert_test_strings(model.tokenizer, "roberta", SENTENCES))
    np.testing.assert_allclose(model.encode(SENTENCES), expected, rtol=0, atol=1e-5)
    assert not np.allclose(model.with_representation(test_template="none").encode(SENTENCES), expected, atol=1e-3)
    model.save(tmp_path / "model")
    meta = json.loads((tmp_path / "model" / "csekit.json").read_text())["representation"]
    assert meta["test_template"] == PROMPTBERT_TEST_TEMPLATE
    modules = json.loads((tmp_path / "model" / "modules.json").read_text())
    assert any(module["type"].endswith("PromptNotExported") for module in modules)  # sentence-transformers refuses
    loaded = SentenceEncoder.load(tmp_path / "model")
    assert loaded.representation == model.representation
    np.testing.assert_allclose(loaded.encode(SENTENCES), expected, rtol=0, atol=1e-5)
    as_training = SentenceEncoder.load(tmp_path / "model", reading=Reading(test_template="none"))
    assert as_training.representation.test_template == "none"
    assert SentenceEncoder.load(tmp_path / "model", pooler="cls").representation.test_template == "none"  # no prompt
    assert model.with_pooler(make_pooler("mean")).representation.test_template == "none"
    assert model.representation.test_template == PROMPTBERT_TEST_TEMPLATE  # views leave the original unchanged


def test_a_sentence_too_long_for_the_template_keeps_the_cut_training_ids() -> None:
    model = tiny_roberta(["This sentence : '[X] ' means[MASK]."], test_template=PROMPTBERT_TEST_TEMPLATE)
    long = " ".join(["the dog runs"] * 40)
    template = model.representation.test_template
    ids = evaluation_ids(model.pooler, model.tokenizer, [long, "She eats food"], template, 62)["input_ids"]
    assert ids[0] == model.pooler.encode_ids(model.tokenizer, [long], None, max_positions=62)["input_ids"][0]
    assert len(ids[0]) == 62 and model.tokenizer.mask_token_id in ids[0]
    assert model.encode([long]).shape == (1, 32)


# --- recipes, dev, bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("recipe_file", "whole", "at_dev"),
    [
        ("promptbert-roberta-base.yaml", PROMPTBERT_TEST_TEMPLATE, False),  # their trainer's dev: the training ids
        ("sncse-roberta-base.yaml", 'This sentence : " [X] " means [MASK] .', True),  # roberta_evaluation.py
        ("promptbert-bert-base.yaml", "none", True),
        ("sncse-bert-base.yaml", "none", True),
        ("simcse-roberta-base.yaml", "none", True),
    ],
)
def test_the_recipes_test_as_their_authors_and_dev_follows_their_dev_code(
    recipe_file: str, whole: str, at_dev: bool
) -> None:
    recipe = load_recipe(REPO / "recipes" / recipe_file)
    assert (recipe.model.test_template, recipe.train.dev_test_template) == (whole, at_dev)
    if whole == "none":
        return
    saved = tiny_roberta(recipe.model.templates or (), test_template=whole)
    train = recipe.train.__class__(dev_test_template=at_dev)
    with dev_encoder(saved, torch.nn.Identity(), train) as dev:
        assert dev.representation.test_template == (whole if at_dev else "none")
    assert saved.representation.test_template == whole


def test_dev_denoising_reads_the_training_ids(tmp_path: Path) -> None:
    pooler = make_pooler("mask_denoised", templates=["This sentence : '[X] ' means[MASK]."])
    model = tiny_roberta(["x [X] [MASK]"], test_template=PROMPTBERT_TEST_TEMPLATE).with_pooler(pooler)
    with pooler.denoising(), pytest.raises(CsekitError, match="template denoising reads the training ids"):
        model.encode(SENTENCES)
    key = "recipe key train.dev_test_template cannot go with train.dev_denoise"
    with pytest.raises(CsekitError, match=key):
        load_recipe(REPO / "recipes" / ROBERTA["promptbert"], ["train.dev_test_template=true"])


def test_a_bad_test_template_is_one_line_naming_where(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(CsekitError, match=r"recipe key model.test_template is not a prompt template: .*\[X\]"):
        load_recipe(None, ["model.test_template=no sentence here"])
    with pytest.raises(CsekitError, match=r"recipe key model.test_template is for the prompt poolers, not cls"):
        load_recipe(None, ["model.pooler=cls", "model.test_template=the [X] is [MASK]"])
    with pytest.raises(CsekitError, match="a test template is for the prompt poolers"):
        make_tiny_encoder(tmp_path / "tok").with_representation(test_template="the [X] is [MASK]")
    model = tiny_roberta(["[X] means [MASK]"], test_template="[X] means [MASK]")
    model.save(tmp_path / "model")
    meta = tmp_path / "model" / "csekit.json"
    saved = json.loads(meta.read_text())
    meta.write_text(json.dumps({**saved, "representation": {**saved["representation"], "test_template": "[MASK] [X]"}}))
    with pytest.raises(CsekitError, match=r'csekit.json: "representation.test_template" is not a prompt template'):
        SentenceEncoder.load(tmp_path / "model")
    code, err = run_main(monkeypatch, capsys, "evaluate", str(tmp_path / "model"), "--test-template", "[X] only")
    assert_one_line_error(code, err, "--test-template is not a prompt template")


def test_the_reports_name_the_test_template() -> None:
    tasks = parse_tasks("STS13")
    whole = Representation("mask", sentence_end="promptbert", test_template=PROMPTBERT_TEST_TEMPLATE)
    assert protocol_facts(whole, tasks)["test_template"] == PROMPTBERT_TEST_TEMPLATE
    assert protocol_facts(Representation(), tasks)["test_template"] == "none"
    assert "tokenised whole" in protocol_label(whole, tasks)
    assert "tokenised whole" not in protocol_label(Representation(), tasks)
    runs = [{"sentence_end": "sncse", "test_template": 'x " [X] " [MASK]'}, {"sentence_end": "sncse"}]
    assert protocol("STS13", runs) == "sentence end sncse, training ids and whole test template"
    assert protocol("STS13", runs[1:]) == "sentence end sncse"


def test_csekit_evaluate_reads_the_models_test_template_and_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    tiny_roberta(["This sentence : '[X] ' means[MASK]."], test_template=PROMPTBERT_TEST_TEMPLATE).save(tmp_path / "m")
    rows = [
        (a, b, str(i)) for i, (a, b) in enumerate(zip(SENTENCES * 3, SENTENCES[1:] * 3 + SENTENCES[:3], strict=True))
    ]
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("sentence1\tsentence2\tscore\n" + "".join("\t".join(row) + "\n" for row in rows))
    monkeypatch.delenv("CSEKIT_DATA", raising=False)  # no SentEval task runs
    reports = {}
    for given in ([], ["--test-template", "none"]):
        out = tmp_path / f"out{len(given)}.json"
        monkeypatch.setattr(
            sys, "argv", ["csekit", "evaluate", str(tmp_path / "m"), "--pairs", str(pairs), "-o", str(out), *given]
        )
        with pytest.raises(SystemExit) as exit_info:
            cli.main()
        printed = capsys.readouterr().out
        assert not exit_info.value.code
        reports[len(given)] = json.loads(out.read_text())
        assert ("tokenised whole" in printed.splitlines()[-1]) == (not given)
    assert reports[0]["test_template"] == PROMPTBERT_TEST_TEMPLATE and reports[2]["test_template"] == "none"
    assert reports[0]["tasks"]["pairs:pairs"] != reports[2]["tasks"]["pairs:pairs"]


def test_a_recipes_test_template_reaches_the_trained_and_saved_model(train_tiny: TinyTrainer) -> None:
    best = train_tiny("model.pooler=mask", "model.test_template=the [X] is [MASK]", steps=2).folder / "best"
    assert json.loads((best / "csekit.json").read_text())["representation"]["test_template"] == "the [X] is [MASK]"
    assert SentenceEncoder.load(best).representation.test_template == "the [X] is [MASK]"

"""PromptEOL's pooler (`prompteol`) equals a transcription of the authors' evaluation batcher on a tiny decoder: the
template's text tokenised whole, the last token's state read; its sentence-end rule; a long sentence is cut, never
the template; a saved prompteol model reloads as one and refuses sentence-transformers. With an in-context
demonstration, each of run_icl.sh's eight templates (the README's rows) is the text csekit tokenises, and its vectors
are the batcher's; a demonstration that would break the template is refused in one line, wherever it is given."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import assert_one_line_error, run_main
from hypothesis import given, settings
from hypothesis import strategies as st
from prompteol_reference import (
    PLAIN_TEMPLATE,
    RUN_ICL_TEMPLATES,
    authors_batcher,
    authors_sentence_edit,
    authors_text,
    demonstration_of,
    readme_text,
    run_icl_template,
)
from tiny_decoders import DECODER_WORDS, decoder_config
from transformers import PreTrainedTokenizerFast

from csekit import cli
from csekit.core.errors import CsekitError
from csekit.encoding import prompteol
from csekit.encoding.encoder import SentenceEncoder
from csekit.encoding.pooling import PROMPTEOL_TEMPLATE, LastTokenPooler, PromptEOLPooler
from csekit.encoding.prompteol import Demonstration
from csekit.encoding.representation import Reading, Representation
from csekit.encoding.sentence_end import end_sentences
from csekit.training.model import load_encoder
from csekit.training.recipe import load_recipe

DEMONSTRATIONS = {model: demonstration_of(template) for model, template in RUN_ICL_TEMPLATES.items()}
"""run_icl.sh's demonstration of each model: (sentence, word)."""
TEMPLATE_WORDS = ["This", "sentence", ":", '"', "means", "in", "one", "word", "-"]
DEMONSTRATION_WORDS = [w.strip(".") for pair in DEMONSTRATIONS.values() for part in pair for w in part.split()]
SENTENCES = ["a man plays the guitar .", "the dog runs", "she eats food quickly in the big park ."]
RAW_SENTENCES = ['she said "yes" to the dog', "is it big?", "a man plays the guitar", "the cat sits."]
"""Sentences the authors' edit changes (a final period, quotes made single, a final ? made a period) or keeps."""


def prompt_tokenizer() -> PreTrainedTokenizerFast:
    """The tests' decoder tokenizer (<s> before each text, no pad token) that knows the template's words and splits
    punctuation off words, as a real decoder's tokenizer splits `word:"`."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    words = ["<unk>", "<s>", "</s>", *dict.fromkeys([*DECODER_WORDS, *TEMPLATE_WORDS, *DEMONSTRATION_WORDS])]
    backend = Tokenizer(models.WordLevel({token: i for i, token in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation("isolated")]
    )
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>", model_max_length=64
    )
    tokenizer.model_input_names = ["input_ids", "attention_mask"]
    return tokenizer


def prompteol_decoder(model_type: str = "llama") -> SentenceEncoder:
    """A tiny random decoder of `model_type` with the prompteol pooler (no demonstration), in eval mode (as a loaded
    model is)."""
    torch.manual_seed(0)
    tokenizer = prompt_tokenizer()
    config = decoder_config(model_type, len(tokenizer))
    if model_type == "opt":  # OPT's widths have their own names (the paper's main family)
        config.word_embed_proj_dim, config.ffn_dim = config.hidden_size, config.intermediate_size
    return SentenceEncoder.from_config(config, tokenizer, pooler="prompteol").eval()


def authors_vectors(encoder: SentenceEncoder, sentences: list[str]) -> torch.Tensor:
    """kongds/scaling_sentemb `evaluation.py` L193-223 (its sentence edit left to the sentence-end rule): the
    template's underscores as spaces, each sentence in it, `batch_encode_plus` padded on the left with pad id 0,
    the last layer at the last position."""
    tokenizer = prompt_tokenizer()
    tokenizer.pad_token = "<unk>"  # the authors' `tokenizer.pad_token_id = 0`
    tokenizer.padding_side = "left"
    template = PLAIN_TEMPLATE.replace("_", " ")
    texts = [template.replace("*sent 0*", s).strip() for s in sentences]
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    with torch.no_grad():
        hidden_states = encoder.backbone(output_hidden_states=True, return_dict=True, **batch).hidden_states
    return hidden_states[-1][:, -1, :]


@pytest.mark.parametrize("model_type", ["llama", "opt"])
def test_prompteol_equals_the_authors_batcher_on_a_tiny_decoder(model_type: str) -> None:
    encoder = prompteol_decoder(model_type)
    assert PROMPTEOL_TEMPLATE.replace("[X]", "*sent 0*") == PLAIN_TEMPLATE.replace("_", " ")
    ours = torch.from_numpy(encoder.encode(SENTENCES))
    theirs = authors_vectors(encoder, SENTENCES)
    assert ours.shape == theirs.shape == (3, encoder.dim)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(ours[0], ours[1], atol=1e-3)  # the sentences give different vectors
    # not a plain last_token read (which appends EOS after the bare sentence)
    plain = torch.from_numpy(encoder.with_pooler(LastTokenPooler()).encode(SENTENCES))
    assert not torch.allclose(plain, theirs, atol=1e-3)


def test_the_template_is_tokenised_whole_and_its_closing_quote_is_read() -> None:
    encoder = prompteol_decoder()
    tokenizer = encoder.tokenizer
    inputs = encoder.tokenize(SENTENCES[:2])
    first = inputs["input_ids"][0][inputs["attention_mask"][0].bool()].tolist()
    assert tokenizer.convert_ids_to_tokens(first) == (
        ["<s>", "This", "sentence", ":", '"', *SENTENCES[0].split(), '"', "means", "in", "one", "word", ":", '"']
    )
    read = encoder.pooler.read_positions(inputs["attention_mask"], inputs["input_ids"])
    assert read.tolist() == [int(n) - 1 for n in inputs["attention_mask"].sum(dim=1)]
    assert {int(inputs["input_ids"][row, read[row]]) for row in range(2)} == {tokenizer.convert_tokens_to_ids('"')}


def test_a_long_sentence_is_cut_and_the_template_kept() -> None:
    encoder = prompteol_decoder()
    long = " ".join(["the big dog"] * 30)
    ids = encoder.pooler.encode_ids(encoder.tokenizer, [long, "a cat"], None, max_positions=24)["input_ids"]
    assert len(ids[0]) == 24 and len(ids[1]) < 24
    assert ids[0][-7:] == ids[1][-7:]  # `" means in one word:"` whole
    assert ids[0][:5] == ids[1][:5]  # <s> This sentence : "
    cut = encoder.pooler.encode_ids(encoder.tokenizer, ["a man plays the guitar"], 2)["input_ids"][0]
    assert encoder.tokenizer.convert_ids_to_tokens(cut)[5:7] == ["a", "man"] and len(cut) == 5 + 2 + 7


def test_the_prompteol_sentence_end_is_the_authors_edit() -> None:
    """`if s[-1] not in '.?"\\'': s += '.'`, `s.replace('"', "'")`, a final ? made a period (L198-200)."""
    sentences = ["a dog runs", 'she said "yes"', "is it big?", "", "fine."]
    assert end_sentences(sentences, "prompteol") == ["a dog runs.", "she said 'yes'", "is it big.", "", "fine."]


def test_a_saved_prompteol_model_reloads_as_one_and_refuses_sentence_transformers(tmp_path: Path) -> None:
    encoder = prompteol_decoder()
    encoder.save(tmp_path / "model")
    modules = json.loads((tmp_path / "model" / "modules.json").read_text(encoding="utf-8"))
    assert any(entry["type"].endswith("PromptNotExported") for entry in modules)
    reloaded = SentenceEncoder.load(tmp_path / "model")
    assert isinstance(reloaded.pooler, PromptEOLPooler)
    assert reloaded.encode(SENTENCES[:1]) == pytest.approx(encoder.encode(SENTENCES[:1]), abs=1e-6)


# --- the in-context demonstration (run_icl.sh's templates: the README's rows) -----------------------------------


def demonstrated(encoder: SentenceEncoder, model: str) -> SentenceEncoder:
    """`encoder` reading as run_icl.sh does for `model`: its demonstration before the template, the authors' edit; in
    eval mode, as a loaded model is (a view is made in training mode, and `encode` leaves the shared backbone so)."""
    sentence, word = DEMONSTRATIONS[model]
    reading = Representation("prompteol", demonstration=Demonstration(sentence, word), sentence_end="prompteol")
    return encoder.with_representation(reading).eval()


def test_each_run_icl_template_is_one_demonstration_before_the_plain_template() -> None:
    """The pattern the Hypothesis test writes templates by is the one all eight of run_icl.sh's follow."""
    assert len(RUN_ICL_TEMPLATES) == 8
    for model, template in RUN_ICL_TEMPLATES.items():
        sentence, word = DEMONSTRATIONS[model]
        assert run_icl_template(sentence, word) == template, model
        pooler = PromptEOLPooler({"sentence": sentence, "word": word})
        assert pooler.template.replace("[X]", "*sent 0*") == template.replace("_", " "), model
    assert DEMONSTRATIONS["opt-125m"] == ("A man is smoking.", "Smoking")
    assert DEMONSTRATIONS["opt-6.7b"] == ("The man is riding a horse.", "Horseback-riding")


@pytest.mark.parametrize("model", sorted(RUN_ICL_TEMPLATES))
def test_the_text_csekit_tokenises_is_the_authors_for_each_run_icl_template(
    model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through `encode` (the sentence-end rule, then the pooler): the texts the tokenizer gets are evaluation.py's
    (the template's underscores read as spaces, the edited sentence put in) and the README's example's."""
    fed: list[str] = []
    tokenize_texts = prompteol.tokenize_texts

    def recording(tokenizer: object, texts: list[str], max_tokens: int | None, **options: object) -> object:
        if not options:  # the whole texts (the template's pieces are tokenised without special tokens)
            fed.extend(texts)
        return tokenize_texts(tokenizer, texts, max_tokens, **options)

    monkeypatch.setattr(prompteol, "tokenize_texts", recording)
    with_underscore = "the snake_case name"  # evaluation.py puts the sentence in after reading _ as a space: kept
    demonstrated(prompteol_decoder(), model).encode([*RAW_SENTENCES, with_underscore])
    template = RUN_ICL_TEMPLATES[model]
    assert sorted(fed) == sorted(authors_text(template, s) for s in [*RAW_SENTENCES, with_underscore])
    assert all(readme_text(template, s) in fed for s in RAW_SENTENCES)  # the README's form, where no _ is in s
    assert "the snake_case name." in authors_text(template, with_underscore)


@pytest.mark.parametrize("model_type", ["llama", "opt"])
@pytest.mark.parametrize("model", sorted(RUN_ICL_TEMPLATES))
def test_a_demonstration_reads_the_authors_batchers_vector(model_type: str, model: str) -> None:
    """The pooled vectors equal evaluation.py's batcher with run_icl.sh's template (left padding, the last position),
    and differ from PromptEOL's without the demonstration."""
    plain = prompteol_decoder(model_type)
    encoder = demonstrated(plain, model)
    ours = torch.from_numpy(encoder.encode(RAW_SENTENCES))
    theirs = authors_batcher(encoder.backbone, prompt_tokenizer(), RUN_ICL_TEMPLATES[model], RAW_SENTENCES)
    assert ours.shape == theirs.shape == (len(RAW_SENTENCES), encoder.dim)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    without = torch.from_numpy(plain.with_representation(sentence_end="prompteol").eval().encode(RAW_SENTENCES))
    assert not torch.allclose(without, theirs, atol=1e-3)


def breaks_the_template(text: str) -> bool:
    """What a demonstration's sentence or word may not hold: nothing but spaces, a double quote (it would close the
    template's quote), `_` (the authors' notation's space), a sentence slot, a line break or other unprintable."""
    slots = ("[X]", "*sent 0*")
    return not text.strip() or '"' in text or "_" in text or any(s in text for s in slots) or not text.isprintable()


DEMONSTRATION_TEXT = st.one_of(
    st.text(st.characters(exclude_categories=("Cs",)), max_size=24),
    st.text(st.sampled_from("ab .,!?-'\"_\n\t[X]*sent0"), max_size=12),
    st.sampled_from(["A man is smoking.", "Smoking", '"', "_", " ", "", "[X]", "*sent 0*", "a\nb", "caf\u00e9"]),
)


@settings(max_examples=300, deadline=None)
@given(sentence=DEMONSTRATION_TEXT, word=DEMONSTRATION_TEXT)
def test_a_demonstration_is_refused_in_one_line_or_gives_the_authors_text(sentence: str, word: str) -> None:
    """Any sentence and word: refused in one line naming where (the option) if either breaks the template, else the
    text of every sentence is evaluation.py's with the template run_icl.sh would write for them."""
    refused = breaks_the_template(sentence) or breaks_the_template(word)
    try:
        pooler = PromptEOLPooler({"sentence": sentence, "word": word})
    except CsekitError as error:
        message = str(error)
        assert refused and "\n" not in message and message.startswith("the prompteol pooler's demonstration: the ")
        return
    assert not refused
    template = run_icl_template(sentence, word)
    for raw in RAW_SENTENCES:
        assert pooler.texts([authors_sentence_edit(raw)]) == [authors_text(template, raw)]


@pytest.mark.parametrize(
    ("sentence", "word", "needle"),
    [
        ('A "man" smokes.', "Smoking", "double quote"),
        ("A man is smoking.", 'Smo"king', "double quote"),
        ("A_man_is_smoking.", "Smoking", "contains _"),
        ("A man is smoking.", "  ", "is empty"),
        ("A man\nsmokes.", "Smoking", "line break"),
        ("The [X] smokes.", "Smoking", "slot for the sentence"),
    ],
)
def test_a_bad_demonstration_is_one_line_naming_where_it_was_given(
    sentence: str,
    word: str,
    needle: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """In Python, a recipe (its file and line), csekit.json and `csekit evaluate --demonstration`, before any model
    loads (the model folder here does not even exist)."""
    with pytest.raises(CsekitError, match=f"the PromptEOL demonstration's .*{needle}"):
        Demonstration(sentence, word)
    recipe = tmp_path / "recipe.yaml"
    demonstration = {"sentence": sentence, "word": word}
    recipe.write_text(
        yaml.safe_dump({"model": {"pooler": "prompteol", "demonstration": demonstration}}, sort_keys=False)
    )
    with pytest.raises(CsekitError, match=f"recipe.yaml:3: recipe key model.demonstration: the .*{needle}"):
        load_recipe(recipe)
    encoder = prompteol_decoder()
    encoder.save(tmp_path / "model")
    meta = tmp_path / "model" / "csekit.json"
    saved = json.loads(meta.read_text())
    meta.write_text(
        json.dumps({**saved, "representation": {**saved["representation"], "demonstration": demonstration}})
    )
    with pytest.raises(CsekitError, match=f'csekit.json: "representation.demonstration": the .*{needle}') as error:
        SentenceEncoder.load(tmp_path / "model")
    assert "\n" not in str(error.value)
    code, err = run_main(monkeypatch, capsys, "evaluate", str(tmp_path / "none"), "--demonstration", sentence, word)
    assert_one_line_error(code, err, "--demonstration: the ", needle)


def test_a_demonstration_is_for_the_prompteol_pooler_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pair = ["A man is smoking.", "Smoking"]
    demonstration = dict(zip(("sentence", "word"), pair, strict=True))
    with pytest.raises(CsekitError, match=r"recipe key model\.demonstration is for model\.pooler prompteol, not cls"):
        load_recipe(None, ["model.demonstration={sentence: A man is smoking., word: Smoking}"])
    with pytest.raises(CsekitError, match=r"must be \{sentence: ..., word: ...\}"):
        load_recipe(None, ["model.pooler=prompteol", "model.demonstration={sentence: A man is smoking.}"])
    prompteol_decoder().save(tmp_path / "model")
    with pytest.raises(CsekitError, match="a PromptEOL demonstration is for the prompteol pooler, not the mean pooler"):
        SentenceEncoder.load(tmp_path / "model", pooler="mean", reading=Reading(demonstration=Demonstration(*pair)))
    code, err = run_main(
        monkeypatch, capsys, "evaluate", str(tmp_path / "model"), "--pooler", "mean", "--demonstration", *pair
    )
    assert_one_line_error(code, err, "--demonstration is for --pooler prompteol, not mean")
    meta = tmp_path / "model" / "csekit.json"
    saved = json.loads(meta.read_text())
    meta.write_text(
        json.dumps({"representation": {**saved["representation"], "pooler": "mean", "demonstration": demonstration}})
    )
    with pytest.raises(
        CsekitError, match=r'csekit\.json: "representation.demonstration" is for the prompteol pooler, not mean'
    ):
        SentenceEncoder.load(tmp_path / "model")


def test_a_saved_model_with_a_demonstration_reloads_with_it_and_refuses_sentence_transformers(tmp_path: Path) -> None:
    plain = prompteol_decoder()
    encoder = demonstrated(plain, "opt-2.7b")
    encoder.save(tmp_path / "model")
    plain.with_representation(sentence_end="prompteol").save(tmp_path / "plain")  # the same but the demonstration
    meta = json.loads((tmp_path / "model" / "csekit.json").read_text(encoding="utf-8"))["representation"]
    assert meta["demonstration"] == {"sentence": "A jockey riding a horse.", "word": "Equestrian"}
    plain_meta = json.loads((tmp_path / "plain" / "csekit.json").read_text(encoding="utf-8"))["representation"]
    assert plain_meta == {**meta, "demonstration": None}
    modules = [
        json.loads((tmp_path / name / "modules.json").read_text(encoding="utf-8")) for name in ("model", "plain")
    ]
    assert modules[0] == modules[1] and any(entry["type"].endswith("PromptNotExported") for entry in modules[0])
    reloaded = SentenceEncoder.load(tmp_path / "model")
    assert (
        isinstance(reloaded.pooler, PromptEOLPooler) and reloaded.pooler.demonstration == encoder.pooler.demonstration
    )
    assert reloaded.encode(RAW_SENTENCES) == pytest.approx(encoder.encode(RAW_SENTENCES), abs=1e-6)
    other = SentenceEncoder.load(
        tmp_path / "model", reading=Reading(demonstration=Demonstration("meat from a deer.", "Venison"))
    )
    assert other.pooler.demonstration == Demonstration("meat from a deer.", "Venison")
    st_module = pytest.importorskip("sentence_transformers")
    with pytest.raises(CsekitError, match="sentence-transformers cannot reproduce"):
        st_module.SentenceTransformer(str(tmp_path / "model"), device="cpu", trust_remote_code=True)


def test_a_recipes_demonstration_reaches_the_encoder_it_builds(tmp_path: Path) -> None:
    prompteol_decoder().save(tmp_path / "model")
    overrides = [f"model.backbone={tmp_path / 'model'}", "model.pooler=prompteol"]
    overrides.append("model.demonstration={sentence: meat from a deer., word: Venison}")
    encoder = load_encoder(load_recipe(None, overrides))
    assert encoder.pooler.demonstration == Demonstration("meat from a deer.", "Venison")


def test_csekit_evaluate_reads_with_the_demonstration_and_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    prompteol_decoder().save(tmp_path / "model")
    pairs = tmp_path / "pairs.tsv"
    rows = [
        (a, b, str(i)) for i, (a, b) in enumerate(zip(RAW_SENTENCES * 2, SENTENCES * 2 + SENTENCES[:2], strict=False))
    ]
    pairs.write_text("sentence1\tsentence2\tscore\n" + "".join("\t".join(row) + "\n" for row in rows))
    monkeypatch.delenv("CSEKIT_DATA", raising=False)  # no SentEval task runs
    reports = {}
    for given_pair in ([], ["--demonstration", "A man is smoking.", "Smoking"]):
        out = tmp_path / f"out{len(given_pair)}.json"
        args = [str(tmp_path / "model"), "--sentence-end", "prompteol", "--pairs", str(pairs), "-o", str(out)]
        monkeypatch.setattr(sys, "argv", ["csekit", "evaluate", *args, *given_pair])
        with pytest.raises(SystemExit) as exit_info:
            cli.main()
        printed = capsys.readouterr().out
        assert not exit_info.value.code
        reports[len(given_pair)] = json.loads(out.read_text())
        assert ('demonstration "A man is smoking." -> "Smoking"' in printed.splitlines()[-1]) == bool(given_pair)
    assert "demonstration" not in reports[0]
    assert reports[3]["demonstration"] == {"sentence": "A man is smoking.", "word": "Smoking"}
    assert reports[3]["pooler"] == reports[0]["pooler"] == "prompteol"

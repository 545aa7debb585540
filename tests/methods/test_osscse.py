"""OssCSE: MER probes, Cont./Oppn. splits, prompt pooler, margin and recall losses, negation, augmentation."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import WORDS, make_byte_level_bpe_tokenizer, make_tiny_encoder

from csekit.core.errors import CsekitError
from csekit.encoding.pooling import POOLERS, MaskPooler
from csekit.evaluation.probes import (
    PAPER_TABLE2,
    TRANSFORMATIONS,
    ProbeDataset,
    bias_probe,
    load_probe_datasets,
    load_transformation_probe,
    mer,
    select_datasets,
    split_cont_oppn,
    transformation_probe,
)
from csekit.evaluation.tasks import StsSubset
from csekit.parts.objectives import OBJECTIVES, RecallLoss, TwoWayMargin, two_way_margin
from csekit.parts.step_state import StepState

OSSCSE_TEMPLATE_TEXTS = (
    'This sentence : "a man plays the guitar ." means .',
    'This sentence of "the dog runs" means .',
    "a man plays",
    "the woman eats food",
)
"""Texts to learn a byte-level BPE vocabulary from that covers the mask pooler's default templates."""

# --- MER and splits --------------------------------------------------------------------------------


def test_mer_on_hand_examples() -> None:
    assert mer("a man plays guitar", "a man plays guitar") == 0.0
    assert mer("the cat sat", "the dog sat") == pytest.approx(1 / 3)  # S=1, C=2
    assert mer("a b", "a b c") == pytest.approx(1 / 3)  # I=1, C=2
    assert mer("a b c d", "a b") == pytest.approx(2 / 4)  # D=2, C=2
    assert mer("a b", "c d") == 1.0
    assert mer("", "") == 0.0 and mer("a", "") == 1.0
    # The paper's Example 1: inserting "not" into 14 words gives MER 1/15 (reported as 0.06).
    original = "bryan cranston will return as walter white for breaking bad spin off, report claims."
    negation = "bryan cranston will not return as walter white for breaking bad spin off, report claims."
    assert mer(original, negation) == pytest.approx(1 / 15)


def test_split_assignment_on_a_made_up_dataset() -> None:
    # medians: score 3.0, MER 0.5
    scores = [5.0, 4.0, 1.0, 0.5, 3.0, 4.5, 0.0]
    mers = [0.1, 0.9, 0.8, 0.2, 0.1, 0.5, 0.5]
    cont = split_cont_oppn(scores, mers)
    # high/low-MER: Cont.; high/high-MER: Oppn.; low/high-MER: Cont.; low/low-MER: Oppn.;
    # a tie at the median score or at the median MER is Oppn.
    assert cont.tolist() == [True, False, True, False, False, False, False]


def _subset(scores: list[float]) -> StsSubset:
    return StsSubset("x", [f"a {i}" for i in range(len(scores))], [f"b {i}" for i in range(len(scores))], scores)


def test_dataset_selection_by_median_score_and_by_the_paper() -> None:
    low = ProbeDataset("STS12-low", _subset([0.0, 1.0, 1.5]), np.array([0.1, 0.2, 0.3]))
    mid = ProbeDataset("STS12-MSRvid", _subset([2.0, 3.0, 3.5]), np.array([0.1, 0.2, 0.3]))
    high = ProbeDataset("STS12-high", _subset([3.0, 4.0, 5.0]), np.array([0.1, 0.2, 0.3]))
    assert [d.name for d in select_datasets([low, mid, high], "rule")] == ["STS12-MSRvid"]
    assert [d.name for d in select_datasets([low, mid, high], "paper")] == ["STS12-MSRvid"]
    with pytest.raises(CsekitError):
        select_datasets([low], "all")


def test_bias_probe_spearman_per_split_and_weighted_average() -> None:
    rng = np.random.default_rng(0)
    scores = list(rng.uniform(0, 5, 40))
    subset = StsSubset("x", [f"s{i}" for i in range(40)], [f"t{i}" for i in range(40)], scores)
    dataset = ProbeDataset("made-up", subset, rng.uniform(0, 1, 40))
    table = {f"s{i}": np.array([1.0, 0.0]) for i in range(40)}
    # A model whose cosine is a monotone function of the gold score: Spearman 1 on both splits.
    for i, y in enumerate(scores):
        angle = (5 - y) / 5 * np.pi / 2
        table[f"t{i}"] = np.array([np.cos(angle), np.sin(angle)])
    report = bias_probe(lambda sentences: np.stack([table[s] for s in sentences]), [dataset])
    row = report["datasets"][0]
    assert row["cont"] + row["oppn"] == 40
    assert row["spearman_cont"] == pytest.approx(1.0) and row["spearman_oppn"] == pytest.approx(1.0)
    assert report["weighted_average"]["cont"] == pytest.approx(1.0)


EXACT = ("STS12-MSRvid", "STS13-headlines", "STS16-plagiarism", "STS16-postediting", "STS16-question-question")


@pytest.mark.data
def test_probe_counts_against_the_papers_table2(data_dir: Path) -> None:
    datasets = {d.name: d for d in load_probe_datasets(data_dir)}
    assert set(PAPER_TABLE2) <= set(datasets)
    for name, (cont, oppn, median_score, _) in PAPER_TABLE2.items():
        d = datasets[name]
        assert int(d.cont.sum()) + int((~d.cont).sum()) == cont + oppn, name  # same pairs
        assert d.median_score == pytest.approx(median_score), name
        if name in EXACT:
            assert (int(d.cont.sum()), int((~d.cont).sum())) == (cont, oppn), name
        elif name != "STSB-test":  # STSB-test differs by 44: see docs/osscse.md
            assert abs(int(d.cont.sum()) - cont) <= 10, name
    # Every dataset of Table 2 passes the stated rule.
    assert set(PAPER_TABLE2) <= {d.name for d in select_datasets(list(datasets.values()), "rule")}


# --- transformation probe ---------------------------------------------------------------------------


def test_shipped_transformation_probe_set() -> None:
    rows = load_transformation_probe()
    assert len(rows) >= 30
    for row in rows:
        assert len({row["text"], *(row[t] for t in TRANSFORMATIONS)}) == 7
        assert mer(row["text"], row["random"]) > mer(row["text"], row["substitution"])


def test_transformation_probe_reports_means_and_negation_rate() -> None:
    rows = load_transformation_probe()[:4]
    rng = np.random.default_rng(0)
    vectors: dict[str, np.ndarray] = {}

    def encode(sentences: list[str]) -> np.ndarray:
        return np.stack([vectors.setdefault(s, rng.normal(size=8)) for s in sentences])

    for row in rows:  # negation identical to the original: it always beats the paraphrase
        vectors[row["negation"]] = encode([row["text"]])[0]
    report = transformation_probe(encode, rows)
    assert report["negation_above_paraphrase"] == {"count": 4, "rate": 1.0}
    assert report["transformations"]["negation"]["mean_similarity"] == pytest.approx(1.0, abs=1e-6)
    assert set(report["transformations"]) == set(TRANSFORMATIONS)


def test_bad_probe_file_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "probe.jsonl"
    path.write_text('{"text": "a"}\n', encoding="utf-8")
    with pytest.raises(CsekitError, match=f"{path}:1: missing field"):
        load_transformation_probe(path)


# --- the prompt (mask) pooler ----------------------------------------------------------------------


def test_prompt_truncates_the_sentence_never_the_template(tmp_path: Path) -> None:
    """PromptBERT (train.py: `tokenizer.encode(s, add_special_tokens=False)[:max_seq_length]`) keeps max_length
    sentence tokens, then wraps them in the template with [CLS] and [SEP]."""
    encoder = make_tiny_encoder(tmp_path / "tok", pooler="mask")
    assert isinstance(encoder.pooler, MaskPooler) and POOLERS.get("mask") is MaskPooler
    tokenizer = encoder.tokenizer
    long_sentence = " ".join(["the man plays guitar"] * 20)
    sentence_tokens = tokenizer.tokenize(long_sentence)
    for view, word in ((0, None), (1, "of")):
        full = encoder.pooler.encode_ids(tokenizer, ["the man"], None, view=view)["input_ids"][0]
        template_length = len(full) - 2  # "the man" is two tokens
        cut = encoder.pooler.encode_ids(tokenizer, [long_sentence], 5, view=view)["input_ids"][0]
        assert len(cut) == template_length + 5  # the whole template on top of 5 sentence tokens
        tokens = tokenizer.convert_ids_to_tokens(cut)
        # Everything but the sentence is the untouched template: prefix before it, suffix after it.
        before, after = full[: full.index(tokenizer.convert_tokens_to_ids("the"))], full[-5:]
        assert cut[: len(before)] == before and cut[-5:] == after
        assert tokens[len(before) : len(before) + 5] == sentence_tokens[:5]
        assert tokens.count("[MASK]") == 1 and tokens[0] == "[CLS]" and tokens[-1] == "[SEP]"
        assert (word in tokens) == (word is not None)
    template_only = len(encoder.pooler.encode_ids(tokenizer, [""], None)["input_ids"][0])
    with pytest.raises(CsekitError, match="max_positions"):
        encoder.pooler.encode_ids(tokenizer, ["the man"], None, max_positions=template_only)


def test_prompt_inputs_fit_the_backbone_with_the_whole_template(tmp_path: Path) -> None:
    """At inference only the backbone's limit applies: a sentence longer than it is cut, the template kept."""
    encoder = make_tiny_encoder(tmp_path / "tok", pooler="mask")
    limit = encoder.max_seq_length  # 64 positions in the tiny config
    long_sentence = " ".join(["the man plays guitar"] * 40)  # 160 words
    short = encoder.tokenize(["the man"])["input_ids"][0].tolist()
    inputs = encoder.tokenize([long_sentence, "the man"])
    assert inputs["input_ids"].shape[1] == limit
    row = inputs["input_ids"][0].tolist()
    prefix = short[: short.index(encoder.tokenizer.convert_tokens_to_ids("the"))]  # [CLS] + the template's start
    assert row[: len(prefix)] == prefix and row[-5:] == short[-5:]  # ... and its end, [MASK] and [SEP]
    assert row.count(encoder.tokenizer.mask_token_id) == 1
    vectors = encoder.encode([long_sentence, "the man"])  # runs: no position overflow
    assert np.isfinite(vectors).all()


def test_mask_pooler_reads_the_mask_position_and_reloads(tmp_path: Path) -> None:
    encoder = make_tiny_encoder(tmp_path / "tok", pooler="mask")
    inputs = encoder.tokenize(["the man plays", "a dog"], view=0)
    output = encoder(inputs)
    for row in range(2):
        position = int((inputs["input_ids"][row] == encoder.tokenizer.mask_token_id).nonzero()[-1])
        torch.testing.assert_close(output.pooled[row], output.token_states[row, position])
    encoder.save(tmp_path / "model")
    meta = json.loads((tmp_path / "model" / "csekit.json").read_text())["representation"]
    assert meta["pooler"] == "mask" and len(meta["templates"]) == 2
    from csekit.encoding.encoder import SentenceEncoder

    reloaded = SentenceEncoder.load(tmp_path / "model")
    assert reloaded.pooler.name == "mask"
    np.testing.assert_allclose(reloaded.encode(["the man plays"]), encoder.encode(["the man plays"]), atol=1e-5)
    st = pytest.importorskip("sentence_transformers")
    with pytest.raises(ValueError, match="trust_remote_code"):  # refused, not silently mean-pooled
        st.SentenceTransformer(str(tmp_path / "model"))
    with pytest.raises(CsekitError, match=r"prompt \(mask\) pooler"):
        st.SentenceTransformer(str(tmp_path / "model"), trust_remote_code=True)


def test_mask_pooler_needs_a_mask_token(tmp_path: Path) -> None:
    encoder = make_tiny_encoder(tmp_path / "tok")
    tokenizer = encoder.tokenizer
    tokenizer.mask_token = None
    with pytest.raises(CsekitError, match="mask token"):
        MaskPooler().bind(tokenizer)


def test_roberta_style_tokenizer_keeps_the_template() -> None:
    tokenizer = make_byte_level_bpe_tokenizer(OSSCSE_TEMPLATE_TEXTS)
    pooler = MaskPooler()
    pooler.bind(tokenizer)
    ids = pooler.encode_ids(tokenizer, ["a man plays the guitar ."], None)["input_ids"][0]
    assert (
        tokenizer.decode(ids) == '<s>This sentence : "a man plays the guitar ." means<mask> .</s>'
    )  # <mask> takes its space
    second = pooler.encode_ids(tokenizer, ["a man plays"], None, view=1)["input_ids"][0]
    assert tokenizer.decode(second) == '<s>This sentence of "a man plays" means<mask> .</s>'
    text = "a man plays the guitar . the woman eats food"
    long = pooler.encode_ids(tokenizer, [text], None, max_positions=20)["input_ids"][0]
    assert len(long) == 20 and long.count(tokenizer.mask_token_id) == 1
    assert tokenizer.decode(long).endswith('" means<mask> .</s>') and tokenizer.decode(long).startswith("<s>This")


# --- objectives ------------------------------------------------------------------------------------


def test_margin_loss_against_a_hand_computation() -> None:
    h = torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0]])
    p = torch.tensor([[0.6, 0.8], [1.0, 0.0], [0.0, 1.0]])  # cosines 0.6, 1.0, 0.0
    n = torch.tensor([[0.8, 0.6], [0.0, 1.0], [0.0, 1.0]])  # cosines 0.8, 0.0, 0.0
    losses = two_way_margin(h, p, n, alpha=0.05, beta=0.2)
    # row 0: negation above paraphrase: 0.8 - 0.6 + 0.05; row 1: gap 1.0 > beta: 1.0 - 0.2; row 2: 0 + 0.05
    torch.testing.assert_close(losses, torch.tensor([0.25, 0.8, 0.05]))


def _state(encoder, sentences: list[str], fields: dict) -> StepState:  # type: ignore[no-untyped-def]
    output = encoder(encoder.tokenize(sentences))
    return StepState(sentences, [output.pooled], [output.pooled], output, encoder, fields=fields)


def test_margin_objective_encodes_fields_skips_missing_rows_and_trains_the_encoder(tmp_path: Path) -> None:
    encoder = make_tiny_encoder(tmp_path / "tok", pooler="mean")
    sentences = ["the man plays guitar", "a dog runs", "the cat sits"]
    fields = {
        "paraphrase": ["a man is playing a guitar", None, "a cat is sitting"],
        "negation": ["the man not plays guitar", "a dog not runs", ""],
    }
    encoder.eval()  # the tiny model has dropout; compare in eval mode
    state = _state(encoder, sentences, fields)
    loss = TwoWayMargin(alpha=0.05, beta=0.2)(state)["margin"]
    with torch.no_grad():
        h = encoder(encoder.tokenize(sentences[:1])).pooled
        p = encoder(encoder.tokenize(fields["paraphrase"][:1])).pooled
        n = encoder(encoder.tokenize(fields["negation"][:1])).pooled
    expected = two_way_margin(h, p, n, 0.05, 0.2).mean()  # only row 0 has both fields
    assert loss.item() == pytest.approx(expected.item(), abs=1e-6)
    if loss.item() > 0:
        loss.backward()
        assert encoder.backbone.embeddings.word_embeddings.weight.grad.abs().sum() > 0
    empty = TwoWayMargin()(_state(encoder, sentences, {"paraphrase": [None] * 3, "negation": [None] * 3}))
    assert empty["margin"].item() == 0.0
    with pytest.raises(CsekitError, match="paraphrase"):
        TwoWayMargin()(_state(encoder, sentences, {}))


def test_recall_loss_is_zero_at_start_and_its_gradient_is_gamma_times_the_drift(tmp_path: Path) -> None:
    encoder = make_tiny_encoder(tmp_path / "tok")
    recall = RecallLoss(encoder, gamma=2e-3)
    assert OBJECTIVES.get("recall") is RecallLoss
    state = _state(encoder, ["the man"], {})
    assert recall(state)["recall"].item() == 0.0
    theta0 = {name: p.detach().clone() for name, p in encoder.backbone.named_parameters()}
    with torch.no_grad():
        for p in encoder.backbone.parameters():
            p.add_(0.01 * torch.randn_like(p))
    encoder.zero_grad()
    loss = recall(state)["recall"]
    loss.backward()
    drift = 0.0
    for name, p in encoder.backbone.named_parameters():
        if p.requires_grad:
            torch.testing.assert_close(p.grad, 2e-3 * (p.detach() - theta0[name]))
            drift += float(((p.detach() - theta0[name]) ** 2).sum())
        else:
            assert p.grad is None  # the frozen NSP pooler is not pulled back
    assert loss.item() == pytest.approx(0.5 * 2e-3 * drift, rel=1e-5)
    assert not any("theta0" in key for key in recall.state_dict())  # never checkpointed or exported


def test_osscse_parts_train_end_to_end(tmp_path: Path, tiny_model_dir: Path) -> None:
    from csekit.encoding.encoder import SentenceEncoder
    from csekit.training.recipe import load_recipe
    from csekit.training.trainer import train

    rng = random.Random(0)
    words = [w for w in WORDS if w.isalpha()]
    with open(tmp_path / "corpus.jsonl", "w", encoding="utf-8") as handle:
        for i in range(48):
            text = " ".join(rng.choices(words, k=5))
            row = {"text": text, "paraphrase": " ".join(rng.choices(words, k=6)), "negation": text + " not"}
            if i % 4 == 0:
                row["paraphrase"] = None
            handle.write(json.dumps(row) + "\n")
    recipe = load_recipe(
        None,
        [
            f"model.backbone={tiny_model_dir}",
            "model.pooler=mask",
            "model.max_length=40",
            f"data.corpus={tmp_path / 'corpus.jsonl'}",
            "train.batch_size=16",
            "train.max_steps=3",
            "train.eval_every=0",
            "train.log_every=1",
            "train.dev_task=none",
        ],
    )
    recipe.objectives = [
        {"name": "infonce", "temperature": 0.05},
        {"name": "margin", "alpha": 0.05, "beta": 0.2, "weight": 1e-3},
        {"name": "recall", "gamma": 2e-3, "weight": 1.0},
    ]
    train(recipe, tmp_path / "run", show_progress=False)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "margin" in r]
    assert len(steps) == 3 and steps[0]["recall"] == 0.0 and steps[-1]["recall"] > 0.0
    assert SentenceEncoder.load(tmp_path / "run" / "best").pooler.name == "mask"


# --- negation and augmentation ---------------------------------------------------------------------

NEGATIONS = {
    "My dog likes eating sausage.": "My dog does not like eating sausage.",  # VBZ
    "They like dogs.": "They do not like dogs.",  # VBP
    "He liked the movie.": "He did not like the movie.",  # VBD
    "He has a car.": "He does not have a car.",  # VBZ main verb have
    "The man is happy.": "The man is not happy.",  # copula
    "We were late.": "We were not late.",  # copula, past
    "She can swim.": "She cannot swim.",  # modal can
    "You should go.": "You should not go.",  # modal
    "A man is playing a guitar.": "A man is not playing a guitar.",  # auxiliary be
    "They have eaten lunch.": "They have not eaten lunch.",  # auxiliary have
    "The cake was eaten by the kids.": "The cake was not eaten by the kids.",  # passive auxiliary
    "Bryan Cranston will return as Walter White for Breaking Bad spin off, report claims.": (
        "Bryan Cranston will not return as Walter White for Breaking Bad spin off, report claims."
    ),
}


@pytest.fixture(scope="module")
def nlp():  # type: ignore[no-untyped-def]
    from csekit.prep.augment import load_spacy

    try:
        return load_spacy()
    except CsekitError:
        pytest.skip("spaCy's English pipeline is not installed (pip install 'csekit[osscse]')")


@pytest.mark.spacy
def test_negation_rules(nlp) -> None:  # type: ignore[no-untyped-def]
    from csekit.prep.augment import negate

    sentences = list(NEGATIONS)
    assert negate(sentences, nlp) == [NEGATIONS[s] for s in sentences]
    assert negate(["She can swim."], nlp, can="can not") == ["She can not swim."]
    # Already negated, or no verbal root: nothing to negate.
    assert negate(["He does not like it.", "Man playing guitar."], nlp) == [None, None]


def test_choose_paraphrase_keeps_only_mer_in_range() -> None:
    from csekit.prep.augment import choose_paraphrase

    sentence = "the man is playing a guitar in the park"
    assert choose_paraphrase(sentence, []) == (None, "no_candidate")
    assert choose_paraphrase(sentence, [sentence]) == (None, "mer_too_low")
    assert choose_paraphrase(sentence, ["completely different words here"]) == (None, "mer_too_high")
    kept = "a man plays the guitar in the park"
    assert 0.15 <= mer(sentence, kept) <= 0.6
    assert choose_paraphrase(sentence, [sentence, kept]) == (kept, None)


@pytest.mark.spacy
def test_augment_streams_and_resumes_after_interruption(tmp_path: Path, nlp) -> None:  # type: ignore[no-untyped-def]
    from csekit.prep.augment import augment_corpus
    from csekit.prep.paraphrase import FileEngine

    sentences = list(NEGATIONS)[:7]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(sentences[:3]) + "\n\n" + "\n".join(sentences[3:]) + "\n", encoding="utf-8")
    para = tmp_path / "para.tsv"
    para.write_text(
        "My dog likes eating sausage.\tMy dog really likes to eat sausage.\nThey like dogs.\tThey like dogs.\n",
        encoding="utf-8",
    )
    output = tmp_path / "out.jsonl"
    first = augment_corpus(corpus, output, FileEngine(para), nlp, chunk_size=2, limit=3)
    assert first.written == 3 and first.paraphrases_kept == 1 and first.dropped["mer_too_low"] == 1
    with open(output, "a", encoding="utf-8") as handle:  # a chunk cut off mid-line by an interruption
        handle.write('{"text": "He has a c')
    second = augment_corpus(corpus, output, FileEngine(para), nlp, chunk_size=2)
    assert second.resumed == 3 and second.written == 4 and second.blank_lines == 1
    rows = [json.loads(line) for line in output.read_text(encoding="utf-8").splitlines()]
    assert [row["text"] for row in rows] == sentences
    assert [row["negation"] for row in rows] == [NEGATIONS[s] for s in sentences]
    assert rows[0]["paraphrase"] == "My dog really likes to eat sausage." and rows[1]["paraphrase"] is None
    other = tmp_path / "other.txt"
    other.write_text("".join(f"Line {i}.\n" for i in range(9)), encoding="utf-8")
    with pytest.raises(CsekitError, match="another corpus"):
        augment_corpus(other, output, None, nlp)


@pytest.mark.spacy
def test_cli_augment_with_a_paraphrase_file(tmp_path: Path, nlp) -> None:  # type: ignore[no-untyped-def]
    from typer.testing import CliRunner

    from csekit.cli import app

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("She can swim.\nThe man is happy.\n", encoding="utf-8")
    para = tmp_path / "para.jsonl"
    para.write_text(json.dumps({"text": "The man is happy.", "paraphrase": "The guy feels happy."}) + "\n")
    output = tmp_path / "out.jsonl"
    args = ["augment", "--corpus", str(corpus), "--output", str(output), "--engine", "file", "--paraphrases", str(para)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "2 sentences written" in result.output and "paraphrases 1 kept" in result.output
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    assert rows[1] == {
        "text": "The man is happy.",
        "negation": "The man is not happy.",
        "paraphrase": "The guy feels happy.",
    }


@pytest.mark.apertium
def test_apertium_round_trip() -> None:
    if shutil.which("apertium") is None:
        pytest.skip("apertium is not installed (apt-get install apertium-eng-spa)")
    from csekit.prep.paraphrase import ApertiumEngine

    back = ApertiumEngine()(["The man likes eating sausages.", "A woman is slicing an onion."])
    assert len(back) == 2 and all(len(candidates) == 1 for candidates in back)
    assert "sausages" in back[0][0]


# --- the paper's back-translation engine (FSMT), offline on tiny random models ---------------------


class _Moses:
    """Stands in for sacremoses where it is not installed: whitespace tokenisation, no normalisation."""

    def __init__(self, lang: str) -> None:
        self.lang = lang

    def normalize(self, text: str) -> str:
        return text

    def tokenize(self, text: str, **options: object) -> list[str]:
        return text.split()

    def detokenize(self, tokens: list[str]) -> str:
        return " ".join(tokens)


@pytest.fixture
def moses(monkeypatch: pytest.MonkeyPatch) -> None:
    """The FSMT tokenizer's Moses steps: the real sacremoses when installed, else whitespace stand-ins."""
    import importlib.util
    import sys
    import types

    if importlib.util.find_spec("sacremoses") is None:
        fake = types.ModuleType("sacremoses")
        fake.MosesPunctNormalizer = fake.MosesTokenizer = fake.MosesDetokenizer = _Moses  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, "sacremoses", fake)


def save_tiny_fsmt(folder: Path, source: str, target: str) -> None:
    """A randomly initialised 1-layer FSMT translation model and its tokenizer (character BPE, no merges)."""
    from transformers import FSMTConfig, FSMTForConditionalGeneration, FSMTTokenizer

    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    vocab = {
        token: i for i, token in enumerate(["<s>", "<pad>", "</s>", "<unk>", *letters, *(c + "</w>" for c in letters)])
    }
    folder.mkdir(parents=True)
    for name in ("src_vocab.json", "tgt_vocab.json"):
        (folder / name).write_text(json.dumps(vocab), encoding="utf-8")
    (folder / "merges.txt").write_text("", encoding="utf-8")
    tokenizer = FSMTTokenizer(
        langs=[source, target],
        src_vocab_file=str(folder / "src_vocab.json"),
        tgt_vocab_file=str(folder / "tgt_vocab.json"),
        merges_file=str(folder / "merges.txt"),
    )
    config = FSMTConfig(
        langs=[source, target],
        src_vocab_size=len(vocab),
        tgt_vocab_size=len(vocab),
        d_model=16,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=64,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=2,
    )
    torch.manual_seed(0)
    FSMTForConditionalGeneration(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def test_the_fsmt_engine_round_trips_through_the_papers_pivots(tmp_path: Path, moses: None) -> None:
    from csekit.prep.paraphrase import ENGINES, FsmtEngine

    assert ENGINES.get("fsmt") is FsmtEngine
    paper = {FsmtEngine.default_models.format(source=a, target=b) for a, b in [("en", "ru"), ("ru", "en")]}
    assert paper == {"facebook/wmt19-en-ru", "facebook/wmt19-ru-en"} and FsmtEngine.default_pivots == ("ru", "de")
    for source, target in [("en", "ru"), ("ru", "en"), ("en", "de"), ("de", "en")]:
        save_tiny_fsmt(tmp_path / f"wmt19-{source}-{target}", source, target)
    engine = FsmtEngine(models=str(tmp_path / "wmt19-{source}-{target}"), device="cpu", batch_size=2)
    sentences = ["the man plays", "a dog runs", "she eats"]
    calls: list[tuple[str, str, int]] = []
    translate = engine._translate

    def recording(batch: list[str], source: str, target: str) -> list[str]:
        out = translate(batch, source, target)
        calls.append((source, target, len(out)))
        return out

    engine._translate = recording  # type: ignore[method-assign]
    candidates = engine(sentences)
    assert calls == [("en", "ru", 3), ("ru", "en", 3), ("en", "de", 3), ("de", "en", 3)]  # EN-RU-EN, then EN-DE-EN
    assert len(candidates) == 3 and all(
        len(row) <= 2 and all(isinstance(c, str) and c for c in row) for row in candidates
    )
    assert {type(model).__name__ for _, model in engine._models.values()} == {"FSMTForConditionalGeneration"}


def test_the_fsmt_engine_without_sacremoses_or_its_models_says_what_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, moses: None
) -> None:
    import sys

    from csekit.prep.paraphrase import FsmtEngine

    with pytest.raises(CsekitError, match=r"wmt19-en-ru does not exist"):
        FsmtEngine(models=str(tmp_path / "wmt19-{source}-{target}"), device="cpu")(["the man"])
    save_tiny_fsmt(tmp_path / "wmt19-en-ru", "en", "ru")
    monkeypatch.setitem(sys.modules, "sacremoses", None)  # import sacremoses raises ImportError
    engine = FsmtEngine(models=str(tmp_path / "wmt19-{source}-{target}"), device="cpu")
    with pytest.raises(CsekitError, match=r"sacremoses: pip install .csekit\[fsmt\]"):
        engine(["the man"])

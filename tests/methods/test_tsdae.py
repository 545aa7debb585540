"""TSDAE: the reconstruction loss and its gradients equal sentence-transformers' DenoisingAutoEncoderLoss; the
decoder is tied to the encoder; deletion noise follows its stated distribution; recipes train and refuse
backbones without a decoder in one line."""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from pathlib import Path

import pytest
import torch
from conftest import DISTINCT_SENTENCES, TinyTrainer, make_corpus, make_tiny_encoder
from resumed_runs import killed_and_resumed
from safetensors.torch import load_file
from scipy.stats import chisquare

from csekit.core.errors import CsekitError
from csekit.encoding.encoder import SentenceEncoder
from csekit.encoding.model_card import methods_used
from csekit.parts.heads.mlp import IdentityHead
from csekit.parts.objectives import OBJECTIVES
from csekit.parts.objectives.tsdae import DenoisingReconstruction
from csekit.parts.views import VIEWS
from csekit.parts.views.deletion import WORD, DeletionViews, delete_words
from csekit.training.model import ContrastiveModel
from csekit.training.optimization import _param_groups
from csekit.training.recipe import load_recipe

CLEAN = DISTINCT_SENTENCES[:4]
NOISY = ["man plays guitar", "dog in park", "she food", "cat sits house"]


def saved_tiny_model(root: Path) -> Path:
    """A tiny random BERT saved as a plain transformers folder (both libraries load it)."""
    encoder = make_tiny_encoder(root / "tok", initializer_range=0.2)
    folder = root / "model"
    encoder.backbone.save_pretrained(folder)
    encoder.tokenizer.save_pretrained(folder)
    return folder


def tsdae_model(folder: Path) -> tuple[ContrastiveModel, DenoisingReconstruction, SentenceEncoder]:
    encoder = SentenceEncoder.load(folder, "cls")
    objective = DenoisingReconstruction(encoder, encoder.tokenizer, 32)
    return ContrastiveModel(encoder, IdentityHead(encoder.dim), 1, [(objective, 1.0)]), objective, encoder


def test_loss_and_gradients_equal_sentence_transformers_denoising_auto_encoder_loss(tmp_path: Path) -> None:
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.losses import DenoisingAutoEncoderLoss
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    folder = saved_tiny_model(tmp_path)
    st_model = SentenceTransformer(
        modules=[Transformer(str(folder), max_seq_length=32), Pooling(32, "cls")], device="cpu"
    )
    reference = DenoisingAutoEncoderLoss(st_model, tie_encoder_decoder=True)
    model, objective, encoder = tsdae_model(folder)
    # The cross-attention (and here the LM head's transform) are new weights, drawn at random on each side: ours
    # take the reference's values; the tied weights are the checkpoint's on both sides already.
    objective.decoder.load_state_dict(reference.decoder.state_dict())
    st_model.eval(), reference.eval(), model.eval()

    expected = reference([st_model.tokenize(NOISY), st_model.tokenize(CLEAN)], labels=None)
    expected.backward()
    inputs = encoder.pooler.tokenize(encoder.tokenizer, NOISY, 32)
    total, parts = model(inputs, CLEAN)
    total.backward()

    assert torch.allclose(parts["tsdae"], expected, rtol=1e-6, atol=1e-6), (parts["tsdae"], expected)
    theirs = dict(reference.decoder.named_parameters())
    ours = dict(objective.decoder.named_parameters())
    assert set(ours) == set(theirs)
    for name, param in ours.items():
        assert (param.grad is None) == (theirs[name].grad is None), name
        if param.grad is not None:
            assert torch.allclose(param.grad, theirs[name].grad, rtol=1e-5, atol=1e-7), name
    # The encoder's own weights (those the decoder shares) got the same gradients as sentence-transformers' encoder.
    their_encoder = dict(st_model.transformers_model.named_parameters())
    for name, param in encoder.backbone.named_parameters():
        if param.grad is not None or their_encoder[name].grad is not None:
            assert torch.allclose(param.grad, their_encoder[name].grad, rtol=1e-5, atol=1e-7), name


def test_the_decoder_shares_the_encoders_weights_and_the_optimizer_holds_each_once(tmp_path: Path) -> None:
    model, objective, encoder = tsdae_model(saved_tiny_model(tmp_path))
    decoder = objective.decoder
    assert decoder.bert.embeddings.word_embeddings.weight is encoder.backbone.embeddings.word_embeddings.weight
    assert decoder.get_output_embeddings().weight is encoder.backbone.embeddings.word_embeddings.weight
    own_query = encoder.backbone.encoder.layer[1].attention.self.query.weight
    assert decoder.bert.encoder.layer[1].attention.self.query.weight is own_query
    shared = {id(p) for p in encoder.parameters()}
    new = [name for name, p in decoder.named_parameters() if id(p) not in shared]
    assert new and all("crossattention" in name or name.startswith("cls.") for name in new)
    grouped = [id(p) for group in _param_groups(model, load_recipe(None)) for p in group["params"]]
    assert len(grouped) == len(set(grouped)) and {id(p) for p in decoder.parameters()} <= set(grouped)
    untied = DenoisingReconstruction(encoder, encoder.tokenizer, 32, tie_encoder_decoder=False)
    assert untied.decoder.bert.embeddings.word_embeddings.weight is not own_query
    assert not any(id(p) in shared for p in untied.decoder.parameters())


def _kept_distribution(n: int, p_delete: float) -> dict[int, float]:
    """P(k of n words kept): Binomial(n, 1 - p) for k >= 2; k = 1 also takes the all-deleted case (one put back)."""
    keep = 1 - p_delete
    probabilities = {k: math.comb(n, k) * keep**k * p_delete ** (n - k) for k in range(1, n + 1)}
    probabilities[1] += p_delete**n
    return probabilities


def test_deletion_keeps_each_word_with_probability_0_4_and_at_least_one() -> None:
    sentence = "a man plays the guitar in the park , quickly"
    words = WORD.findall(sentence)
    assert len(words) == 10
    generator = torch.Generator().manual_seed(7)
    draws = 20_000
    counts: Counter[int] = Counter()
    for _ in range(draws):
        noisy = delete_words(sentence, 0.6, generator).split(" ")
        it = iter(words)
        assert all(word in it for word in noisy)  # the kept words in their order
        counts[len(noisy)] += 1
    expected = _kept_distribution(10, 0.6)
    cells = sorted(k for k, p in expected.items() if p * draws >= 5)
    tail = [k for k in expected if k not in cells]
    observed = [counts[k] for k in cells] + [sum(counts[k] for k in tail)]
    predicted = [expected[k] * draws for k in cells] + [sum(expected[k] for k in tail) * draws]
    assert chisquare(observed, predicted).pvalue > 1e-3, counts
    assert 0 not in counts


# Where csekit's word units differ from sentence-transformers' (NLTK's `word_tokenize`, whose tokens NLTK 3.10.4's
# NLTKWordTokenizer gave on these lines; NLTK is no dependency, so only csekit's side runs): the rows of
# docs/fidelity.md's TSDAE table. A different unit changes what one deletion removes.
NLTK_DIFFERENCES = [
    ("I don't know.", ["I", "do", "n't", "know", "."], ["I", "don't", "know", "."]),
    ("The U.S. costs $3.50 today.", ["The", "U.S.", "costs", "$", "3.50", "today", "."],
     ["The", "U", ".", "S", ".", "costs", "$", "3", ".", "50", "today", "."]),
    ("An e-mail cost 1,000 dollars...", ["An", "e-mail", "cost", "1,000", "dollars", "..."],
     ["An", "e", "-", "mail", "cost", "1", ",", "000", "dollars", ".", ".", "."]),
    ('She said "yes" to it.', ["She", "said", "``", "yes", "''", "to", "it", "."],
     ["She", "said", '"', "yes", '"', "to", "it", "."]),
    ("Cannot stop gonna go!", ["Can", "not", "stop", "gon", "na", "go", "!"], ["Cannot", "stop", "gonna", "go", "!"]),
]  # fmt: skip


@pytest.mark.parametrize(("text", "nltk_words", "csekit_words"), NLTK_DIFFERENCES)
def test_word_units_where_they_differ_from_nltk(text: str, nltk_words: list[str], csekit_words: list[str]) -> None:
    """csekit's units on the documented lines; every kept word joined by one space (the Treebank detokenizer
    re-attaches punctuation instead: "know ." there is "know.")."""
    assert WORD.findall(text) == csekit_words != nltk_words
    generator = torch.Generator().manual_seed(0)
    assert delete_words(text, 0.0, generator) == " ".join(csekit_words)


def test_deletion_views_are_one_noisy_view_seeded_by_the_batch(tmp_path: Path) -> None:
    assert VIEWS.get("deletion") is DeletionViews and OBJECTIVES.get("tsdae") is DenoisingReconstruction
    encoder = make_tiny_encoder(tmp_path / "tok")
    views = DeletionViews(encoder.tokenizer, encoder.pooler, 32)
    batch = views(CLEAN)
    assert batch["input_ids"].shape[0] == len(CLEAN)
    assert (
        batch["attention_mask"].sum(1) < torch.tensor([len(encoder.tokenizer(s)["input_ids"]) for s in CLEAN])
    ).any()
    torch.manual_seed(3)
    assert torch.equal(views(CLEAN)["input_ids"], batch["input_ids"])
    with pytest.raises(ValueError, match="del_ratio"):
        DeletionViews(encoder.tokenizer, encoder.pooler, 32, del_ratio=1.0)
    with pytest.raises(CsekitError, match="template"):
        DeletionViews(encoder.tokenizer, make_tiny_encoder(tmp_path / "m", pooler="mask").pooler, 32)


TSDAE_PARTS = ("data.views={name: deletion, del_ratio: 0.6}", "model.head={name: none}", "objectives=[{name: tsdae}]")


def test_a_tsdae_recipe_trains_and_saves_the_encoder_without_the_decoder(train_tiny: TinyTrainer) -> None:
    run = train_tiny(*TSDAE_PARTS, steps=2)
    assert run.result.steps == 2
    exported = load_file(next((run.folder / "best").glob("*.safetensors")))
    assert not any("crossattention" in key or key.startswith("cls.") for key in exported)
    checkpoint = load_file(run.folder / "checkpoint" / "model.safetensors")
    assert any("crossattention" in key for key in checkpoint)  # the decoder's own weights resume with the run


def test_a_backbone_without_a_decoder_is_one_line_naming_the_recipe_key(
    tmp_path: Path, train_tiny: TinyTrainer
) -> None:
    model_dir = tmp_path / "mpnet"
    make_tiny_encoder(tmp_path / "tok", model_type="mpnet").save(model_dir)
    with pytest.raises(CsekitError, match=r"recipe key objectives\[0\]: tsdae needs a decoder .*'mpnet'") as caught:
        train_tiny(*TSDAE_PARTS, steps=1, lines=32, model=model_dir)
    assert "\n" not in str(caught.value)
    opt = make_tiny_encoder(tmp_path / "opt", model_type="opt")  # OPTForCausalLM exists, without cross-attention
    with pytest.raises(ValueError, match=r"'opt' \(OPTForCausalLM\) has no cross-attention"):
        DenoisingReconstruction(opt, opt.tokenizer, 16)


@pytest.mark.parametrize(
    ("recipe_file", "lr", "batch"), [("tsdae-bert-base.yaml", 3e-5, 8), ("tsdae-minilm.yaml", 3e-5, 8)]
)
def test_the_tsdae_recipes_carry_the_papers_settings(recipe_file: str, lr: float, batch: int) -> None:
    recipe = load_recipe(Path(__file__).parents[2] / "recipes" / recipe_file)
    assert (recipe.train.lr, recipe.train.batch_size, recipe.model.pooler) == (lr, batch, "cls")
    assert recipe.data.views == {"name": "deletion", "del_ratio": 0.6}
    assert [spec["name"] for spec in recipe.objectives] == ["tsdae"]
    assert methods_used(dataclasses.asdict(recipe), "cls")[-1] == "tsdae"


def tsdae_recipe(model_dir: Path, corpus: Path, marker: Path) -> str:
    return f"""
model: {{backbone: "{model_dir}", pooler: cls, max_length: 16, head: {{name: none}}}}
data: {{corpus: "{corpus}", views: {{name: deletion, del_ratio: 0.6}}}}
train: {{batch_size: 8, lr: 1.0e-3, max_steps: 6, eval_every: 2, log_every: 1, dev_task: none, seed: 7}}
objectives:
  - {{name: tsdae}}
  - {{name: kill_once, weight: 0.0, at_call: 5, marker: "{marker}"}}
"""


def test_a_killed_tsdae_run_resumes_bit_exactly_decoder_and_noise_included(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """Killed during step 5, resumed from step 4's checkpoint: every tensor and loss of the straight run."""
    corpus = make_corpus(tmp_path / "corpus.txt", lines=64)
    killed_and_resumed(tmp_path, lambda marker: tsdae_recipe(tiny_model_dir, corpus, marker))

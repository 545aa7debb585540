"""LLM2Vec as its authors ran it (issue 65, Fidelity V items 1 and 3): each option equals a transcription of the
authors' code on the same inputs (tests/llm2vec_reference.py).

1. `model.pooler: mean_padded`: in training, the mean over every position of the left-padded row, padding and BOS
   included, the padding positions' states those of LLM2Vec's flash-attention run; at test time with `test_bos:
   false` the mean of the text tokens, BOS left out, as its `encode`.
3. MNTP: the collator's draws (BERT's 80/10/10 at 0.2 for the Llama family, all-mask at 0.8 for Mistral), and the LM
   head's gradient (it trains by default, as LLM2Vec's head outside the LoRA-wrapped model).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from llm2vec_reference import (
    causal_lm_loss,
    flash_attention_padding,
    hf_mask_tokens,
    llm2vec_encode_text,
    llm2vec_mean,
    llm2vec_states,
    llm2vec_tokenize,
    llm2vec_tokenizer,
)
from tiny_decoders import DECODER_TYPES, decoder_config, make_decoder_tokenizer, make_tiny_decoder

from csekit.core.errors import CsekitError
from csekit.encoding.encoder import SentenceEncoder
from csekit.encoding.lora import add_lora
from csekit.encoding.passes import PassPlan
from csekit.parts.objectives.mntp import MaskedNextTokenPrediction
from csekit.parts.step_state import StepState
from csekit.training.recipe import load_recipe

REPO = Path(__file__).resolve().parents[2]
SENTENCES = [
    "a man plays the guitar slowly .",
    "the dog",
    "she eats food quickly in the park with a big red ball",
    "a cat sits",
]


def _decoder(model_type: str, pooler: str = "mean_padded", **options: object) -> SentenceEncoder:
    encoder = make_tiny_decoder(model_type, attention="bidirectional")
    return SentenceEncoder(encoder.backbone, encoder.tokenizer, _pooler(pooler, **options))


def _pooler(name: str, **options: object) -> object:
    from csekit.encoding.pooling import make_pooler

    return make_pooler(name, **options)


# --- 1. LLM2Vec's two means ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("model_type", DECODER_TYPES)
def test_mean_padded_equals_llm2vecs_training_pooling_of_a_left_padded_batch(model_type: str) -> None:
    encoder = _decoder(model_type).train()  # the tiny decoders have no dropout: both passes are deterministic
    features = llm2vec_tokenize(llm2vec_tokenizer(encoder.tokenizer), SENTENCES, max_length=128)
    assert not features["embed_mask"].any()  # run_simcse's collator: no separator, so the whole row is averaged
    assert (features["attention_mask"][:, 0] == 0).any()  # padded on the left
    with torch.no_grad():
        theirs = llm2vec_mean(features, llm2vec_states(encoder.backbone, features))
        ours = encoder(encoder.tokenize(SENTENCES, max_length=128)).pooled  # csekit pads on the right
        # The CPU's length groups would cut each group to its own width: a mean_padded batch runs whole.
        grouped = encoder(encoder.tokenize(SENTENCES), plan=PassPlan(length_group_size=2)).pooled
        real_tokens_only = _decoder(model_type, "mean")(encoder.tokenize(SENTENCES)).pooled
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grouped, ours, rtol=0, atol=0)
    assert not torch.allclose(real_tokens_only, theirs, atol=1e-3)  # csekit's mean is another vector


def test_the_padding_term_trains_lora_as_in_llm2vecs_run_with_checkpointing() -> None:
    """Gradients of the LoRA adapters (the MLPs' reach the padding positions) equal the reference's, with gradient
    checkpointing (the padding pass recomputes under its own attention)."""
    encoder = _decoder("llama")
    backbone = add_lora(encoder.backbone, {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": "all-linear"})
    torch.manual_seed(3)
    with torch.no_grad():  # LoRA's B starts at zero: give the adapters a value, so that they change the states
        for name, parameter in backbone.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.2)
    encoder = SentenceEncoder(backbone, encoder.tokenizer, _pooler("mean_padded")).train()
    backbone.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    trained = [(name, p) for name, p in backbone.named_parameters() if p.requires_grad]
    features = llm2vec_tokenize(llm2vec_tokenizer(encoder.tokenizer), SENTENCES, max_length=128)
    weights = torch.randn(len(SENTENCES), encoder.dim)
    (encoder(encoder.tokenize(SENTENCES)).pooled * weights).sum().backward()
    ours = {name: p.grad.clone() for name, p in trained}
    backbone.zero_grad()
    mask = features["attention_mask"]
    with flash_attention_padding(backbone, mask):
        positions = torch.arange(mask.shape[1]).expand_as(mask)
        states = backbone(input_ids=features["input_ids"], attention_mask=mask, position_ids=positions)
        (llm2vec_mean(features, states.last_hidden_state) * weights).sum().backward()
    mlp = [name for name, _ in trained if "mlp" in name]
    assert mlp and all(ours[name].abs().sum() > 0 for name in mlp)
    for name, parameter in trained:
        scale = float(parameter.grad.abs().max())  # float rounding at the gradients' own scale (they reach ~20)
        torch.testing.assert_close(ours[name], parameter.grad, rtol=1e-4, atol=1e-5 * scale, msg=name)


@pytest.mark.parametrize("model_type", ["llama", "gemma"])
def test_test_bos_false_encodes_as_llm2vecs_encode_and_saves_as_mean_text(model_type: str, tmp_path: Path) -> None:
    encoder = _decoder(model_type, test_bos=False)
    assert encoder.pooler.name == "mean_text"  # the test-time pooler, as a saved model records it
    theirs_tokenizer = llm2vec_tokenizer(encoder.tokenizer)
    features = llm2vec_tokenize(theirs_tokenizer, [llm2vec_encode_text("", s) for s in SENTENCES], max_length=512)
    assert (features["embed_mask"].sum(1) == features["attention_mask"].sum(1) - 1).all()  # all but BOS
    with torch.no_grad():
        theirs = llm2vec_mean(features, llm2vec_states(encoder.backbone.eval(), features))
    ours = torch.from_numpy(encoder.encode(SENTENCES))
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    with_bos = torch.from_numpy(_decoder(model_type).encode(SENTENCES))  # test_bos true: csekit's mean
    assert not torch.allclose(with_bos, theirs, atol=1e-3)
    encoder.save(tmp_path / "model")
    loaded = SentenceEncoder.load(tmp_path / "model")
    assert loaded.pooler.name == "mean_text"
    torch.testing.assert_close(torch.from_numpy(loaded.encode(SENTENCES)), theirs, rtol=1e-5, atol=1e-6)


def test_sentence_transformers_refuses_a_mean_text_model_in_one_line(tmp_path: Path) -> None:
    from sentence_transformers import SentenceTransformer

    _decoder("llama", test_bos=False).save(tmp_path / "model")
    with pytest.raises(ValueError, match="TextMeanNotExported"):  # sentence-transformers 6 refuses the class
        SentenceTransformer(str(tmp_path / "model"), device="cpu")
    with pytest.raises(CsekitError, match=r"without the tokenizer's BOS .* model\.test_bos: true"):  # and the class
        SentenceTransformer(str(tmp_path / "model"), device="cpu", trust_remote_code=True)
    _decoder("llama").save(tmp_path / "with-bos")  # test_bos true: the Pooling module's mean, loaded there
    assert SentenceTransformer(str(tmp_path / "with-bos"), device="cpu").encode(SENTENCES).shape == (4, 32)


def test_mean_padded_needs_a_decoder_and_test_bos_needs_mean_padded(tmp_path: Path) -> None:
    from conftest import make_tiny_encoder

    bert = make_tiny_encoder(tmp_path / "tokenizer")
    with pytest.raises(CsekitError, match=r"mean_padded pooler is LLM2Vec's .* bidirectional encoder"):
        SentenceEncoder(bert.backbone, bert.tokenizer, _pooler("mean_padded"))
    with pytest.raises(CsekitError, match=r"model\.test_bos false is for model\.pooler mean_padded"):
        load_recipe(REPO / "recipes" / "quickstart.yaml", ["model.test_bos=false"])


# --- 3. MNTP as LLM2Vec configured it ------------------------------------------------------------------------------


def _mntp(masking: str, probability: float) -> tuple[MaskedNextTokenPrediction, SentenceEncoder]:
    encoder = make_tiny_decoder("mistral", attention="bidirectional")
    return MaskedNextTokenPrediction(encoder, encoder.tokenizer, probability, masking=masking), encoder


@pytest.mark.parametrize(("masking", "probability"), [("bert", 0.2), ("all", 0.8)])
def test_the_masks_are_the_authors_collators_draws(masking: str, probability: float) -> None:
    objective, encoder = _mntp(masking, probability)
    inputs = encoder.tokenize(SENTENCES * 100)
    theirs_tokenizer = llm2vec_tokenizer(encoder.tokenizer)
    theirs_tokenizer.mask_token = "_"  # run_mntp.py: mask_token_type blank
    torch.manual_seed(5)
    ids, chosen = objective.mask(inputs["input_ids"], inputs["attention_mask"])
    torch.manual_seed(5)
    their_ids, labels = hf_mask_tokens(inputs["input_ids"], theirs_tokenizer, probability, all_mask=masking == "all")
    assert torch.equal(ids, their_ids) and torch.equal(chosen, labels != -100)
    # The draw frequencies: a share `probability` of the candidates chosen; of those, 80/10/10 or all the mask token.
    candidates = inputs["attention_mask"].bool() & (inputs["input_ids"] != encoder.tokenizer.bos_token_id)
    assert abs(chosen.sum() / candidates.sum() - probability) < 0.02
    original = inputs["input_ids"][chosen]
    masked, kept = (ids[chosen] == objective.mask_token_id).float().mean(), (ids[chosen] == original).float().mean()
    if masking == "bert":
        assert abs(masked - 0.8) < 0.03 and 0.05 < kept < 0.16  # kept: 10%, and random tokens that drew themselves
    else:
        assert masked == 1.0


def test_the_lm_head_trains_by_default_with_the_authors_gradient(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    tokenizer = make_decoder_tokenizer()
    config = decoder_config("mistral", len(tokenizer), attention="bidirectional")
    torch.manual_seed(1)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "lm")
    tokenizer.save_pretrained(tmp_path / "lm")
    encoder = SentenceEncoder.load(tmp_path / "lm", "mean", attention="bidirectional")
    objective = MaskedNextTokenPrediction(encoder, encoder.tokenizer, 0.3, masking="bert")
    assert objective.lm_head.weight.requires_grad  # the default, as LLM2Vec's head outside the LoRA model
    inputs = encoder.tokenize(SENTENCES)
    output = encoder(inputs)
    torch.manual_seed(2)
    masked_ids, chosen = objective.mask(inputs["input_ids"], inputs["attention_mask"])
    torch.manual_seed(2)
    objective(StepState(list(SENTENCES), [output.pooled], [output.pooled], output, encoder))["mntp"].backward()
    # LLM2Vec's MNTP model: the same checkpoint, bidirectional, its causal-LM loss on the labels of the chosen tokens
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path / "lm")
    theirs.config.is_causal = False
    for module in theirs.modules():
        if isinstance(getattr(module, "is_causal", None), bool):
            module.is_causal = False
    labels = torch.where(chosen, inputs["input_ids"], torch.full_like(chosen, -100, dtype=torch.long))
    logits = theirs(input_ids=masked_ids, attention_mask=inputs["attention_mask"]).logits
    causal_lm_loss(logits, labels).backward()
    torch.testing.assert_close(objective.lm_head.weight.grad, theirs.lm_head.weight.grad, rtol=1e-4, atol=1e-7)


def test_the_mntp_recipes_carry_the_authors_values() -> None:
    for name, backbone, probability, masking in (
        ("llm2vec-mntp-sheared-llama.yaml", "princeton-nlp/Sheared-LLaMA-1.3B", 0.2, "bert"),
        ("llm2vec-mntp-mistral-7b.yaml", "mistralai/Mistral-7B-Instruct-v0.2", 0.8, "all"),
    ):
        recipe = load_recipe(REPO / "recipes" / name)
        (objective,) = recipe.objectives
        assert (recipe.model.backbone, objective["probability"], objective["masking"]) == (
            backbone,
            probability,
            masking,
        )
        assert objective.get("train_lm_head", True) and objective["mask_token"] == "_"
        train = recipe.train
        assert (train.lr, train.batch_size, recipe.model.max_length, train.max_steps) == (5e-5, 32, 512, 1000)
        assert recipe.model.dropout is None and recipe.model.lora == {
            "r": 16,
            "alpha": 32,
            "dropout": 0.05,
            "target_modules": "all-linear",
        }
    for name in ("llm2vec-simcse-sheared-llama.yaml", "llm2vec-simcse-mistral-7b.yaml"):
        recipe = load_recipe(REPO / "recipes" / name)
        assert (recipe.model.pooler, recipe.model.test_bos, recipe.train.keep) == ("mean_padded", False, "last")

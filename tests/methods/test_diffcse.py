"""DiffCSE: the masking, the generator's edit and the conditional replaced-token-detection loss (and its gradients)
equal a reference written from the authors' code (voidism/DiffCSE); its head; a missing or foreign generator is one
line naming the recipe key; a DiffCSE recipe trains and keeps the generator out of every file."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from conftest import (
    DISTINCT_SENTENCES,
    TinyTrainer,
    make_corpus,
    make_tiny_encoder,
    make_tiny_mlm,
    read_metrics,
)
from mlm_reference import authors_mask_tokens
from part_checks import assert_same_gradients, gradients
from resumed_runs import interrupted_and_resumed
from safetensors.torch import load_file
from torch import Tensor, nn

from csekit.core.errors import CsekitError
from csekit.encoding.encoder import EncoderOutput, SentenceEncoder
from csekit.parts.heads import HEADS
from csekit.parts.heads.projection import BatchNormProjection
from csekit.parts.objectives import OBJECTIVES
from csekit.parts.objectives.diffcse import ReplacedTokenDetection
from csekit.parts.objectives.masking import mask_tokens
from csekit.parts.step_state import StepState
from csekit.parts.views.repetition import batch_generator

SENTENCES = DISTINCT_SENTENCES[:4]


def authors_conditional_electra(
    generator: nn.Module,
    discriminator: nn.Module,
    electra_head: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    mlm_input_ids: Tensor,
    pooler_output: Tensor,
    cls_token: int,
) -> tuple[Tensor, Tensor]:
    """models.py `cl_forward`'s conditional ELECTRA part, with modeling_bert.py's `cls_input` (the embedding output's
    first position replaced by the sentence vector): (its loss before lambda, the generator's edit)."""
    with torch.no_grad():
        g_pred = generator(mlm_input_ids, attention_mask)[0].argmax(-1)
    g_pred[:, 0] = cls_token
    replaced = (g_pred != input_ids) * attention_mask
    e_inputs = g_pred * attention_mask
    embedding_output = discriminator.embeddings(input_ids=e_inputs, token_type_ids=torch.zeros_like(e_inputs))
    embedding_output = torch.cat([pooler_output.unsqueeze(1), embedding_output[:, 1:, :]], dim=1)
    extended = (1.0 - attention_mask[:, None, None, :].float()) * torch.finfo(torch.float32).min
    last_hidden_state = discriminator.encoder(embedding_output, attention_mask=extended)[0]
    prediction_scores = electra_head(last_hidden_state)
    e_labels = replaced.view(-1, replaced.size(-1))
    return nn.CrossEntropyLoss()(prediction_scores.view(-1, 2), e_labels.view(-1)), g_pred


def tiny_diffcse(tmp_path: Path, mask_ratio: float = 0.3) -> tuple[SentenceEncoder, ReplacedTokenDetection]:
    encoder = make_tiny_encoder(tmp_path / "tok", initializer_range=0.2)
    generator = make_tiny_mlm(tmp_path / "generator", seed=1, initializer_range=0.2)
    objective = ReplacedTokenDetection(encoder, encoder.tokenizer, generator=str(generator), mask_ratio=mask_ratio)
    return encoder, objective


def test_the_masking_draws_as_the_authors_collator(tmp_path: Path) -> None:
    encoder = make_tiny_encoder(tmp_path / "tok")
    tokenizer = encoder.tokenizer
    ids = encoder.pooler.tokenize(tokenizer, [*SENTENCES, "a man"] * 20, 32)["input_ids"]  # pads included
    special = torch.isin(ids, torch.tensor(tokenizer.all_special_ids))
    torch.manual_seed(11)
    expected = authors_mask_tokens(ids, tokenizer, 0.3)
    ours, chosen = mask_tokens(
        ids, special, 0.3, tokenizer.mask_token_id, len(tokenizer), torch.Generator().manual_seed(11)
    )
    assert torch.equal(ours, expected)
    changed = ours != ids
    assert not (changed & ~chosen).any() and not chosen[special].any() and (ours == tokenizer.mask_token_id).any()
    assert abs(float((ours[~special] == tokenizer.mask_token_id).float().mean()) - 0.3 * 0.8) < 0.05


def test_rtd_loss_and_gradients_equal_the_authors_computation(tmp_path: Path) -> None:
    encoder, objective = tiny_diffcse(tmp_path)
    objective.eval()  # no dropout on either side
    tokenizer = encoder.tokenizer
    inputs = encoder.pooler.tokenize(tokenizer, SENTENCES, 32)
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    n, views = len(SENTENCES), 2
    torch.manual_seed(5)
    embeddings = [torch.randn(n, encoder.dim, requires_grad=True) for _ in range(views)]
    their_embeddings = [e.detach().clone().requires_grad_(True) for e in embeddings]
    discriminator, head = copy.deepcopy(objective.discriminator), copy.deepcopy(objective.electra_head)

    # The authors' batch: [batch, num_sent, L], flattened sentence by sentence; masks drawn from the global generator.
    their_ids = torch.stack([ids] * views, dim=1).view(n * views, -1)
    their_mask = torch.stack([mask] * views, dim=1).view(n * views, -1)
    torch.set_rng_state(batch_generator(0, ["diffcse", *SENTENCES]).get_state())
    mlm_input_ids = authors_mask_tokens(their_ids, tokenizer, 0.3)
    pooler_output = torch.stack(their_embeddings, dim=1).view(-1, encoder.dim)
    expected, edit = authors_conditional_electra(
        objective.generator.eval(), discriminator, head, their_ids, their_mask, mlm_input_ids, pooler_output,
        tokenizer.cls_token_id,
    )  # fmt: skip
    replaced = (edit != their_ids) & their_mask.bool()
    assert replaced.any() and (~replaced & their_mask.bool()).any()  # both labels occur
    # The reference's own plumbing: without the condition, its discriminator pass is the model's own.
    plain = discriminator.encoder(
        discriminator.embeddings(input_ids=edit * their_mask, token_type_ids=torch.zeros_like(edit)),
        attention_mask=(1.0 - their_mask[:, None, None, :].float()) * torch.finfo(torch.float32).min,
    )[0]
    own = discriminator(input_ids=edit * their_mask, attention_mask=their_mask).last_hidden_state
    assert torch.allclose(plain[their_mask.bool()], own[their_mask.bool()], atol=1e-5)
    expected.backward()

    output = EncoderOutput(torch.cat(embeddings), None, torch.cat([mask] * views), torch.cat([ids] * views))
    state = StepState(list(SENTENCES), embeddings, embeddings, output, encoder)
    ours = objective(state)["rtd"]
    ours.backward()

    assert torch.allclose(ours, expected, rtol=1e-6, atol=1e-7), (ours, expected)
    for mine, theirs in zip(embeddings, their_embeddings, strict=True):
        assert mine.grad is not None and mine.grad.abs().sum() > 0
        assert torch.allclose(mine.grad, theirs.grad, rtol=1e-5, atol=1e-8)
    theirs_by_name = {**dict(discriminator.named_parameters()), **{f"head.{k}": v for k, v in head.named_parameters()}}
    mine_by_name = {
        **dict(objective.discriminator.named_parameters()),
        **{f"head.{k}": v for k, v in objective.electra_head.named_parameters()},
    }
    assert assert_same_gradients(mine_by_name.items(), gradients(theirs_by_name.items()), rtol=1e-5, atol=1e-8) > 10


def test_the_generator_is_frozen_and_outside_the_state_dict_and_the_discriminator_inside(tmp_path: Path) -> None:
    assert OBJECTIVES.get("diffcse") is ReplacedTokenDetection
    encoder, objective = tiny_diffcse(tmp_path)
    keys = set(objective.state_dict())
    assert any(key.startswith("discriminator.") for key in keys) and "electra_head.weight" in keys
    assert not any("generator" in key for key in keys)
    assert not any(p.requires_grad for p in objective.generator.parameters())
    own = {id(p) for p in encoder.parameters()}
    assert not any(id(p) in own for p in objective.discriminator.parameters())  # a copy, not the encoder's own
    first = objective.discriminator.embeddings.word_embeddings.weight
    assert torch.equal(first, encoder.backbone.embeddings.word_embeddings.weight)  # starting from its weights


def test_the_batchnorm_head_is_the_authors_projection_mlp_and_training_only(tmp_path: Path) -> None:
    assert HEADS.get("batchnorm_mlp") is BatchNormProjection
    head = BatchNormProjection(8)
    reference = nn.Sequential(
        nn.Linear(8, 16, bias=False), nn.BatchNorm1d(16), nn.ReLU(inplace=True), nn.Linear(16, 8, bias=False),
        nn.BatchNorm1d(8, affine=False),
    )  # fmt: skip
    reference.load_state_dict(head.net.state_dict())
    features = torch.randn(6, 8)
    assert torch.allclose(head(features), reference(features), atol=1e-6)
    with pytest.raises(ValueError, match="training-only"):
        BatchNormProjection(8, head_at_test=True)


DIFFCSE_HEAD = ("model.head={name: batchnorm_mlp}", "model.head_at_test=false")


def test_a_missing_or_foreign_generator_is_one_line_naming_the_recipe_key(
    tmp_path: Path, train_tiny: TinyTrainer
) -> None:
    missing = tmp_path / "no-such-generator"
    objectives = f"objectives=[{{name: infonce}}, {{name: diffcse, generator: {missing}, weight: 0.005}}]"
    with pytest.raises(CsekitError, match=r"recipe key objectives\[1\]: generator: .*no-such-generator") as caught:
        train_tiny(*DIFFCSE_HEAD, objectives, steps=2, lines=32)
    assert "\n" not in str(caught.value)
    with pytest.raises(CsekitError, match=r"recipe key objectives\[1\]: option generator is required"):
        train_tiny(*DIFFCSE_HEAD, "objectives=[{name: infonce}, {name: diffcse}]", steps=2, lines=32, name="run2")
    foreign = make_tiny_mlm(tmp_path / "foreign", model_type="bert")
    (foreign / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nother\n", encoding="utf-8")
    (foreign / "tokenizer.json").unlink()
    objectives = f"objectives=[{{name: infonce}}, {{name: diffcse, generator: {foreign}}}]"
    with pytest.raises(CsekitError, match=r"recipe key objectives\[1\]: generator: .*vocabulary is not the backbone"):
        train_tiny(*DIFFCSE_HEAD, objectives, steps=2, lines=32, name="run3")


def test_a_diffcse_recipe_trains_and_saves_the_encoder_alone(tmp_path: Path, train_tiny: TinyTrainer) -> None:
    generator = make_tiny_mlm(tmp_path / "generator", initializer_range=0.2)
    objectives = f"objectives=[{{name: infonce}}, {{name: diffcse, generator: {generator}, weight: 0.005}}]"
    run = train_tiny(*DIFFCSE_HEAD, objectives, steps=2)
    assert run.result.steps == 2
    exported = load_file(next((run.folder / "best").glob("*.safetensors")))
    assert not any("discriminator" in key or "electra" in key or "generator" in key for key in exported)
    checkpoint = load_file(run.folder / "checkpoint" / "model.safetensors")
    assert any("discriminator" in key for key in checkpoint) and not any("generator" in key for key in checkpoint)


def test_a_diffcse_run_interrupted_and_resumed_equals_the_straight_run(tmp_path: Path, tiny_model_dir: Path) -> None:
    """Ctrl-C during step 3, then --resume: the losses and the checkpoint (discriminator, its head, the batch-norm
    head's statistics) of the uninterrupted run."""
    generator = make_tiny_mlm(tmp_path / "generator", initializer_range=0.2)
    objectives = [
        {"name": "infonce", "temperature": 0.05},
        {"name": "diffcse", "generator": str(generator), "mask_ratio": 0.3, "weight": 0.5},
    ]
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("name: diffcse-resume\n", encoding="utf-8")
    corpus = make_corpus(tmp_path / "corpus.txt", lines=96)
    straight, resumed = interrupted_and_resumed(tmp_path, recipe, tiny_model_dir, corpus, objectives, *DIFFCSE_HEAD)
    losses = [(r["step"], r["loss"], r["rtd"]) for r in read_metrics(resumed) if "loss" in r]
    assert len(losses) == 8
    assert losses == [(r["step"], r["loss"], r["rtd"]) for r in read_metrics(straight) if "loss" in r]


def test_the_stand_in_generators_masked_only_loss_is_bert_for_masked_lms_loss(monkeypatch: pytest.MonkeyPatch) -> None:
    """benchmarks/minilm_mlm_generator.py scores only the masked positions (for speed); its loss and gradients are
    those of transformers' `BertForMaskedLM` scoring every position (the mean over labels != -100)."""
    from transformers import BertConfig, BertForMaskedLM

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from minilm_mlm_generator import masked_logits

    torch.manual_seed(0)
    config = BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    model = BertForMaskedLM(config).eval()
    ids = torch.randint(5, 40, (3, 7))
    labels = torch.full_like(ids, -100)
    labels[0, 1], labels[1, 4], labels[2, 2], labels[2, 6] = 7, 11, 3, 30
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}
    reference = model(**batch).loss
    reference.backward()
    expected = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    logits, chosen = masked_logits(model, batch)
    loss = torch.nn.functional.cross_entropy(logits, chosen)
    loss.backward()
    assert chosen.tolist() == [7, 11, 3, 30]
    torch.testing.assert_close(loss, reference)
    for name, grad in expected.items():
        torch.testing.assert_close(dict(model.named_parameters())[name].grad, grad, msg=name)

"""ESimCSE: word repetition, the momentum encoder and its queue against the paper's equations; exact resume."""

from __future__ import annotations

import copy
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import TinyTrainer, make_corpus, make_tiny_encoder
from part_checks import assert_views_come_from_the_batch
from resumed_runs import killed_and_resumed
from safetensors.torch import load_file

from csekit.core.errors import CsekitError
from csekit.parts.heads.mlp import MLPHead
from csekit.parts.negatives import NEGATIVES
from csekit.parts.negatives.momentum import MomentumQueue
from csekit.parts.objectives import InfoNCE
from csekit.parts.views import VIEWS
from csekit.parts.views.repetition import RepetitionViews
from csekit.training.model import ContrastiveModel
from csekit.training.optimization import _param_groups

SENTENCES = ["a man plays guitar", "the dog runs in the park", "she eats food", "it is big and red"]
LAMBDA = 0.995


# --- word repetition -------------------------------------------------------------------------------


def _without_doubles(row: list[int], original: list[int]) -> tuple[list[int], int]:
    """Walk `row` against `original`: each original token appears once or twice in a row; count the doubles."""
    rebuilt, doubled, i = [], 0, 0
    for token in original:
        assert row[i] == token
        rebuilt.append(token)
        i += 1
        if i < len(row) and row[i] == token and (len(rebuilt) == len(original) or original[len(rebuilt)] != token):
            doubled += 1
            i += 1
    assert i == len(row)
    return rebuilt, doubled


def test_repetition_doubles_a_uniform_number_of_tokens_as_the_paper_draws_it(tmp_path: Path) -> None:
    encoder = make_tiny_encoder(tmp_path / "tok", pooler="cls")
    views = RepetitionViews(encoder.tokenizer, encoder.pooler, 32, dup_rate=0.32)
    sentence = "the dog runs in the park and she eats food"
    original = encoder.tokenizer(sentence)["input_ids"]
    n = len(original) - 2  # [CLS] and [SEP] are never repeated
    upper = max(2, int(0.32 * n))  # the paper: dup_len ~ U{0, ..., max(2, int(dup_rate * N))}
    counts: Counter[int] = Counter()
    for i in range(600):
        batch = views([sentence, f"batch {i}"])  # another batch, other draws
        row = batch["input_ids"][2][batch["attention_mask"][2].bool()].tolist()
        assert row[0] == original[0] and row[-1] == original[-1]
        _, doubled = _without_doubles(row, original)
        counts[doubled] += 1
        assert batch["input_ids"][0][: len(original)].tolist() == original  # view 0 is the sentence
    assert set(counts) == set(range(upper + 1))
    expected = 600 / (upper + 1)
    assert all(abs(count - expected) < 0.35 * expected for count in counts.values()), counts


def test_repetition_draws_the_same_views_for_the_same_batch_whatever_the_global_generator(tmp_path: Path) -> None:
    encoder = make_tiny_encoder(tmp_path / "tok", pooler="cls")
    assert_views_come_from_the_batch(RepetitionViews, encoder, SENTENCES, other_seed=8)


def test_repetition_refuses_prompt_poolers_and_bad_rates(tmp_path: Path) -> None:
    encoder = make_tiny_encoder(tmp_path / "tok", pooler="mask")
    with pytest.raises(CsekitError, match="template"):
        RepetitionViews(encoder.tokenizer, encoder.pooler, 32)
    assert VIEWS.get("repetition") is RepetitionViews
    with pytest.raises(ValueError, match="dup_rate"):
        RepetitionViews(encoder.tokenizer, make_tiny_encoder(tmp_path / "t2").pooler, 32, dup_rate=1.5)


# --- the momentum encoder and its queue -------------------------------------------------------------


def esimcse_model(tmp_path: Path, queue_size: int = 6) -> ContrastiveModel:
    encoder = make_tiny_encoder(tmp_path / "tok", pooler="cls")
    head = MLPHead(encoder.dim)
    queue = MomentumQueue(encoder, head, momentum=LAMBDA, queue_size=queue_size)
    return ContrastiveModel(encoder, head, 2, [(InfoNCE(temperature=0.05), 1.0)], [queue])


def esimcse_loss_by_hand(anchors: torch.Tensor, positives: torch.Tensor, queued: torch.Tensor) -> torch.Tensor:
    """The paper's l_i: -log e^{s(h_i,h_i+)/tau} / (sum_j e^{s(h_i,h_j+)/tau} + sum_m e^{s(h_i,h_m)/tau})."""
    losses = []
    for i in range(len(anchors)):
        to_positives = F.cosine_similarity(anchors[i : i + 1].float(), positives.float()) / 0.05
        to_queue = F.cosine_similarity(anchors[i : i + 1].float(), queued.float()) / 0.05
        denominator = torch.exp(to_positives).sum() + torch.exp(to_queue).sum()
        losses.append(-(to_positives[i] - torch.log(denominator)))
    return torch.stack(losses).mean()


def test_momentum_update_queue_and_loss_follow_the_papers_equations(tmp_path: Path) -> None:
    model = esimcse_model(tmp_path)
    queue = model.negatives[0]
    views = RepetitionViews(model.encoder.tokenizer, model.encoder.pooler, 16)
    torch.manual_seed(0)
    inputs = views(SENTENCES)
    model(inputs, SENTENCES)  # step 1: the queue was empty, the batch then enters it
    assert int(queue.queued) == 4
    with torch.no_grad():  # change the trained weights, as an optimizer step would
        for p in [*model.encoder.parameters(), *model.head.parameters()]:
            p.add_(0.01 * torch.randn_like(p))
    theta_m = {k: v.clone() for k, v in queue.momentum_encoder.state_dict().items()}
    queued_before = queue.queue[:4].clone()
    state = model.make_state(inputs, SENTENCES, {})
    queue(state)
    # theta_m <- lambda theta_m + (1 - lambda) theta_e, for every weight of the encoder.
    online = dict(model.encoder.named_parameters())
    for name, value in queue.momentum_encoder.named_parameters():
        torch.testing.assert_close(value, LAMBDA * theta_m[name] + (1 - LAMBDA) * online[name].detach())
    # This step's negatives are the previous step's queued vectors only.
    assert len(state.extra_negatives) == 1
    torch.testing.assert_close(state.extra_negatives[0], queued_before)
    anchors, positives = state.embeddings
    loss = InfoNCE(temperature=0.05)(state)["infonce"]
    torch.testing.assert_close(loss, esimcse_loss_by_hand(anchors, positives, queued_before))
    # The new entries: the momentum encoder (no dropout) and head on the positive view's inputs.
    reference_encoder, reference_head = copy.deepcopy(queue.momentum_encoder), copy.deepcopy(queue.momentum_head)
    reference_encoder.eval()
    with torch.no_grad():
        rows = {key: value[4:] for key, value in inputs.items()}
        expected = reference_head(reference_encoder(rows).pooled)
    torch.testing.assert_close(queue.queue[4:6], expected[:2])
    torch.testing.assert_close(queue.queue[:2], expected[2:])  # first in, first out: the oldest overwritten
    assert int(queue.queued) == 6 and int(queue.pointer) == 2


def test_the_authors_queue_is_view_0_of_the_momentum_encoder_through_the_online_head(tmp_path: Path) -> None:
    """caskcsg/sentemb ESimCSE/esimcse/models.py L123-139, L186-192 and trainers.py L619-636: after the step's
    forward pass (which updates the momentum model, the encoder only, L161-163), the model in eval mode encodes
    input_ids[:, 0] (the sentence) with momentum_model, applies the online cls.mlp, and the result is queued."""
    encoder = make_tiny_encoder(tmp_path / "tok", pooler="cls")
    head = MLPHead(encoder.dim)
    queue = MomentumQueue(encoder, head, momentum=LAMBDA, queue_size=8, view=0, queue_head="online")
    model = ContrastiveModel(encoder, head, 2, [(InfoNCE(temperature=0.05), 1.0)], [queue])
    assert queue.momentum_head is None  # the authors' momentum model copies the encoder only
    views = RepetitionViews(encoder.tokenizer, encoder.pooler, 16)
    torch.manual_seed(0)
    inputs = views(SENTENCES)
    model(inputs, SENTENCES)
    with torch.no_grad():  # an optimizer step
        for p in [*encoder.parameters(), *head.parameters()]:
            p.add_(0.01 * torch.randn_like(p))
    theta_m = {k: v.clone() for k, v in queue.momentum_encoder.state_dict().items()}
    queue(model.make_state(inputs, SENTENCES, {}))
    # The authors' computation: param_m = param_m * momentum + param * (1 - momentum), then eval-mode
    # momentum_model on the original sentences, then the online MLP (dense + tanh), detached.
    authors_momentum_model = copy.deepcopy(encoder).eval()
    online = dict(encoder.named_parameters())
    with torch.no_grad():
        for name, value in authors_momentum_model.named_parameters():
            value.copy_(theta_m[name] * LAMBDA + online[name] * (1 - LAMBDA))
        originals = {key: value[:4] for key, value in inputs.items()}
        expected = torch.tanh(head.linear(authors_momentum_model(originals).pooled))
    torch.testing.assert_close(queue.queue[4:8], expected)
    # The paper's reading (view 1, a momentum copy of the head) queues other vectors.
    with torch.no_grad():
        repeated = {key: value[4:] for key, value in inputs.items()}
        assert not torch.allclose(expected, torch.tanh(head.linear(authors_momentum_model(repeated).pooled)))


@pytest.mark.parametrize("recipe_file", ["esimcse-bert-base.yaml", "esimcse-roberta-base.yaml", "esimcse-minilm.yaml"])
def test_the_esimcse_recipes_queue_as_the_authors_code(recipe_file: str) -> None:
    from csekit.training.recipe import load_recipe

    (spec,) = load_recipe(Path(__file__).resolve().parents[2] / "recipes" / recipe_file).negatives
    assert spec["name"] == "momentum_queue" and spec["view"] == 0 and spec["queue_head"] == "online"


def test_momentum_state_is_checkpointed_never_optimized(tmp_path: Path) -> None:
    model = esimcse_model(tmp_path)
    keys = set(model.state_dict())
    assert {"negatives.0.queue", "negatives.0.queued", "negatives.0.pointer"} <= keys
    assert any(key.startswith("negatives.0.momentum_encoder.") for key in keys)
    optimized = {id(p) for group in _param_groups(model, tiny_recipe_stub()) for p in group["params"]}
    assert not any(id(p) in optimized for p in model.negatives[0].parameters())
    model.train()
    assert not model.negatives[0].momentum_encoder.training  # no dropout in the momentum encoder


def tiny_recipe_stub():  # type: ignore[no-untyped-def]
    from csekit.training.recipe import load_recipe

    return load_recipe(None)


def test_bad_momentum_options_name_the_recipe_key(train_tiny: TinyTrainer) -> None:
    for option in ("momentum: 1.5", "queue_size: 0", "queue_head: ema", "view: -1"):
        with pytest.raises(CsekitError, match=r"negatives\[0\]"):  # a view of -1: when the recipe is loaded
            train_tiny(f"negatives=[{{name: momentum_queue, {option}}}]", lines=32)
    assert NEGATIVES.get("momentum_queue") is MomentumQueue


# --- training and exact resume ------------------------------------------------------------------------


def esimcse_recipe(model_dir: Path, corpus: Path, marker: Path) -> str:
    return f"""
model: {{backbone: "{model_dir}", pooler: cls, max_length: 16, head: {{name: mlp}}, head_at_test: false}}
data: {{corpus: "{corpus}", views: {{name: repetition, dup_rate: 0.32}}}}
train: {{batch_size: 16, lr: 1.0e-3, max_steps: 12, eval_every: 4, log_every: 1, dev_task: none, seed: 7}}
negatives:
  - {{name: momentum_queue, momentum: 0.995, queue_ratio: 2.5}}
objectives:
  - {{name: infonce, temperature: 0.05}}
  - {{name: kill_once, weight: 0.0, at_call: 7, marker: "{marker}"}}
"""


def test_momentum_encoder_and_queue_survive_sigkill_and_resume_bit_exactly(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """Killed during step 7, resumed from step 4's checkpoint: every tensor, the momentum encoder's weights and the
    queue included, bit for bit, and the same losses."""
    corpus = make_corpus(tmp_path / "corpus.txt", lines=128)  # 8 steps per epoch: the run crosses an epoch
    at_the_kill: dict[str, torch.Tensor] = {}

    def queue_full_at_the_kill(run: Path) -> None:
        at_the_kill.update(load_file(run / "checkpoint" / "model.safetensors"))
        assert int(at_the_kill["negatives.0.queued"]) == 40  # 2.5 x 16, full after 3 steps

    _, resumed = killed_and_resumed(
        tmp_path, lambda marker: esimcse_recipe(tiny_model_dir, corpus, marker), queue_full_at_the_kill
    )
    final = load_file(resumed / "checkpoint" / "model.safetensors")
    assert not torch.equal(final["negatives.0.queue"], at_the_kill["negatives.0.queue"])


def test_an_esimcse_recipe_trains_and_exports_only_the_encoder(train_tiny: TinyTrainer) -> None:
    run = train_tiny("model.head={name: mlp}", "data.views={name: repetition}", "negatives=[{name: momentum_queue}]")
    assert run.result.steps == 3
    exported = load_file(next((run.folder / "best").glob("*.safetensors")))
    assert not any("momentum" in key or "queue" in key for key in exported)
    assert len(run.losses) == 3

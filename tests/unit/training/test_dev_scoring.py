"""Dev scoring during training (checkpoint selection) as the authors' code scored it; the saved model unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import REPO, TinyTrainer, make_data_dir
from safetensors.torch import load_file

from csekit.core.errors import CsekitError
from csekit.encoding.encoder import SentenceEncoder
from csekit.encoding.representation import Reading
from csekit.evaluation.sts import evaluate_dev
from csekit.parts.heads.mlp import MLPHead
from csekit.training.recipe import load_recipe


def run(train_tiny: TinyTrainer, *extra: str) -> tuple[Path, Path, dict]:
    """Two steps, dev (STS-B) scored at step 0 (the start) and 2: the run folder, the data folder and step 2's record
    (the model of last/; best/ may be the start)."""
    data = make_data_dir(train_tiny.tmp_path / "data")
    trained = train_tiny("train.dev_task=stsb-dev", *extra, steps=2, eval_every=2, data_dir=data)
    (record,) = [r for r in trained.metrics if "stsb-dev" in r and r["step"] == 2]
    return trained.folder, data, record


def test_dev_with_head_scores_through_the_train_only_head_and_saves_without_it(train_tiny: TinyTrainer) -> None:
    """MixCSE's code (no --mlp_only_train): sentemb_forward applies cls.mlp at dev (models_mix.py L328-330)."""
    folder, data, record = run(train_tiny, "train.dev_with_head=true", "model.head_at_test=false")
    best = SentenceEncoder.load(folder / "last")
    assert (
        best.head is None
        and json.loads((folder / "last" / "csekit.json").read_text())["representation"]["head"] is None
    )
    weights = load_file(folder / "checkpoint" / "model.safetensors")  # the head as it was at step 2
    head = MLPHead(best.dim)
    head.load_state_dict(
        {key.removeprefix("head."): value for key, value in weights.items() if key.startswith("head.")}
    )

    def through_the_head(sentences: list[str]) -> np.ndarray:
        with torch.no_grad():
            return head(torch.from_numpy(best.encode(sentences))).numpy()

    assert evaluate_dev(through_the_head, data, "stsb-dev")["stsb-dev"] == pytest.approx(record["stsb-dev"], abs=1e-6)
    assert evaluate_dev(best.encode, data, "stsb-dev")["stsb-dev"] != pytest.approx(record["stsb-dev"], abs=1e-6)


def test_dev_denoise_scores_with_promptberts_template_denoising_in_eval_mode(train_tiny: TinyTrainer) -> None:
    """PromptBERT's code scores dev with its training arguments: the [MASK] state minus the template alone's
    (models.py L290-303, L362-368), in eval mode without gradient; its final test has no denoising."""
    folder, data, record = run(train_tiny, "model.pooler=mask_denoised", "train.dev_denoise=true")
    best = SentenceEncoder.load(folder / "last")
    assert best.pooler.name == "mask"  # the saved model is the plain mask pooler, as without dev_denoise
    denoising = SentenceEncoder.load(folder / "last", "mask_denoised", reading=Reading(templates=best.pooler.templates))
    denoising.train()  # the pooler denoises in training (tests/test_promptbert.py checks it by hand) ...
    denoising.backbone.eval()  # ... and the backbone runs without dropout, as at evaluation

    def denoised(sentences: list[str]) -> np.ndarray:
        with torch.no_grad():
            return denoising(denoising.tokenize(sentences, view=0)).pooled.numpy()

    assert evaluate_dev(denoised, data, "stsb-dev")["stsb-dev"] == pytest.approx(record["stsb-dev"], abs=1e-6)
    assert evaluate_dev(best.encode, data, "stsb-dev")["stsb-dev"] != pytest.approx(record["stsb-dev"], abs=1e-6)
    assert not denoising.pooler.denoise_at_test


def test_dev_pooler_output_scores_the_backbones_pooler_layer_and_saves_the_cls_model(train_tiny: TinyTrainer) -> None:
    """DCLR's code scores dev on `pooler_output` (BERT's pooler on [CLS], trainers.py L106-118), tests on [CLS]."""
    folder, data, record = run(train_tiny, "train.dev_pooler_output=true")
    best = SentenceEncoder.load(folder / "last")
    assert best.pooler.name == "cls"  # the saved model reads [CLS], as without the key
    through_the_pooler_layer = SentenceEncoder.load(folder / "last", pooler="pooler_output")
    scored = evaluate_dev(through_the_pooler_layer.encode, data, "stsb-dev")["stsb-dev"]
    assert scored == pytest.approx(record["stsb-dev"], abs=1e-6)
    assert evaluate_dev(best.encode, data, "stsb-dev")["stsb-dev"] != pytest.approx(record["stsb-dev"], abs=1e-6)


def test_dev_pooler_output_leaves_the_encoder_as_it_found_it(tiny_model_dir: Path) -> None:
    from csekit.training.dev_scoring import dev_encoder

    encoder = SentenceEncoder.load(tiny_model_dir)
    layer = encoder.backbone.pooler
    frozen = [parameter.requires_grad for parameter in layer.parameters()]
    with dev_encoder(encoder, torch.nn.Identity(), load_recipe(None, ["train.dev_pooler_output=true"]).train) as dev:
        assert dev.pooler.name == "pooler_output" and dev.backbone is encoder.backbone
        assert encoder.pooler.name == "cls"  # the saved representation is never changed
    assert encoder.pooler.name == "cls"
    assert [parameter.requires_grad for parameter in layer.parameters()] == frozen == [False, False]


@pytest.mark.parametrize(("dev_precision", "expected"), [("fp32", "fp32"), ("training", "bf16")])
def test_dev_is_encoded_in_fp32_whatever_the_training_precision(
    train_tiny: TinyTrainer, monkeypatch: pytest.MonkeyPatch, dev_precision: str, expected: str
) -> None:
    precisions: list[str] = []
    encode = SentenceEncoder.encode

    def recording(self: SentenceEncoder, sentences: list[str], *args: object, **kwargs: object) -> np.ndarray:
        precisions.append(str(kwargs.get("precision")))
        return encode(self, sentences, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(SentenceEncoder, "encode", recording)
    run(train_tiny, "train.precision=bf16", f"train.dev_precision={dev_precision}")
    assert precisions and set(precisions) == {expected}


@pytest.mark.parametrize(
    ("override", "key", "message"),
    [
        ("train.dev_denoise=true", "train.dev_denoise", "needs model.pooler mask_denoised"),
        ("train.dev_precision=bf16", "train.dev_precision", "must be fp32 or training"),
        (
            "model.template_positions=from_zero",
            "model.template_positions",
            "from_zero is for model.pooler mask_denoised",
        ),
        ("model.template_positions=zero", "model.template_positions", "must be row or from_zero"),
        ("train.dev_pooler_output=true model.pooler=mean", "train.dev_pooler_output", "reads the .CLS. state"),
    ],
)
def test_dev_scoring_keys_that_do_not_fit_the_model_are_refused(override: str, key: str, message: str) -> None:
    with pytest.raises(CsekitError, match=rf"recipe key {key} {message}"):
        load_recipe(None, override.split(" "))
    with pytest.raises(CsekitError, match=r"train\.dev_with_head needs a training head"):
        load_recipe(None, ["model.head={name: none}", "train.dev_with_head=true"])


def test_the_dclr_authors_code_recipe_selects_on_the_pooler_layer() -> None:
    recipe = load_recipe(REPO / "recipes" / "dclr-bert-base-authors-code.yaml")
    assert recipe.train.dev_pooler_output and recipe.model.pooler == "cls" and not recipe.model.head_at_test


@pytest.mark.parametrize(
    ("recipe_file", "with_head", "denoise"),
    [
        ("mixcse-bert-base.yaml", True, False),
        ("promptbert-bert-base.yaml", False, True),
        ("promptbert-roberta-base.yaml", False, True),
    ],
)
def test_the_mixcse_and_promptbert_recipes_select_as_their_authors_code(
    recipe_file: str, with_head: bool, denoise: bool
) -> None:
    recipe = load_recipe(REPO / "recipes" / recipe_file)
    assert (recipe.train.dev_with_head, recipe.train.dev_denoise) == (with_head, denoise)
    assert not recipe.model.head_at_test

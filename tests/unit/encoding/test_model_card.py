"""The model card (README.md) of saved model folders: its content per recipe, and that loading ignores it."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from conftest import REPO, TinyTrainer, auto_precision, make_data_dir

from csekit.encoding.encoder import SentenceEncoder
from csekit.encoding.model_card import BIBTEX, CARD_FILE, methods_used, render_model_card
from csekit.training.recipe import Recipe, load_recipe
from csekit.training.trainer import train

EXPECTED_METHODS = {
    "simcse-bert-base": ["simcse"],
    "dclr-bert-base": ["simcse", "dclr"],
    "dclr-bert-base-authors-code": ["simcse", "dclr"],
    "whitenedcse-bert-base": ["simcse", "whitenedcse"],
    "slt-fai-simcse": ["simcse", "slt_fai"],
    "slt-fai-consert-sts": ["simcse", "slt_fai", "consert"],
    "osscse-bert-base": ["simcse", "osscse"],
    "combined-minilm": ["simcse", "dclr", "whitenedcse", "slt_fai", "osscse"],
    "mixcse-bert-base": ["simcse", "mixcse"],
    "promptbert-bert-base": ["simcse", "promptbert"],
    "sncse-bert-base": ["simcse", "sncse"],
    "sncse+dclr-minilm": ["simcse", "dclr", "sncse"],
    "esimcse-bert-base": ["simcse", "esimcse"],
    "rankcse-minilm": ["simcse", "rankcse"],
    "ct-bert-base": ["simcse", "contrastive_tension"],
    "matryoshka-simcse-minilm": ["simcse", "matryoshka"],
    "cropping-bert-base": ["simcse", "contriever", "cropping"],
    "tsdae-bert-base": ["simcse", "tsdae"],
    "diffcse-bert-base": ["simcse", "diffcse"],
    "diffcse-roberta-base": ["simcse", "diffcse"],
    "diffcse-minilm": ["simcse", "diffcse"],
}


def test_a_method_inside_matryoshka_is_cited_too() -> None:
    recipe = {"objectives": [{"name": "matryoshka", "dims": [8], "objective": {"name": "bml"}}]}
    assert methods_used(recipe, "cls") == ["simcse", "sncse", "matryoshka"]


def bibtex_keys(card: str) -> list[str]:
    return re.findall(r"^@\w+\{(\w+),", card, flags=re.MULTILINE)


@pytest.mark.parametrize("name", sorted(EXPECTED_METHODS))
def test_each_shipped_recipe_cites_the_methods_of_its_parts(name: str) -> None:
    recipe = dataclasses.asdict(load_recipe(REPO / "recipes" / f"{name}.yaml"))
    assert methods_used(recipe, recipe["model"]["pooler"]) == EXPECTED_METHODS[name]


def test_bibtex_entries_are_well_formed_and_distinct() -> None:
    keys = [bibtex_keys(entry) for entry in BIBTEX.values()]
    assert all(len(found) == 1 for found in keys), keys
    assert len({found[0] for found in keys}) == len(BIBTEX)
    for entry in BIBTEX.values():
        assert entry.count("{") == entry.count("}")
        assert re.search(r"^\s*(title|author|year) = ", entry, flags=re.MULTILINE)


def test_a_model_saved_outside_training_has_a_card_with_simcse_only(
    tiny_encoder: SentenceEncoder, tmp_path: Path
) -> None:
    tiny_encoder.save(tmp_path / "model")
    card = (tmp_path / "model" / CARD_FILE).read_text(encoding="utf-8")
    assert bibtex_keys(card) == ["gao2021simcse"]
    assert "## Training" not in card and "from csekit import SentenceEncoder" in card
    assert "SentenceTransformer(" in card


def test_the_mask_pooler_card_does_not_offer_sentence_transformers() -> None:
    card = render_model_card(base_model="m", pooler="mask", csekit_version="0", facts=None)
    assert "SentenceTransformer(" not in card
    assert bibtex_keys(card) == ["gao2021simcse", "shi2023osscse"]


def test_a_trained_models_card_gives_recipe_corpus_and_the_dev_score_it_was_kept_for(
    tmp_path: Path, tiny_model_dir: Path, train_tiny: TinyTrainer, native_bf16: bool
) -> None:
    data = make_data_dir(tmp_path / "data")
    run = train_tiny("train.dev_task=stsb-dev", "model.pooler=mean", steps=4, eval_every=2, data_dir=data)
    result = run.result
    card = (run.folder / "best" / CARD_FILE).read_text(encoding="utf-8")
    assert f"Base model: `{tiny_model_dir}`" in card
    assert f"Corpus: `{tmp_path / 'corpus.txt'}`, 64 sentences." in card
    for row in (
        "| pooler | mean |",
        "| head | mlp (training only) |",
        "| views | dropout |",
        "| batch size (sentences) | 16 |",
        "| learning rate | 0.0005 |",
    ):
        assert row in card, row
    assert "| objectives | infonce (temperature=0.05), weight 1.0 |" in card
    assert "| max_length (tokens) | 16 |" in card and f"| precision | {auto_precision(native_bf16)} |" in card
    assert f"| steps | {result.best_step} of 4 |" in card
    assert result.best_score is not None
    assert f"Dev score (selection metric): stsb-dev = {result.best_score * 100:.2f} at step {result.best_step}." in card
    assert bibtex_keys(card) == ["gao2021simcse"]
    last_scores = [r for r in run.metrics if "stsb-dev" in r][-1]
    last_card = (run.folder / "last" / CARD_FILE).read_text(encoding="utf-8")
    assert f"| align | {last_scores['align']:.4f} |" in last_card  # a distance, not a correlation x100
    assert f"| stsb-dev | {last_scores['stsb-dev'] * 100:.2f} |" in last_card and "| steps | 4 of 4 |" in last_card


def test_a_combined_runs_card_cites_every_method_it_composed(tmp_path: Path, tiny_combined_recipe: Recipe) -> None:
    train(tiny_combined_recipe, tmp_path / "run", show_progress=False)
    card = (tmp_path / "run" / "best" / CARD_FILE).read_text(encoding="utf-8")
    assert bibtex_keys(card) == [
        "gao2021simcse",
        "zhou2022dclr",
        "zhuo2023whitenedcse",
        "wang2023sltfai",
        "shi2023osscse",
    ]
    assert "| negatives | dclr_noise (" in card and "| weighting | dclr (" in card
    assert "slt_fai_at (" in card and "margin (" in card and "recall (" in card
    assert "(kept at test time)" in card

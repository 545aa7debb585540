"""Parts of different papers compose in one recipe and train end to end (tiny random model)."""

from __future__ import annotations

from pathlib import Path

from test_training import make_corpus, read_metrics, tiny_recipe

from csekit.config import load_recipe
from csekit.encoder import SentenceEncoder
from csekit.training import train

REPO = Path(__file__).resolve().parents[1]


def test_dclr_with_whitening_trains_and_reloads(tmp_path: Path, tiny_model_dir: Path) -> None:
    corpus = make_corpus(tmp_path / "corpus.txt", lines=64)
    recipe = tiny_recipe(
        tiny_model_dir,
        corpus,
        "train.max_steps=3",
        "model.pooler=mean",
        "model.head={name: whitening, whitening: shuffled_group, group_size: 8, num_positives: 3}",
        "model.head_at_test=true",
        "negatives=[{name: dclr_noise, ratio: 1.0, steps: 2}]",
        "weighting={name: dclr, model: self, phi: 0.9}",
        "objectives=[{name: multi_positive, temperature: 0.05}]",
    )
    result = train(recipe, tmp_path / "run", show_progress=False)
    assert result.steps == 3
    records = [r for r in read_metrics(tmp_path / "run") if "loss" in r]
    assert len(records) == 3 and all(r["loss"] > 0 for r in records)
    reloaded = SentenceEncoder.load(tmp_path / "run" / "best")
    assert reloaded.head is not None  # the whitening head is kept at test time, folded into Linear + tanh
    assert reloaded.encode(["a man plays the guitar"]).shape == (1, 32)


def test_shipped_composition_recipes_name_parts_of_both_papers() -> None:
    for name in ("dclr+whitened-bert-base.yaml", "dclr+whitened-minilm.yaml"):
        recipe = load_recipe(REPO / "recipes" / name)
        assert recipe.model.head["name"] == "whitening"
        assert [n["name"] for n in recipe.negatives] == ["dclr_noise"]
        assert recipe.weighting is not None and recipe.weighting["name"] == "dclr"
        assert [o["name"] for o in recipe.objectives] == ["multi_positive"]

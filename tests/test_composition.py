"""Parts of different papers compose in one recipe and train end to end (tiny random model)."""

from __future__ import annotations

from pathlib import Path

from conftest import make_corpus, read_metrics, tiny_recipe

from csekit.encoding.encoder import SentenceEncoder
from csekit.training.recipe import Recipe, load_recipe
from csekit.training.trainer import train

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


def test_a_kept_head_survives_checkpoint_and_resume(tmp_path: Path, tiny_model_dir: Path, test_parts: None) -> None:
    """With head_at_test the head is shared by the model and its encoder: the checkpoint must restore it."""
    import pytest
    from safetensors.torch import load_file

    corpus = make_corpus(tmp_path / "corpus.txt", lines=64)
    marker = tmp_path / "raised"
    parts = [
        "train.max_steps=4",
        "train.eval_every=2",
        "model.pooler=mean",
        "model.head={name: whitening, whitening: shuffled_group, group_size: 8, num_positives: 3}",
        "model.head_at_test=true",
    ]
    crash = f"{{name: raise_once, weight: 0.0, at_call: 3, marker: '{marker}'}}"
    objectives = f"objectives=[{{name: multi_positive}}, {crash}]"
    marker.write_text("not this run", encoding="utf-8")
    train(tiny_recipe(tiny_model_dir, corpus, *parts, objectives), tmp_path / "straight", show_progress=False)
    marker.unlink()
    recipe = tiny_recipe(tiny_model_dir, corpus, *parts, objectives)
    with pytest.raises(RuntimeError, match="crash for the test"):
        train(recipe, tmp_path / "resumed", show_progress=False)
    train(recipe, tmp_path / "resumed", resume=True, show_progress=False)
    expected = load_file(tmp_path / "straight" / "checkpoint" / "model.safetensors")
    actual = load_file(tmp_path / "resumed" / "checkpoint" / "model.safetensors")
    assert any("head.whitening.running_covariance" in key for key in expected)
    assert set(actual) == set(expected)
    for key, tensor in expected.items():
        assert (actual[key] == tensor).all(), key


def test_all_four_papers_compose_and_train(tmp_path: Path, tiny_combined_recipe: Recipe) -> None:
    """combined-*.yaml's parts on a tiny model: whitening + DCLR + SLT-FAI + OssCSE terms, every one active."""
    train(tiny_combined_recipe, tmp_path / "run", show_progress=False)
    records = [r for r in read_metrics(tmp_path / "run") if "loss" in r]
    assert len(records) == 3
    for name in ("multi_positive", "slt_fai_at", "slt_fai_isf", "margin", "recall"):
        assert name in records[-1], name
    assert all(records[-1][name] > 0 for name in ("multi_positive", "slt_fai_at", "slt_fai_isf", "recall"))
    reloaded = SentenceEncoder.load(tmp_path / "run" / "best")
    assert reloaded.encode(["a man plays"]).shape == (1, 32)

"""Parts of different papers compose in one recipe and train end to end (tiny random model)."""

from __future__ import annotations

from pathlib import Path

from conftest import TinyTrainer, assert_same_checkpoint_weights, read_metrics

from csekit.encoding.encoder import SentenceEncoder
from csekit.training.recipe import Recipe, load_recipe
from csekit.training.trainer import train

REPO = Path(__file__).resolve().parents[2]


KEPT_WHITENING_HEAD = (
    "model.pooler=mean",
    "model.head={name: whitening, whitening: shuffled_group, group_size: 8, num_positives: 3}",
    "model.head_at_test=true",
)
"""WhitenedCSE's head on mean pooling, kept at test time."""


def test_dclr_with_whitening_trains_and_reloads(train_tiny: TinyTrainer) -> None:
    run = train_tiny(
        *KEPT_WHITENING_HEAD,
        "negatives=[{name: dclr_noise, ratio: 1.0, steps: 2}]",
        "weighting={name: dclr, model: self, phi: 0.9}",
        "objectives=[{name: multi_positive, temperature: 0.05}]",
    )
    assert run.result.steps == 3
    assert len(run.losses) == 3 and all(r["loss"] > 0 for r in run.losses)
    reloaded = SentenceEncoder.load(run.folder / "best")
    assert reloaded.head is not None  # the whitening head is kept at test time, folded into Linear + tanh
    assert reloaded.encode(["a man plays the guitar"]).shape == (1, 32)


def test_shipped_composition_recipes_name_parts_of_both_papers() -> None:
    for name in ("dclr+whitened-bert-base.yaml", "dclr+whitened-minilm.yaml"):
        recipe = load_recipe(REPO / "recipes" / name)
        assert recipe.model.head["name"] == "whitening"
        assert [n["name"] for n in recipe.negatives] == ["dclr_noise"]
        assert recipe.weighting is not None and recipe.weighting["name"] == "dclr"
        assert [o["name"] for o in recipe.objectives] == ["multi_positive"]


def test_a_kept_head_survives_checkpoint_and_resume(tmp_path: Path, train_tiny: TinyTrainer, test_parts: None) -> None:
    """With head_at_test the head is shared by the model and its encoder: the checkpoint must restore it."""
    import pytest
    from safetensors.torch import load_file

    marker = tmp_path / "raised"
    crash = f"{{name: raise_once, weight: 0.0, at_call: 3, marker: '{marker}'}}"
    parts = (*KEPT_WHITENING_HEAD, f"objectives=[{{name: multi_positive}}, {crash}]")
    marker.write_text("not this run", encoding="utf-8")
    straight = train_tiny(*parts, steps=4, eval_every=2, name="straight")
    marker.unlink()
    with pytest.raises(RuntimeError, match="crash for the test"):
        train_tiny(*parts, steps=4, eval_every=2, name="resumed")
    train(straight.recipe, tmp_path / "resumed", resume=True, show_progress=False)
    expected = load_file(straight.folder / "checkpoint" / "model.safetensors")
    assert any("head.whitening.running_covariance" in key for key in expected)
    assert_same_checkpoint_weights(straight.folder, tmp_path / "resumed")


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

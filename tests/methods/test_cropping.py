"""Cropping views: span lengths and starts against Contriever's `randomcrop` distribution; composable with DCLR."""

from __future__ import annotations

from collections import Counter
from fractions import Fraction
from pathlib import Path

import pytest
import torch
from conftest import TinyTrainer, make_tiny_encoder
from part_checks import assert_views_come_from_the_batch
from scipy.stats import chisquare

from csekit.core.errors import CsekitError
from csekit.parts.views import VIEWS
from csekit.parts.views.cropping import CroppingViews, crop_span
from csekit.training.recipe import load_recipe

SENTENCES = ["a man plays guitar", "the dog runs in the park", "she eats food", "it is big and red"]


def exact_distribution(n: int, ratio_min: float, ratio_max: float, min_tokens: int) -> dict[tuple[int, int], float]:
    """P(start, length) of Contriever's crop, enumerated: r ~ U(a, b), length = max(min(m, n), floor(n r)), start
    uniform over the n - length + 1 places. floor(n r) = L for r in [L/n, (L+1)/n), intersected with [a, b]."""
    a, b = Fraction(ratio_min), Fraction(ratio_max)
    by_length: Counter[int] = Counter()
    for floor_length in range(n + 1):
        low, high = max(a, Fraction(floor_length, n)), min(b, Fraction(floor_length + 1, n))
        if high > low:
            by_length[max(min(min_tokens, n), floor_length)] += float((high - low) / (b - a))
    return {(start, length): p / (n - length + 1) for length, p in by_length.items() for start in range(n - length + 1)}


@pytest.mark.parametrize(
    ("n", "ratio_min", "ratio_max", "min_tokens"),
    [(20, 0.1, 0.5, 1), (5, 0.1, 0.5, 1), (12, 0.3, 0.9, 0), (7, 0.0, 1.0, 0)],
)
def test_crop_spans_follow_contrievers_distribution(
    n: int, ratio_min: float, ratio_max: float, min_tokens: int
) -> None:
    expected = exact_distribution(n, ratio_min, ratio_max, min_tokens)
    draws = 20_000
    generator = torch.Generator().manual_seed(1234)
    seen = Counter(crop_span(n, ratio_min, ratio_max, generator, min_tokens) for _ in range(draws))
    assert set(seen) <= set(expected)  # no (start, length) outside the support
    cells = sorted(cell for cell, p in expected.items() if p > 0)
    observed = [seen[cell] for cell in cells]
    predicted = [expected[cell] * draws for cell in cells]
    assert abs(sum(predicted) - draws) < 1e-6
    assert chisquare(observed, predicted).pvalue > 1e-3, (n, ratio_min, ratio_max)


def test_a_short_sentence_keeps_at_least_min_tokens() -> None:
    generator = torch.Generator().manual_seed(0)
    lengths = Counter(crop_span(5, 0.1, 0.5, generator, 1)[1] for _ in range(4000))
    assert set(lengths) == {1, 2}  # floor(5 r) is 0, 1 or 2 for r in [0.1, 0.5); 0 becomes 1
    assert abs(lengths[1] / 4000 - 0.75) < 0.03  # r < 0.4: P = 0.3 / 0.4
    zero = Counter(crop_span(5, 0.1, 0.5, generator, 0)[1] for _ in range(4000))
    assert 0 in zero  # min_tokens 0: Contriever's rule, empty crops included


def test_each_view_is_a_contiguous_span_wrapped_in_the_special_tokens(tmp_path: Path) -> None:
    encoder = make_tiny_encoder(tmp_path / "tok", pooler="cls")
    views = CroppingViews(encoder.tokenizer, encoder.pooler, 32, num_views=3, ratio_min=0.2, ratio_max=0.8)
    batch = views(SENTENCES)
    assert batch["input_ids"].shape[0] == 3 * len(SENTENCES)
    for view in range(3):
        for i, sentence in enumerate(SENTENCES):
            original = encoder.tokenizer(sentence)["input_ids"]
            content, n = original[1:-1], len(original) - 2
            row = batch["input_ids"][view * len(SENTENCES) + i]
            row = row[batch["attention_mask"][view * len(SENTENCES) + i].bool()].tolist()
            assert row[0] == original[0] and row[-1] == original[-1]
            crop = row[1:-1]
            assert max(1, int(0.2 * n)) <= len(crop) <= int(0.8 * n)
            assert any(content[s : s + len(crop)] == crop for s in range(n - len(crop) + 1))


def test_crops_are_drawn_per_batch_not_from_the_global_generator(tmp_path: Path) -> None:
    encoder = make_tiny_encoder(tmp_path / "tok", pooler="cls")
    assert_views_come_from_the_batch(CroppingViews, encoder, SENTENCES, other_seed=5)


def test_cropping_refuses_prompt_poolers_and_bad_ratios(tmp_path: Path) -> None:
    assert VIEWS.get("cropping") is CroppingViews
    with pytest.raises(CsekitError, match="template"):
        CroppingViews(
            make_tiny_encoder(tmp_path / "m", pooler="mask").tokenizer,
            make_tiny_encoder(tmp_path / "n", pooler="mask").pooler,
            32,
        )
    encoder = make_tiny_encoder(tmp_path / "tok")
    for options in ({"ratio_min": 0.6, "ratio_max": 0.5}, {"ratio_max": 1.5}, {"num_views": 1}, {"min_tokens": -1}):
        with pytest.raises(ValueError):
            CroppingViews(encoder.tokenizer, encoder.pooler, 32, **options)


def test_cropping_views_compose_with_dclr_weighting_and_train(tiny_model_dir: Path, train_tiny: TinyTrainer) -> None:
    run = train_tiny(
        "data.views={name: cropping, ratio_min: 0.3, ratio_max: 0.9}",
        "negatives=[{name: dclr_noise}]",
        f"weighting={{name: dclr, model: {tiny_model_dir}, model_pooler: mean, phi: 0.9}}",
        steps=2,
    )
    assert run.result.steps == 2


@pytest.mark.parametrize("recipe_file", ["cropping-minilm.yaml", "cropping-bert-base.yaml"])
def test_the_cropping_recipes_load_with_contrievers_ratios(recipe_file: str) -> None:
    recipe = load_recipe(Path(__file__).parents[2] / "recipes" / recipe_file)
    assert recipe.data.views["name"] == "cropping"
    assert (recipe.data.views["ratio_min"], recipe.data.views["ratio_max"]) == (0.1, 0.5)

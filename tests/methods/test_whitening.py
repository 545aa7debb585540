"""WhitenedCSE: whitening numerics, the multiple positives, the loss against InfoNCE, training and export."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TinyTrainer

from csekit.core.errors import CsekitError
from csekit.encoding.encoder import SentenceEncoder
from csekit.parts.heads import HEADS
from csekit.parts.heads.mlp import MLPHead
from csekit.parts.heads.whitening import GroupWhitening, SingularWhiteningWarning, WhiteningHead, whitening_matrices
from csekit.parts.objectives import InfoNCE, MultiPositiveInfoNCE
from csekit.parts.step_state import StepState
from csekit.training.part_building import build_part
from csekit.training.recipe import load_recipe

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
BACKBONE_DIMS = {"bert-base-uncased": 768, "roberta-base": 768, "minilm-l6": 384}
WHITENING_RECIPES = sorted(
    path.name for path in RECIPES.glob("*.yaml") if "name: whitening" in path.read_text(encoding="utf-8")
)
RUNNING_STATISTICS = {
    "whitenedcse-bert-base-pca.yaml",
    "whitenedcse-bert-base-zca.yaml",
    "whitenedcse-bert-base-group.yaml",
}
"""The paper's Table 3 ablations, trained with the momentum estimates of Eq. 13 (statistics: running)."""
ONE_GROUP = {"whitenedcse-bert-base-pca.yaml", "whitenedcse-bert-base-zca.yaml"}
"""All 768 channels as one group: singular with one batch's statistics (64 rows)."""


def make_state(embeddings: list[torch.Tensor]) -> StepState:
    return StepState([""] * embeddings[0].shape[0], embeddings, embeddings, None, None)  # type: ignore[arg-type]


def correlated(n: int, d: int, seed: int = 0, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Rows with strongly correlated, unequal-variance channels (far from white)."""
    generator = torch.Generator().manual_seed(seed)
    mixing = torch.randn(d, d, generator=generator, dtype=dtype)
    return torch.randn(n, d, generator=generator, dtype=dtype) @ mixing + 3.0


def covariance(x: torch.Tensor) -> torch.Tensor:
    centred = x - x.mean(dim=0)
    return centred.T @ centred / x.shape[0]


# --------------------------------------------------------------------------- whitening
@pytest.mark.parametrize("kind", ["shuffled_group", "group"])
def test_each_group_is_white_when_the_batch_exceeds_the_group_size(kind: str) -> None:
    torch.manual_seed(0)
    whitening = GroupWhitening(24, kind, group_size=6, eps=1e-9, eigh_dtype="float64").train()
    x = correlated(200, 24)
    permutation = torch.randperm(24) if kind == "shuffled_group" else None
    out = whitening(x, permutation)
    cov = covariance(out)
    order = permutation if permutation is not None else torch.arange(24)
    for g in range(4):
        channels = order[g * 6 : (g + 1) * 6]
        torch.testing.assert_close(cov[channels][:, channels], torch.eye(6, dtype=cov.dtype), atol=1e-6, rtol=0)
    # Whitening is per group: channels of different groups stay correlated (the input's are).
    assert cov[order[0], order[6:]].abs().max() > 0.05
    assert covariance(x)[0, 1:].abs().max() > 0.5


@pytest.mark.parametrize("kind", ["zca", "pca"])
def test_full_whitening_gives_identity_covariance(kind: str) -> None:
    out = GroupWhitening(16, kind, eps=1e-9, eigh_dtype="float64").train()(correlated(300, 16))
    torch.testing.assert_close(covariance(out), torch.eye(16, dtype=out.dtype), atol=1e-6, rtol=0)


def test_inverse_permutation_restores_channel_order() -> None:
    """Grouping with a permutation, then undoing it, equals whitening the permuted groups in place."""
    whitening = GroupWhitening(12, "shuffled_group", num_groups=3, eigh_dtype="float64").train()
    x = correlated(50, 12, seed=3)
    permutation = torch.randperm(12, generator=torch.Generator().manual_seed(1))
    out = whitening(x, permutation)
    # Reference: whiten each group of permuted channels by hand and write it back to those channels.
    expected = torch.empty_like(x)
    for g in range(3):
        channels = permutation[g * 4 : (g + 1) * 4]
        block = x[:, channels] - x[:, channels].mean(dim=0)
        values, vectors = torch.linalg.eigh(covariance(x[:, channels]) + whitening.eps * torch.eye(4))
        expected[:, channels] = block @ vectors @ torch.diag(values.rsqrt()) @ vectors.T
    torch.testing.assert_close(out, expected)
    # A channel that is scaled in the input stays in its own column of the output (order restored):
    # ZCA is scale-equivariant per channel up to the other channels of its group, so scaling one
    # group's channels leaves every other group's output columns unchanged.
    scaled = x.clone()
    scaled[:, permutation[:4]] *= 10.0
    changed = (whitening(scaled, permutation) - out).abs().amax(dim=0) > 1e-9
    assert set(torch.nonzero(changed).flatten().tolist()) <= set(permutation[:4].tolist())


def test_zca_is_the_pca_output_rotated_by_the_eigenvectors() -> None:
    x = correlated(100, 8, seed=5)
    cov = covariance(x)[None]
    eps = 1e-5
    centred = x - x.mean(dim=0)
    pca = centred @ whitening_matrices(cov, "pca", eps, gradient=False)[0]
    zca = centred @ whitening_matrices(cov, "zca", eps, gradient=False)[0]
    _, vectors = torch.linalg.eigh(cov[0] + eps * torch.eye(8, dtype=cov.dtype))
    torch.testing.assert_close(zca, pca @ vectors.T)  # column convention: h_zca = U h_pca
    assert (zca - pca).abs().max() > 0.1  # they are different bases


@pytest.mark.parametrize("gradient", [False, True])
@pytest.mark.parametrize("kind", ["shuffled_group", "zca", "pca"])
@pytest.mark.parametrize("case", ["small_batch", "collinear", "constant", "single_row"])
def test_no_nan_or_inf_in_degenerate_batches(kind: str, gradient: bool, case: str) -> None:
    torch.manual_seed(0)
    grouping = {"group_size": 16} if kind == "shuffled_group" else {}
    head = WhiteningHead(32, kind, num_positives=3, gradient_through_whitening=gradient, **grouping).train()
    if case == "small_batch":  # 4 rows, groups of 16: the covariance has rank 3
        x = torch.randn(4, 32)
    elif case == "collinear":  # every row a multiple of one vector
        x = torch.randn(8, 1) * torch.randn(1, 32)
    elif case == "constant":
        x = torch.ones(8, 32)
    else:
        x = torch.randn(1, 32)
    features = [x.clone().requires_grad_(), (x + 0.01 * torch.randn_like(x)).requires_grad_()]
    views = head.forward_views(features)
    assert all(torch.isfinite(v).all() for v in views)
    loss = MultiPositiveInfoNCE()(make_state(views))["multi_positive"]
    loss.backward()
    assert torch.isfinite(loss)
    for tensor in [*features, head.linear.weight]:
        assert tensor.grad is not None and torch.isfinite(tensor.grad).all()


def test_gradient_switch_changes_the_gradients() -> None:
    x = correlated(20, 8, seed=2, dtype=torch.float32)
    target = torch.randn(20, 8, generator=torch.Generator().manual_seed(9))
    grads = {}
    for through in (False, True):
        whitening = GroupWhitening(8, "zca", gradient_through_whitening=through).train()
        inputs = x.clone().requires_grad_()
        (whitening(inputs) * target).sum().backward()
        grads[through] = inputs.grad
    assert (grads[True] - grads[False]).abs().max() > 1e-2 * grads[False].abs().max()


def test_gradient_through_zca_matches_finite_differences() -> None:
    x = correlated(12, 4, seed=4).requires_grad_()
    whitening = GroupWhitening(4, "zca", eps=1e-3, eigh_dtype="float64", gradient_through_whitening=True).train()
    weights = torch.randn(12, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    assert torch.autograd.gradcheck(lambda inputs: (whitening(inputs) * weights).sum(), (x,))


def test_gradient_through_pca_matches_torch_eigh_when_eigenvalues_are_distinct() -> None:
    cov = covariance(correlated(40, 5, seed=6))[None].requires_grad_()
    weights = torch.randn(1, 5, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    (whitening_matrices(cov, "pca", 1e-6, gradient=True) * weights).sum().backward()
    ours = cov.grad.clone()
    cov.grad = None
    values, vectors = torch.linalg.eigh(cov + 1e-6 * torch.eye(5, dtype=cov.dtype))
    (vectors * values.rsqrt().unsqueeze(-2) * weights).sum().backward()
    reference = 0.5 * (cov.grad + cov.grad.transpose(-1, -2))
    torch.testing.assert_close(ours, reference)


def test_float32_and_float64_eigendecompositions_agree() -> None:
    x = correlated(64, 32, seed=8, dtype=torch.float32)
    permutation = torch.randperm(32)
    outs = [
        GroupWhitening(32, "shuffled_group", num_groups=4, eigh_dtype=dtype).train()(x, permutation)
        for dtype in ("float32", "float64")
    ]
    torch.testing.assert_close(outs[0], outs[1], atol=1e-3, rtol=1e-3)
    assert outs[0].dtype == torch.float32


def test_bf16_autocast_keeps_the_whitening_in_float32() -> None:
    head = WhiteningHead(32, "shuffled_group", num_groups=4).train()
    x = correlated(64, 32, seed=1, dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        views = head.forward_views([x.bfloat16(), x.bfloat16()])
        whitened = head.whitening(x.bfloat16(), torch.arange(32))
    assert all(torch.isfinite(v).all() for v in views)
    assert head.whitening.running_covariance.dtype == torch.float32
    # Each group of the (bf16-rounded) output is still white: the eigendecomposition ran in float32.
    cov = covariance(whitened.double())
    torch.testing.assert_close(cov[:8, :8], torch.eye(8, dtype=cov.dtype), atol=0.05, rtol=0)


def test_options_are_checked_with_the_recipe_key() -> None:
    with pytest.raises(CsekitError, match=r"model\.head.*num_groups=5 must .* divide"):
        build_part(HEADS, {"name": "whitening", "num_groups": 5}, "model.head", dim=32)
    with pytest.raises(CsekitError, match=r"model\.head.*exactly one of num_groups or group_size"):
        build_part(HEADS, {"name": "whitening", "num_groups": 4, "group_size": 8}, "model.head", dim=32)
    with pytest.raises(CsekitError, match=r"model\.head.*one group"):
        build_part(HEADS, {"name": "whitening", "whitening": "zca", "num_groups": 4}, "model.head", dim=32)
    with pytest.raises(CsekitError, match=r"model\.head\.whitening.*pcaa|model\.head.*pcaa"):
        build_part(HEADS, {"name": "whitening", "whitening": "pcaa", "num_groups": 4}, "model.head", dim=32)


# --------------------------------------------------------------------------- shipped recipes' conditioning
def recipe_head(name: str) -> tuple[WhiteningHead, int]:
    """The training head a shipped recipe builds, and the rows its batch statistics come from."""
    recipe = load_recipe(RECIPES / name)
    dim = BACKBONE_DIMS[recipe.model.backbone]
    views = recipe.data.views["num_views"]
    head = build_part(
        HEADS, recipe.model.head, "model.head", dim=dim, batch_size=recipe.train.batch_size, input_view_count=views
    )
    return head.train(), recipe.train.batch_size


def features_like_a_backbone(n: int, d: int, noise_seed: int) -> torch.Tensor:
    """float32 rows of one fixed correlated distribution ([CLS]-like scale); `noise_seed` draws new rows."""
    mixing = torch.randn(d, d, generator=torch.Generator().manual_seed(1234))
    rows = torch.randn(n, d, generator=torch.Generator().manual_seed(noise_seed))
    return (rows @ mixing + 3.0) / (2 * d**0.5)


def group_covariances(out: torch.Tensor, permutation: torch.Tensor, groups: int) -> torch.Tensor:
    cov = covariance(out.double())[permutation][:, permutation]
    size = out.shape[1] // groups
    return torch.stack([cov[g * size : (g + 1) * size, g * size : (g + 1) * size] for g in range(groups)])


def test_whitening_recipes_are_found() -> None:
    assert {"whitenedcse-bert-base.yaml", "dclr+whitened-bert-base.yaml", "combined-minilm.yaml"} <= set(
        WHITENING_RECIPES
    )


@pytest.mark.parametrize("name", sorted(set(WHITENING_RECIPES) - RUNNING_STATISTICS))
def test_every_shipped_grouping_whitens_a_training_batch_to_identity(name: str) -> None:
    """At a recipe's own batch size each group's covariance is estimable, so a batch comes out white."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", SingularWhiteningWarning)
        head, rows = recipe_head(name)
    whitening = head.whitening
    torch.manual_seed(0)
    permutation = torch.randperm(whitening.dim)
    x = features_like_a_backbone(rows, whitening.dim, noise_seed=1)
    out = whitening(x, permutation if whitening.shuffle else None)
    order = permutation if whitening.shuffle else torch.arange(whitening.dim)
    blocks = group_covariances(out, order, whitening.num_groups)
    identity = torch.eye(blocks.shape[-1], dtype=blocks.dtype).expand_as(blocks)
    torch.testing.assert_close(blocks, identity, atol=2e-3, rtol=0)


def test_a_group_wider_than_the_batch_is_not_whitened_by_the_data() -> None:
    """The reading csekit no longer ships: groups of 384 over 64 rows come out as a rank-63 projection."""
    whitening = GroupWhitening(768, "group", group_size=384).train()
    out = whitening(features_like_a_backbone(64, 768, noise_seed=1))
    eigenvalues = torch.linalg.eigvalsh(covariance(out.double())[:384, :384])
    assert int((eigenvalues > 0.5).sum()) == 63  # only the batch's 63 directions are white; the rest ~0


@pytest.mark.parametrize("name", sorted(set(WHITENING_RECIPES) - ONE_GROUP))
def test_test_time_whitening_of_a_shipped_grouping_is_identity_on_its_distribution(name: str) -> None:
    """Running statistics of a large batch give a fixed map that whitens fresh rows of the same distribution."""
    head, _ = recipe_head(name)
    whitening = head.whitening
    dim = whitening.dim
    whitening.momentum = 1.0  # the running statistics become exactly those of the large batch
    whitening.update_running_statistics(features_like_a_backbone(16384, dim, noise_seed=1))
    whitening.eval()
    fresh = features_like_a_backbone(16384, dim, noise_seed=2)  # the same distribution, new rows
    out = whitening(fresh)
    blocks = group_covariances(out, whitening.test_permutation, whitening.num_groups)
    identity = torch.eye(blocks.shape[-1], dtype=blocks.dtype).expand_as(blocks)
    torch.testing.assert_close(blocks, identity, atol=0.1, rtol=0)
    assert float((blocks - identity).abs().mean()) < 0.02


@pytest.mark.parametrize("name", sorted(ONE_GROUP))
def test_one_group_ablations_train_on_running_statistics_and_warn_with_batch_ones(name: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", SingularWhiteningWarning)
        head, _ = recipe_head(name)
    assert head.whitening.num_groups == 1 and head.whitening.statistics == "running"
    recipe = load_recipe(RECIPES / name, ["model.head.statistics=batch"])
    with pytest.warns(SingularWhiteningWarning, match=r"recipe key model\.head\.whitening: .*rank at most 63 < 768"):
        build_part(HEADS, recipe.model.head, "model.head", dim=768, batch_size=recipe.train.batch_size)


def eq13_zca_by_hand(batches: list[torch.Tensor], momentum: float, eps: float) -> list[torch.Tensor]:
    """Eq. 13 written out: mu_n = beta mu_{n-1} + (1 - beta) mean_n, Sigma_n likewise (mu_0 = 0, Sigma_0 = I,
    beta = 1 - momentum), and each batch ZCA-whitened with them: (x - mu_n) (Sigma_n + eps I)^{-1/2}."""
    d = batches[0].shape[1]
    mu, sigma = np.zeros(d), np.eye(d)
    outputs = []
    for batch in batches:
        x = batch.double().numpy()
        centred = x - x.mean(axis=0)
        mu = (1 - momentum) * mu + momentum * x.mean(axis=0)
        sigma = (1 - momentum) * sigma + momentum * centred.T @ centred / len(x)
        values, vectors = np.linalg.eigh(sigma + eps * np.eye(d))
        inverse_root = vectors @ np.diag(np.maximum(values, eps) ** -0.5) @ vectors.T
        outputs.append(torch.from_numpy((x - mu) @ inverse_root))
    return outputs


def test_running_statistics_whiten_training_batches_as_eq13() -> None:
    batches = [correlated(4, 6, seed=seed, dtype=torch.float32) for seed in range(5)]  # 4 rows < 6 channels
    whitening = GroupWhitening(6, "zca", momentum=0.3, statistics="running").train()
    for batch, expected in zip(batches, eq13_zca_by_hand(batches, 0.3, whitening.eps), strict=True):
        whitening.update_running_statistics(batch)
        torch.testing.assert_close(whitening(batch).double(), expected, rtol=1e-4, atol=1e-4)


def test_the_running_covariance_of_a_group_wider_than_the_batch_is_estimated_by_the_data() -> None:
    """768 channels, 64 rows a batch: one batch has rank 63; Eq. 13's estimate is full rank, set by the data."""
    whitening = GroupWhitening(768, "pca", statistics="running").train()
    whitening.running_covariance.zero_()  # no identity to hide behind: only the batches count
    scales = torch.linspace(0.5, 1.5, 768)  # a well-conditioned distribution: every direction has variance >= 0.25
    batches = [torch.randn(64, 768, generator=torch.Generator().manual_seed(seed)) * scales for seed in range(20)]
    for rows in batches:
        whitening.update_running_statistics(rows)
    eigenvalues = torch.linalg.eigvalsh(whitening.running_covariance.double())
    assert float(eigenvalues.min()) > 100 * whitening.eps  # no direction left to eps
    one_batch = torch.linalg.eigvalsh(covariance(batches[0].double()))
    assert int((one_batch > 100 * whitening.eps).sum()) == 63


def test_running_statistics_are_constants_so_gradients_through_them_are_refused() -> None:
    with pytest.raises(ValueError, match="gradient_through_whitening: false"):
        GroupWhitening(6, "zca", statistics="running", gradient_through_whitening=True)
    with pytest.raises(ValueError, match="statistics"):
        GroupWhitening(6, "zca", statistics="momentum")


def test_the_warning_names_the_key_that_set_the_groups_and_the_rank() -> None:
    with pytest.warns(SingularWhiteningWarning, match=r"model\.head\.group_size: .*384 channels .*rank at most 63"):
        WhiteningHead(768, "shuffled_group", group_size=384, batch_size=64)
    with pytest.warns(SingularWhiteningWarning, match=r"model\.head\.num_groups: .*2 group\(s\) of 384 channels"):
        WhiteningHead(768, "shuffled_group", num_groups=2, batch_size=64)
    with pytest.warns(SingularWhiteningWarning, match=r"rank at most 63 < 64"):  # the boundary: 64 channels
        WhiteningHead(768, "shuffled_group", num_groups=12, batch_size=64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        WhiteningHead(768, "shuffled_group", num_groups=16, batch_size=64)  # groups of 48 < 64 rows
        WhiteningHead(768, "none", batch_size=64)
        WhiteningHead(768, "shuffled_group", group_size=384)  # no batch_size (a user's own code): nothing to check


# --------------------------------------------------------------------------- positives and loss
def test_shuffled_positives_differ_and_unshuffled_ones_repeat() -> None:
    torch.manual_seed(0)
    x = [correlated(32, 16, seed=1, dtype=torch.float32), correlated(32, 16, seed=2, dtype=torch.float32)]
    views = WhiteningHead(16, "shuffled_group", num_groups=4, num_positives=4).train().forward_views(x)
    assert len(views) == 4
    assert (views[2] - views[0]).abs().max() > 1e-2  # same backbone feature, another permutation
    views = WhiteningHead(16, "group", num_groups=4, num_positives=3).train().forward_views(x)
    torch.testing.assert_close(views[2], views[0])  # no shuffling: re-whitening adds no diversity


def test_whitening_off_and_two_views_is_simcse() -> None:
    """whitening: none, m = 2: the head is SimCSE's MLP and the loss is InfoNCE, values and gradients."""
    torch.manual_seed(0)
    head = WhiteningHead(16, "none", num_positives=2).train()
    mlp = MLPHead(16)
    mlp.load_state_dict(head.state_dict(), strict=False)
    mlp.linear.load_state_dict(head.linear.state_dict())
    features = [torch.randn(12, 16), torch.randn(12, 16)]
    views = head.forward_views(features)
    for view, feature in zip(views, features, strict=True):
        torch.testing.assert_close(view, mlp(feature))
    a = [v.detach().clone().requires_grad_() for v in views]
    b = [v.detach().clone().requires_grad_() for v in views]
    ours = MultiPositiveInfoNCE(temperature=0.05)(make_state(a))["multi_positive"]
    theirs = InfoNCE(temperature=0.05)(make_state(b))["infonce"]
    ours.backward()
    theirs.backward()
    assert ours.item() > 0.1
    torch.testing.assert_close(ours, theirs)
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x.grad, y.grad)


def test_eq7_sums_one_infonce_per_positive_and_eq8_forms() -> None:
    torch.manual_seed(1)
    views = [torch.randn(10, 8) for _ in range(3)]
    state = make_state(views)
    per_positive = [InfoNCE(0.05, 0, p)(state)["infonce"] for p in (1, 2)]
    eq7 = MultiPositiveInfoNCE(0.05, lambda_m=0.5)(state)["multi_positive"]
    torch.testing.assert_close(eq7, 0.5 * (per_positive[0] + per_positive[1]))
    # Eq. 8 by hand for anchor-wise terms, as printed (e^{-s/tau} in the numerator) and unsigned.
    sims = [torch.nn.functional.normalize(views[0], dim=1) @ torch.nn.functional.normalize(v, dim=1).T for v in views]
    printed = unsigned = 0.0
    for p in (1, 2):
        logits = sims[p] / 0.05
        denominator = logits.exp().sum(dim=1)
        printed = printed + 0.7 * torch.exp(-logits.diag()) / denominator
        unsigned = unsigned + 0.7 * torch.exp(logits.diag()) / denominator
    eq8 = MultiPositiveInfoNCE(0.05, form="eq8", lambda_m=0.7)(state)["multi_positive"]
    eq8u = MultiPositiveInfoNCE(0.05, form="eq8_unsigned", lambda_m=0.7)(state)["multi_positive"]
    torch.testing.assert_close(eq8, -torch.log(printed).mean())
    torch.testing.assert_close(eq8u, -torch.log(unsigned).mean())


def test_loss_composes_with_extra_negatives_from_other_parts() -> None:
    torch.manual_seed(2)
    views = [torch.randn(6, 8) for _ in range(2)]
    state = make_state(views)
    state.extra_negatives.append(torch.randn(5, 8))
    ours = MultiPositiveInfoNCE()(state)["multi_positive"]
    torch.testing.assert_close(ours, InfoNCE()(state)["infonce"])
    assert ours > MultiPositiveInfoNCE()(make_state(views))["multi_positive"]


# --------------------------------------------------------------------------- test time and training
def test_eval_mode_is_batch_independent_and_exports_as_a_dense_layer(tmp_path: Path) -> None:
    from conftest import make_tiny_encoder

    encoder = make_tiny_encoder(tmp_path / "tok")
    head = WhiteningHead(32, "shuffled_group", num_groups=4, momentum=1.0).train()
    head.forward_views([correlated(64, 32, seed=1, dtype=torch.float32)] * 2)
    assert not torch.allclose(head.whitening.running_covariance, torch.eye(32))
    encoder.head = head
    sentences = ["a man plays guitar", "the dog runs", "a cat sits on the red house"]
    together = encoder.encode(sentences)
    alone = np.concatenate([encoder.encode([s]) for s in sentences])
    np.testing.assert_allclose(together, alone, atol=1e-5)
    # The folded Dense gives the same vectors, in csekit and in sentence-transformers.
    encoder.save(tmp_path / "model")
    config = json.loads((tmp_path / "model" / "csekit.json").read_text())
    assert config["representation"]["head"] is not None
    np.testing.assert_allclose(SentenceEncoder.load(tmp_path / "model").encode(sentences), together, atol=1e-5)
    st = pytest.importorskip("sentence_transformers")
    theirs = st.SentenceTransformer(str(tmp_path / "model"), device="cpu").encode(sentences)
    np.testing.assert_allclose(theirs, together, atol=1e-4)


def test_a_head_without_an_export_raises_a_clear_error(tmp_path: Path) -> None:
    from conftest import make_tiny_encoder

    encoder = make_tiny_encoder(tmp_path / "tok")
    encoder.head = torch.nn.Identity()
    with pytest.raises(CsekitError, match="head_at_test"):
        encoder.save(tmp_path / "model")
    assert not (tmp_path / "model").exists()


@pytest.mark.parametrize("head_at_test", [False, True])
def test_tiny_model_trains_with_whitenedcse_parts(train_tiny: TinyTrainer, head_at_test: bool) -> None:
    run = train_tiny(
        "model.pooler=mean",
        "model.head={name: whitening, whitening: shuffled_group, num_groups: 8, num_positives: 3}",
        f"model.head_at_test={str(head_at_test).lower()}",
        "objectives=[{name: multi_positive, temperature: 0.05}]",
        steps=4,
        lines=256,
    )
    assert run.result.steps == 4
    records = run.losses
    assert len(records) == 4 and all(np.isfinite(r["multi_positive"]) for r in records)
    assert all(r["loss"] == pytest.approx(r["multi_positive"]) for r in records)
    reloaded = SentenceEncoder.load(run.folder / "best")
    assert (reloaded.head is not None) == head_at_test
    assert np.isfinite(reloaded.encode(["a man plays"])).all()

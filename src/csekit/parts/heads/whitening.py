"""Batch whitening for WhitenedCSE (Zhuo et al., 2023): PCA, ZCA, group and shuffled group whitening.

Row convention throughout: a batch is `x` [n, d]; a group's centred block `z` [n, g] has covariance
`C = z^T z / n = U diag(lam) U^T`, and

* ZCA:  h = z W, W = U diag(lam)^{-1/2} U^T (symmetric; stays close to the input's axes),
* PCA:  h = z U diag(lam)^{-1/2} (coordinates in the eigenbasis), so ZCA = PCA output @ U^T.

Shuffled group whitening (SGW) permutes the d channels, whitens each group of g = d / k channels
independently (ZCA) and undoes the permutation; a new permutation per call makes every call a
different "distortion" of the same features, which WhitenedCSE uses as extra positives.

Numerics (a batch of 64 cannot estimate a 384-wide covariance, and csekit warns at start when a group
is that wide, see `singular_groups_message`; features may be collinear):
`eps * I` is added to every covariance and eigenvalues are clamped at `eps`, so lam^{-1/2} <= eps^{-1/2}
and no division can produce inf/NaN; the eigendecomposition runs on the features' device in float32
(retried in float64 if it fails or returns non-finite values) or float64 when asked. When gradients
flow through the whitening matrix, the backward pass uses closed forms that stay finite for repeated
eigenvalues (which rank-deficient covariances always have): the Daleckii-Krein formula for ZCA, whose
divided differences of lam^{-1/2} have the closed form -1 / (s_i s_j (s_i + s_j)) with s = sqrt(lam),
and a regularised eigenvector gradient for PCA (its exact gradient is undefined at repeated eigenvalues).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from csekit.core.distributed import gather_with_grad, world
from csekit.encoding.kept_head import DenseTanh, backbone_initializer_range, init_like_backbone

WHITENING_KINDS = ("shuffled_group", "group", "zca", "pca", "none")
"""`whitening:` choices: the paper's ablation (Table 3) plus `none` (SimCSE's head)."""

DTYPES = {"float32": torch.float32, "float64": torch.float64}

STATISTICS = ("batch", "running")
"""`statistics:` what training whitens with: the batch's mean and covariance, or the running ones (Eq. 13)."""


# --------------------------------------------------------------------------- eigendecomposition
def _eigh(cov: Tensor) -> tuple[Tensor, Tensor]:
    """Batched symmetric eigendecomposition; a float32 failure is retried in float64."""
    try:
        values, vectors = torch.linalg.eigh(cov)
        if cov.dtype == torch.float64 or bool(torch.isfinite(values).all() and torch.isfinite(vectors).all()):
            return values, vectors
    except RuntimeError:  # torch.linalg.LinAlgError: no convergence
        if cov.dtype == torch.float64:
            raise
    values, vectors = torch.linalg.eigh(cov.double())
    return values.to(cov.dtype), vectors.to(cov.dtype)


class _InverseSqrt(torch.autograd.Function):
    """W = (C + eps I)^{-1/2} for a batch [G, g, g] of symmetric PSD matrices, with a finite backward."""

    @staticmethod
    def forward(ctx: Any, cov: Tensor, eps: float) -> Tensor:
        values, vectors = _eigh(cov + eps * torch.eye(cov.shape[-1], dtype=cov.dtype, device=cov.device))
        roots = values.clamp_min(eps).sqrt()
        ctx.save_for_backward(vectors, roots)
        return vectors @ torch.diag_embed(1.0 / roots) @ vectors.transpose(-1, -2)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        vectors, roots = ctx.saved_tensors
        si, sj = roots.unsqueeze(-1), roots.unsqueeze(-2)
        divided = -1.0 / (si * sj * (si + sj))  # (f(l_i) - f(l_j)) / (l_i - l_j) for f = l^{-1/2}; f' on the diagonal
        sym = 0.5 * (grad + grad.transpose(-1, -2))
        inner = vectors.transpose(-1, -2) @ sym @ vectors
        return vectors @ (divided * inner) @ vectors.transpose(-1, -2), None


class _SafeEigh(torch.autograd.Function):
    """eigh of C + eps I whose eigenvector gradient damps 1/(l_j - l_i) for (nearly) equal eigenvalues."""

    @staticmethod
    def forward(ctx: Any, cov: Tensor, eps: float) -> tuple[Tensor, Tensor]:
        values, vectors = _eigh(cov + eps * torch.eye(cov.shape[-1], dtype=cov.dtype, device=cov.device))
        ctx.save_for_backward(values, vectors)
        ctx.damping = eps * eps
        return values, vectors

    @staticmethod
    def backward(ctx: Any, grad_values: Tensor, grad_vectors: Tensor) -> tuple[Tensor, None]:
        values, vectors = ctx.saved_tensors
        gap = values.unsqueeze(-2) - values.unsqueeze(-1)  # [i, j] = l_j - l_i
        inverse_gap = gap / (gap * gap + ctx.damping)  # = 1 / gap away from ties, 0 at ties
        inner = inverse_gap * (vectors.transpose(-1, -2) @ grad_vectors)
        if grad_values is not None:
            inner = inner + torch.diag_embed(grad_values)
        full = vectors @ inner @ vectors.transpose(-1, -2)
        return 0.5 * (full + full.transpose(-1, -2)), None


def whitening_matrices(cov: Tensor, kind: str, eps: float, gradient: bool) -> Tensor:
    """The per-group whitening matrices [G, g, g] (row convention: h = z @ W) of covariances [G, g, g].

    With `gradient` False the matrices are constants (the authors' code); otherwise gradients flow
    through the eigendecomposition.
    """
    if not gradient:
        cov = cov.detach()
    if kind == "pca":
        values, vectors = _SafeEigh.apply(cov, eps)
        return vectors * values.clamp_min(eps).rsqrt().unsqueeze(-2)  # U diag(lam)^{-1/2}
    return _InverseSqrt.apply(cov, eps)


# --------------------------------------------------------------------------- the module
class GroupWhitening(nn.Module):
    """Whitening of a [n, d] batch over its rows: PCA, ZCA, group or shuffled group (SGW).

    In training the statistics are the batch's by default (gathered from every process, with gradients,
    so P processes whiten exactly like one process on the global batch). Running estimates of the mean
    and the full d x d covariance (the paper's Eq. 13, mu_n = beta mu_{n-1} + (1 - beta) mean_n, with
    `momentum` = 1 - beta; they start at 0 and the identity) are kept for test time, where batch
    statistics would make a sentence's embedding depend on its batch: the test-time map is the fixed
    affine map `(x - running_mean) @ test_matrix()`, grouped by a permutation drawn once at
    construction (stored as a buffer, so saved and restored with the model).

    `statistics: running` whitens in training with those running estimates too (updated with the
    step's batch first, see `WhiteningHead.forward_views`), as the paper's section 5.2 does for the
    PCA and ZCA ablations of Table 3: a covariance accumulated over many batches is estimable even
    when a group is wider than one batch. The statistics are then constants (no gradient through them).
    """

    def __init__(
        self,
        dim: int,
        whitening: str = "shuffled_group",
        num_groups: int | None = None,
        group_size: int | None = None,
        eps: float = 1e-5,
        eigh_dtype: str = "float32",
        gradient_through_whitening: bool = False,
        momentum: float = 0.1,
        statistics: str = "batch",
    ) -> None:
        super().__init__()
        if statistics not in STATISTICS:
            raise ValueError(f'statistics "{statistics}" is not one of {", ".join(STATISTICS)}')
        if statistics == "running" and gradient_through_whitening:
            raise ValueError(
                "statistics: running whitens with constant running estimates; set gradient_through_whitening: false"
            )
        if whitening not in WHITENING_KINDS:
            raise ValueError(f'whitening "{whitening}" is not one of {", ".join(WHITENING_KINDS)}')
        if eigh_dtype not in DTYPES:
            raise ValueError(f'eigh_dtype "{eigh_dtype}" is not one of {", ".join(DTYPES)}')
        if eps <= 0:
            raise ValueError("eps must be positive (it keeps lam^{-1/2} finite)")
        if not 0 < momentum <= 1:
            raise ValueError("momentum must be in (0, 1]")
        grouped = whitening in ("shuffled_group", "group")
        if grouped:
            if (num_groups is None) == (group_size is None):
                raise ValueError(
                    f'whitening "{whitening}" needs exactly one of num_groups or group_size (set the other to null)'
                )
            if num_groups is not None and (num_groups < 1 or dim % num_groups):
                raise ValueError(f"num_groups={num_groups} must be positive and divide the dimension {dim}")
            if group_size is not None and (group_size < 1 or dim % group_size):
                raise ValueError(f"group_size={group_size} must be positive and divide the dimension {dim}")
            groups = num_groups if num_groups is not None else dim // int(group_size)  # type: ignore[arg-type]
        else:
            if num_groups is not None or group_size is not None:
                raise ValueError(
                    f'whitening "{whitening}" whitens all channels as one group; set num_groups and group_size to null'
                )
            groups = 1
        self.dim = dim
        self.kind = whitening
        self.num_groups = groups
        self.shuffle = whitening == "shuffled_group" and groups > 1
        self.eps = float(eps)
        self.dtype = DTYPES[eigh_dtype]
        self.gradient = bool(gradient_through_whitening)
        self.momentum = float(momentum)
        self.statistics = statistics
        self.register_buffer("running_mean", torch.zeros(dim))
        self.register_buffer("running_covariance", torch.eye(dim))
        test_permutation = torch.randperm(dim) if self.shuffle else torch.arange(dim)
        self.register_buffer("test_permutation", test_permutation)
        self._test_cache: tuple[tuple[int, ...], Tensor] | None = None

    def extra_repr(self) -> str:
        return f"{self.kind}, dim={self.dim}, groups={self.num_groups}, gradient={self.gradient}"

    def draw_permutation(self, device: torch.device) -> Tensor | None:
        """A new channel permutation (None when not shuffling), the same on every process."""
        if not self.shuffle:
            return None
        permutation = torch.randperm(self.dim).to(device)
        if world()[1] > 1:
            dist.broadcast(permutation, src=0)
        return permutation

    def forward(self, x: Tensor, permutation: Tensor | None = None) -> Tensor:
        """Whiten `x` [n, d]: batch statistics in training (a new permutation unless given), running ones in eval."""
        if not self.training:
            return self.test_transform(x)
        if self.kind == "none":
            return x
        if permutation is None:
            permutation = self.draw_permutation(x.device)
        with torch.autocast(x.device.type, enabled=False):
            if self.statistics == "running":
                matrix = self._grouped_matrix(self.running_covariance, permutation)
                return ((x.to(self.running_mean.dtype) - self.running_mean) @ matrix).to(x.dtype)
            return self._whiten_batch(x, permutation).to(x.dtype)

    def _whiten_batch(self, x: Tensor, permutation: Tensor | None) -> Tensor:
        n, d = x.shape
        k = self.num_groups
        values = x.to(self.dtype)
        if permutation is not None:
            values = values[:, permutation]
        population = gather_with_grad(values)  # statistics over the global batch
        mean = population.mean(dim=0, keepdim=True)
        centred_all = (population - mean).reshape(-1, k, d // k).transpose(0, 1)  # [G, N, g]
        cov = centred_all.transpose(1, 2) @ centred_all / centred_all.shape[1]  # [G, g, g]
        matrices = whitening_matrices(cov, self.kind, self.eps, self.gradient)
        centred = (values - mean).reshape(n, k, d // k).transpose(0, 1)  # [G, n, g]
        whitened = (centred @ matrices).transpose(0, 1).reshape(n, d)
        if permutation is not None:
            whitened = whitened[:, torch.argsort(permutation)]
        return whitened

    @torch.no_grad()
    def update_running_statistics(self, x: Tensor) -> None:
        """Fold a training batch [n, d] into the running mean and covariance (for test time)."""
        if self.kind == "none":
            return
        with torch.autocast(x.device.type, enabled=False):  # bf16 autocast would round the covariance
            values = x.detach().to(self.running_mean.dtype)  # fp32 under bf16 autocast
            mean = values.mean(dim=0)
            centred = values - mean
            cov = centred.T @ centred / values.shape[0]
            self.running_mean.lerp_(mean, self.momentum)
            self.running_covariance.lerp_(cov, self.momentum)

    def test_matrix(self) -> Tensor:
        """The fixed d x d test-time whitening matrix A (row convention): block-diagonal up to `test_permutation`."""
        key = (self.running_covariance._version, self.running_covariance.data_ptr(), self.test_permutation._version)
        if self._test_cache is not None and self._test_cache[0] == key:
            return self._test_cache[1]
        if self.kind == "none":
            matrix = torch.eye(self.dim, device=self.running_covariance.device)
        else:
            matrix = self._grouped_matrix(self.running_covariance, self.test_permutation)
        self._test_cache = (key, matrix)
        return matrix

    @torch.no_grad()
    def _grouped_matrix(self, covariance: Tensor, permutation: Tensor | None) -> Tensor:
        """The d x d whitening matrix (row convention) of a full covariance, grouped after `permutation`."""
        d, k = self.dim, self.num_groups
        with torch.autocast(covariance.device.type, enabled=False):
            perm = permutation if permutation is not None else torch.arange(d, device=covariance.device)
            cov = covariance.to(self.dtype)[perm][:, perm]
            g = d // k
            blocks = torch.stack([cov[i * g : (i + 1) * g, i * g : (i + 1) * g] for i in range(k)])
            matrices = whitening_matrices(blocks, self.kind, self.eps, gradient=False)
            permuted = torch.block_diag(*matrices.unbind(0))
            inverse = torch.argsort(perm)
            return permuted[inverse][:, inverse].to(covariance.dtype)

    def test_transform(self, x: Tensor) -> Tensor:
        """Batch-independent whitening with the running statistics."""
        if self.kind == "none":
            return x
        with torch.autocast(x.device.type, enabled=False):
            return ((x.to(self.running_mean.dtype) - self.running_mean) @ self.test_matrix()).to(x.dtype)


class WhiteningHead(nn.Module):
    """WhitenedCSE's head: whitening, then Linear(d, d), then tanh; several positives per sentence.

    `forward_views` makes `num_positives` views (the anchor and m - 1 positives, the authors' `num_pos`):
    view p whitens dropout view p mod V (V = `data.views.num_views`) with its own channel permutation.
    With V = 2 (default) view 0 is the anchor, view 1 SimCSE's dropout positive and views 2.. re-whiten
    the anchor's backbone feature with new permutations (the paper's "repeat SGW on a single backbone
    feature"); with V = m every positive also has its own dropout mask, as the authors' code encodes them,
    but it does not reproduce the code's whitening: there a sentence's views are adjacent rows of the
    flattened batch, so they mostly fall into the same third and share its permutation and statistics.
    In eval mode (`encode`) the whitening uses running statistics, so a kept head is a fixed map;
    `statistics: running` uses them in training too (Eq. 13), updated with the step's views first.
    The build arguments `batch_size` (`train.batch_size`: the rows a step's statistics come from) and
    `input_view_count` (V) only check the options; outside a recipe they may be left out.
    """

    def __init__(
        self,
        dim: int,
        whitening: str = "shuffled_group",
        num_groups: int | None = None,
        group_size: int | None = None,
        num_positives: int = 3,
        eps: float = 1e-5,
        eigh_dtype: str = "float32",
        gradient_through_whitening: bool = False,
        momentum: float = 0.1,
        statistics: str = "batch",
        encoder: Any = None,
        batch_size: int | None = None,
        input_view_count: int | None = None,
    ) -> None:
        super().__init__()
        if num_positives < 2:
            raise ValueError("num_positives must be at least 2 (an anchor and one positive)")
        if input_view_count is not None and input_view_count > num_positives:
            raise ValueError(
                f"num_positives={num_positives} is smaller than the {input_view_count} views data.views makes; "
                "the extra views would be encoded and never used"
            )
        self.num_positives = num_positives
        self.whitening = GroupWhitening(
            dim, whitening, num_groups, group_size, eps, eigh_dtype, gradient_through_whitening, momentum, statistics
        )
        if batch_size is not None:
            key = "num_groups" if num_groups is not None else "group_size" if group_size is not None else "whitening"
            message = singular_groups_message(self.whitening, batch_size, f"model.head.{key}")
            if message is not None:
                warnings.warn(message, SingularWhiteningWarning, stacklevel=2)
        self.linear = nn.Linear(dim, dim)
        init_like_backbone(self.linear, backbone_initializer_range(encoder))  # as the authors' cl_init
        self.activation = nn.Tanh()

    @staticmethod
    def count_views(options: Mapping[str, Any]) -> int:
        """`num_positives` training views (read when the recipe is loaded, before anything is built)."""
        return int(options["num_positives"])

    def forward(self, features: Tensor) -> Tensor:
        """One view: batch whitening in training, the fixed running-statistics map in eval."""
        return self.activation(self.linear(self.whitening(features)))

    def forward_views(self, features: list[Tensor]) -> list[Tensor]:
        """`num_positives` views from the V dropout views, each whitened with a new permutation."""
        if self.training:
            self.whitening.update_running_statistics(torch.cat(features))
        return [self(features[p % len(features)]) for p in range(self.num_positives)]

    def to_dense_tanh(self) -> DenseTanh:
        """The test-time head folded into one Linear + tanh (exported as a sentence-transformers Dense).

        tanh(L((x - mu) A)) = tanh(x (A L_w^T) + b - mu A L_w^T): weight L_w A^T, bias b - L_w A^T mu.
        """
        with torch.no_grad():
            matrix = self.whitening.test_matrix()
            mean = self.whitening.running_mean if self.whitening.kind != "none" else torch.zeros_like(self.linear.bias)
            weight = self.linear.weight.float() @ matrix.T
            bias = self.linear.bias.float() - weight @ mean.float()
            head = DenseTanh(weight.shape[1]).to(weight.device)
            head.linear.weight.copy_(weight)
            head.linear.bias.copy_(bias)
        return head


class SingularWhiteningWarning(UserWarning):
    """A whitening group is wider than the batch that estimates its covariance (see `singular_groups_message`)."""


def singular_groups_message(whitening: GroupWhitening, rows: int, key: str) -> str | None:
    """Why whitening groups of g channels over `rows` rows are singular, or None when they are not.

    A group's centred covariance over n rows has rank at most n - 1, so a group of g >= n channels
    has g - n + 1 or more zero eigenvalues: their directions are scaled by eps^{-1/2} (about 316 at
    eps = 1e-5), an amount set by `eps`, not by the data. The statistics are gathered over every
    process, so n is the global batch (`train.batch_size`).
    """
    if whitening.kind == "none" or whitening.statistics == "running":
        return None  # an estimate accumulated over many batches (Eq. 13), not one batch's
    channels = whitening.dim // whitening.num_groups
    if channels < rows:
        return None
    if whitening.num_groups == 1:
        advice = "grouped whitening (shuffled_group or group) with smaller groups avoids this"
    else:
        advice = f"set model.head.num_groups so that {whitening.dim} / num_groups < {rows} and group_size: null"
    return (
        f"recipe key {key}: {whitening.kind} whitening of {whitening.num_groups} group(s) of {channels} channels "
        f"over batches of {rows} rows (train.batch_size): a group covariance has rank at most {rows - 1} < "
        f"{channels}, so the whitening of the missing directions is set by eps, not by the data; {advice}"
    )

"""The summary's plots (matplotlib, `csekit[bench]`): training curves, alignment against uniformity, the
in-batch cosine histograms and the STS average against the papers'."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from csekit.bench.papers import PAPER_PLOT
from csekit.bench.results import COSINES_FILE, dev_curves, read_cosines, score_at
from csekit.bench.suite import Suite, run_dir
from csekit.core.atomic import write_file
from csekit.core.errors import CsekitError
from csekit.evaluation.published import STS_AVERAGE, PaperComparison
from csekit.evaluation.result import STS_AVERAGE as STS_AVERAGE_KEY


def write_plots(output: Path, suite: Suite, runs: dict[str, list[dict[str, Any]]]) -> list[Path]:
    """Dev score and alignment/uniformity over steps, alignment vs uniformity, in-batch cosine histograms."""
    try:
        import matplotlib
    except ImportError:
        raise CsekitError(
            "the plots need matplotlib: pip install 'csekit[bench]' (or pip install matplotlib)"
        ) from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written: list[Path] = []

    def _save(fig: Any, path: Path) -> Path:
        fig.tight_layout()
        write_file(path, lambda handle: fig.savefig(handle, format="png", dpi=100))
        plt.close(fig)
        return path

    curves = dev_curves(output, suite)
    if curves:
        fig, axes = plt.subplots(1, 3, figsize=(15, 4))
        for method, metrics in curves.items():
            dev_key = next((k for k in ("stsb-dev", "sick-dev") if k in metrics), None)
            for ax, key in zip(axes, (dev_key, "align", "uniform"), strict=True):
                if key in metrics:
                    steps, values = zip(*metrics[key], strict=True)
                    scale = 100.0 if key == dev_key else 1.0
                    ax.plot(steps, [scale * v for v in values], marker="o", label=method)
        for ax, title in zip(
            axes, ("dev Spearman x 100", "alignment (lower is better)", "uniformity (lower is better)"), strict=True
        ):
            ax.set_title(title)
            ax.set_xlabel("training step")
            ax.legend(fontsize="small")
        written.append(_save(fig, output / "training_curves.png"))

    points = {
        method: [
            (r["tasks"]["align"]["uniform"], r["tasks"]["align"]["align"])
            for r in reports
            if "align" in r["tasks"] and None not in (r["tasks"]["align"]["uniform"], r["tasks"]["align"]["align"])
        ]
        for method, reports in runs.items()
    }
    if any(points.values()):
        fig, ax = plt.subplots(figsize=(5, 4))
        for method, xy in points.items():
            if xy:
                ax.scatter(*zip(*xy, strict=True), label=method)
        for metrics in curves.values():  # the trajectory over training, as in SimCSE's Figure 2
            if "align" in metrics and "uniform" in metrics:
                ax.plot([v for _, v in metrics["uniform"]], [v for _, v in metrics["align"]], alpha=0.4, linestyle="--")
        ax.set_xlabel("uniformity")
        ax.set_ylabel("alignment")
        ax.set_title("alignment vs uniformity (STS-B dev; lower is better)")
        ax.legend(fontsize="small")
        written.append(_save(fig, output / "align_uniform.png"))

    cosines = {}
    for recipe in suite.recipes:
        arrays = [
            read_cosines(run_dir(output, recipe, seed) / COSINES_FILE)
            for seed in suite.seeds
            if os.path.lexists(run_dir(output, recipe, seed) / COSINES_FILE)
        ]
        if arrays:
            cosines[recipe.name] = np.concatenate(arrays)
    if cosines:
        fig, ax = plt.subplots(figsize=(6, 4))
        for method, values in cosines.items():
            ax.hist(values, bins=50, range=(-1, 1), density=True, histtype="step", label=method)
        ax.set_xlabel("cosine similarity of sentence pairs from the corpus (in-batch negatives)")
        ax.set_ylabel("density")
        ax.legend(fontsize="small")
        written.append(_save(fig, output / "negative_cosines.png"))
    return written


def write_paper_plot(
    output: Path, suite: Suite, runs: dict[str, list[dict[str, Any]]], papers: dict[str, dict[str, PaperComparison]]
) -> Path:
    """STS average per recipe: each seed, csekit's mean ± std, and the paper's average marked beside them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [recipe.name for recipe in suite.recipes if STS_AVERAGE in papers.get(recipe.name, {})]
    fig, ax = plt.subplots(figsize=(max(5.0, 1.2 * len(names) + 2), 4))
    for x, name in enumerate(names):
        comparison = papers[name][STS_AVERAGE]
        seeds = [100.0 * v for v in (score_at(r, ("averages", STS_AVERAGE_KEY)) for r in runs[name]) if v is not None]
        ax.scatter([x - 0.1] * len(seeds), seeds, color="tab:blue", s=12, label="csekit seed" if x == 0 else None)
        ax.errorbar(
            x,
            comparison.mean,
            yerr=comparison.std,
            fmt="o",
            color="tab:blue",
            capsize=4,
            label="csekit mean ± std" if x == 0 else None,
        )
        ax.scatter(x + 0.1, comparison.paper, marker="*", s=120, color="tab:red", label="paper" if x == 0 else None)
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize="small")
    ax.set_ylabel("STS Avg. (Spearman x 100)")
    ax.set_title("STS average: csekit's seeds against the paper")
    ax.legend(fontsize="small")
    fig.tight_layout()
    path = output / PAPER_PLOT
    write_file(path, lambda handle: fig.savefig(handle, format="png", dpi=100))
    plt.close(fig)
    return path

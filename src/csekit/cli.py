"""The `csekit` command line: train, evaluate, bench, encode, download-data.

Every input mistake is a `CsekitError`: printed as one line on stderr, exit status 2, no traceback.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Annotated

import numpy as np
import typer

from csekit.errors import CsekitError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Unsupervised contrastive sentence embeddings: SimCSE, DCLR, WhitenedCSE, SLT-FAI, OssCSE.",
)

DataDirOption = Annotated[
    Path | None,
    typer.Option("--data-dir", help="SentEval data folder (default: $CSEKIT_DATA).", show_default=False),
]
PoolerOption = Annotated[
    str | None,
    typer.Option("--pooler", help="cls, mean or first_last_avg (default: the model's own, else cls)."),
]
PrecisionOption = Annotated[str, typer.Option("--precision", help="fp32 (SentEval-exact) or bf16 (faster).")]


@app.command()
def train(
    recipe: Annotated[Path, typer.Argument(help="Recipe YAML file (see recipes/).")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Output folder for the run.")],
    overrides: Annotated[
        list[str] | None, typer.Option("--set", help="Override a recipe key: dotted.key=value (repeatable).")
    ] = None,
    data_dir: DataDirOption = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue the run saved in --output.")] = False,
    progress: Annotated[bool, typer.Option(help="Show a progress bar.")] = True,
) -> None:
    """Train a model from a recipe; writes best/, last/, checkpoint/, metrics.jsonl and recipe.yaml."""
    from csekit.config import load_recipe
    from csekit.training import train as run_training

    config = load_recipe(recipe, overrides or [])
    result = run_training(config, output, data_dir=data_dir, resume=resume, show_progress=progress)
    best = "n/a" if result.best_score is None else f"{100 * result.best_score:.2f} at step {result.best_step}"
    typer.echo(f"trained {result.steps} steps; best {config.train.select_metric}: {best}; model in {output / 'best'}")


TASK_GROUPS_HELP = "sts, dev, transfer, align, all (sts + transfer + align), or a comma list of task names."


@app.command()
def evaluate(
    model: Annotated[str, typer.Argument(help="Model folder, hub name, or alias (minilm-l6).")],
    tasks: Annotated[str, typer.Option(help=TASK_GROUPS_HELP)] = "sts",
    pooler: PoolerOption = None,
    data_dir: DataDirOption = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write results as JSON here.")] = None,
    precision: PrecisionOption = "fp32",
    batch_size: Annotated[int, typer.Option(help="Sentences per forward pass.")] = 128,
    whiten: Annotated[
        bool, typer.Option("--whiten", help="BERT-whitening of the embeddings (kernel from each task's sentences).")
    ] = False,
    whiten_dim: Annotated[
        int | None, typer.Option("--whiten-dim", help="Keep the first K whitened dimensions (implies --whiten).")
    ] = None,
    n_jobs: Annotated[
        int, typer.Option("--n-jobs", help="Parallel classifier fits for transfer tasks (-1: all cores).")
    ] = -1,
) -> None:
    """Evaluate a model SentEval's way: STS (Spearman x 100), transfer tasks (accuracy x 100), alignment/uniformity."""
    from csekit.atomic import atomic_write_text
    from csekit.data_dir import resolve_data_dir
    from csekit.encoder import SentenceEncoder
    from csekit.evaluation.sts import format_sts_table
    from csekit.evaluation.suite import parse_tasks, run_evaluation
    from csekit.evaluation.transfer import format_transfer_table

    groups = parse_tasks(tasks)
    if whiten_dim is not None:
        if whiten_dim < 1:
            raise CsekitError(f"--whiten-dim must be at least 1, got {whiten_dim}")
        whiten = True
    root = resolve_data_dir(data_dir)
    encoder = SentenceEncoder.load(model, pooler=pooler)

    def encode(sentences: list[str]) -> np.ndarray:
        return encoder.encode(sentences, batch_size=batch_size, precision=precision, show_progress_bar=True)

    started = time.perf_counter()
    results = run_evaluation(encode, root, groups, whiten, whiten_dim, n_jobs)
    elapsed = time.perf_counter() - started
    average = results.pop("avg", None)
    transfer_avg = results.pop("transfer_avg", None)
    report: dict = {"model": model, "pooler": encoder.pooler.name, "precision": precision}
    if whiten:
        report["whiten"] = {"dim": whiten_dim}
    report["tasks"] = results
    if average is not None:
        report["avg"] = average
    if transfer_avg is not None:
        report["transfer_avg"] = transfer_avg
    if groups["sts"]:
        typer.echo(format_sts_table({**results, "avg": average}))
    for task in groups["dev"]:
        typer.echo(f"{task}: {100 * results[task]:.2f}")
    if groups["transfer"]:
        typer.echo(format_transfer_table({**results, "transfer_avg": transfer_avg}))
    if groups["align"]:
        typer.echo(
            f"alignment {results['align']['align']:.4f}, uniformity {results['align']['uniform']:.4f} (STS-B dev)"
        )
    whitening = f", whitened{'' if whiten_dim is None else f' to {whiten_dim} dims'}" if whiten else ""
    typer.echo(f"({model}, pooler {encoder.pooler.name}, {precision}{whitening}, {elapsed:.1f} s)")
    if output is not None:
        report["seconds"] = round(elapsed, 2)
        atomic_write_text(output, json.dumps(report, indent=2) + "\n")


@app.command()
def encode(
    model: Annotated[str, typer.Argument(help="Model folder, hub name, or alias (minilm-l6).")],
    input: Annotated[Path, typer.Option("--input", "-i", help="Text file, one sentence per line.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Where to write the .npy matrix.")],
    pooler: PoolerOption = None,
    precision: PrecisionOption = "fp32",
    batch_size: Annotated[int, typer.Option(help="Sentences per forward pass.")] = 128,
) -> None:
    """Write one embedding row per input line (float32 .npy)."""
    from csekit.encoder import SentenceEncoder

    try:
        sentences = input.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise CsekitError(f"input {input} does not exist") from None
    except UnicodeDecodeError as error:
        line = input.read_bytes()[: error.start].count(b"\n") + 1
        raise CsekitError(f"{input}:{line}: not valid UTF-8") from None
    encoder = SentenceEncoder.load(model, pooler=pooler)
    embeddings = encoder.encode(sentences, batch_size=batch_size, precision=precision, show_progress_bar=True)
    output.parent.mkdir(parents=True, exist_ok=True)
    temporary = output.with_name(f".{output.name}.tmp")
    with open(temporary, "wb") as handle:
        np.save(handle, embeddings)
    os.replace(temporary, output)
    typer.echo(f"wrote {embeddings.shape[0]} x {embeddings.shape[1]} embeddings to {output}")


@app.command("download-data")
def download_data(
    dest: Annotated[Path, typer.Argument(help="Folder to create (then set CSEKIT_DATA to it).")],
) -> None:
    """Download SentEval's STS, STS-B and SICK data (needs a network)."""
    from csekit.data_dir import download_senteval_data

    path = download_senteval_data(dest)
    typer.echo(f"data in {path}; export CSEKIT_DATA={path}")


def main() -> None:
    """Entry point: run the app, turning user errors into one line and exit status 2."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        app()
    except CsekitError as error:
        print(f"csekit: error: {error}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("csekit: interrupted", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()

"""`csekit evaluate`'s printing: the papers' tables of one `EvalResult`, then what was evaluated and how."""

from __future__ import annotations

import typer

from csekit.evaluation.result import STS_AVERAGE, TRANSFER_AVERAGE, EvalResult
from csekit.evaluation.sts import format_sts_table
from csekit.evaluation.tasks import AVG_STS
from csekit.evaluation.transfer import format_transfer_table


def print_evaluation(result: EvalResult, groups: dict[str, list[str]]) -> None:
    """The STS table, the dev scores and their mean, the transfer table and alignment/uniformity, as run."""
    tasks, averages = result.tasks, result.averages
    if groups["sts"]:
        typer.echo(format_sts_table({**tasks, STS_AVERAGE: averages.get(STS_AVERAGE)}))
    for task in groups["dev"]:
        typer.echo(f"{task}: {100 * tasks[task]:.2f}")
    if averages.get(AVG_STS) is not None:
        typer.echo(f"{AVG_STS}: {100 * averages[AVG_STS]:.2f} (the mean of stsb-dev and sick-dev)")
    if groups["transfer"]:
        typer.echo(format_transfer_table({**tasks, TRANSFER_AVERAGE: averages.get(TRANSFER_AVERAGE)}))
    if groups["align"]:
        typer.echo(f"alignment {tasks['align']['align']:.4f}, uniformity {tasks['align']['uniform']:.4f} (STS-B dev)")

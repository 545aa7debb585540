"""What every `csekit` command shares: typer's command classes, the common options, and the checks made on
options before anything is loaded or written."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Annotated, Any

import typer
import typer.core
from typer.core import TyperCommand, TyperGroup

from csekit.core.atomic import refuse_unsafe_file
from csekit.core.errors import CsekitError
from csekit.training.recipe_schema import PRECISIONS


def _untyped_flags(params: list[Any]) -> list[Any]:
    """The parameters, with no `<bool>` beside a flag in `--help` (it reads as if the flag took a value)."""
    for param in params:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""  # typer prints the metavar, when one is set, instead of the type
    return params


class Command(TyperCommand):
    """typer's command; its `--help` shows a type beside options that take a value only."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _untyped_flags(super().get_params(ctx))


class Group(TyperGroup):
    """typer's group; its `--help` shows no `<bool>` beside `--help`."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _untyped_flags(super().get_params(ctx))


def shown_as_written(text: str) -> str:
    """`text` for a help string, its square brackets shown: typer's rich markup reads `[mteb]` as a style tag and
    drops it (`pip install 'csekit'`), unless the bracket is escaped."""
    return text.replace("[", "\\[") if getattr(typer.core, "HAS_RICH", False) else text


DataDirOption = Annotated[
    Path | None,
    typer.Option("--data-dir", help="SentEval data folder (default: $CSEKIT_DATA).", show_default=False),
]
PoolerOption = Annotated[
    str | None,
    typer.Option(
        "--pooler",
        help="cls, mean, max, first_last_avg, mask (prompt), pooler_output, ... or auto: a sentence-transformers "
        "folder's own pooling and normalisation (default: the model's own, else cls).",
    ),
]
PRECISION_MEANINGS = {
    "auto": "bf16 where the hardware runs it natively, else fp32",
    "fp32": "SentEval-exact, the numbers sentence-transformers gives",
    "bf16": "faster where native, moves STS numbers by < 0.003; emulated and slow on CPUs without native bf16",
    "fp16": "GPUs; slow on a CPU",
}
"""What each of the schema's precisions (`recipe_schema.PRECISIONS`, the one list) means for an encoding command."""


def precision_help() -> str:
    """`--precision`'s help: every precision of the schema's list with its meaning (a new one without: KeyError)."""
    *earlier, last = (f"{name} ({PRECISION_MEANINGS[name]})" for name in PRECISIONS)
    return f"{', '.join(earlier)} or {last}."


PrecisionOption = Annotated[str, typer.Option("--precision", help=precision_help())]
BatchSizeOption = Annotated[int, typer.Option(help="Sentences per forward pass.")]


def warn(message: str) -> None:
    """A warning line on stderr."""
    typer.echo(message, err=True)


def check_output_file(output: Path | None, option: str = "--output") -> None:
    """Refuse an output path that cannot become a file before the work, not after it (hours later): a folder, and
    what the write would refuse at the end (`core/atomic.refuse_unsafe_file`: a link, a FIFO, a device)."""
    if output is None:
        return
    if output.is_dir() and not output.is_symlink():
        raise CsekitError(f"{option} {output} is a folder; give a file name in it")
    refuse_unsafe_file(output)
    parent = next((folder for folder in output.parents if folder.exists()), None)
    if parent is not None and not parent.is_dir():
        raise CsekitError(f"{option} {output}: {parent} is a file, not a folder")


def require_at_least(option: str, value: int, minimum: int = 1) -> None:
    """Refuse an option below its minimum before anything is loaded or written."""
    if value < minimum:
        raise CsekitError(f"{option} must be at least {minimum}, got {value}")


def saving_output(output: Path) -> contextlib.AbstractContextManager[None]:
    """A failed write of a command's --output file (a full disk) is one line; the file is written atomically."""
    from csekit.core.save_guard import guarded_save

    return guarded_save(output.name, output.parent, f"{output} was not written (a previous version is unchanged)")

"""What `csekit` does before any command: its own option (`--version`), and transformers quieted without importing it.

A command imports what it runs; nothing here imports torch, transformers or scipy, so that `csekit --help`,
`csekit --version` and the mistakes found before a model loads answer at once (benchmarks/cli_startup.py).
"""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

from csekit.core.version import __version__


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"csekit {__version__}")
        raise typer.Exit()


VersionOption = Annotated[
    bool,
    typer.Option("--version", callback=_print_version, is_eager=True, help="Print csekit's version and exit."),
]


def quiet_transformers() -> None:
    """transformers' warnings and progress bars off (csekit says what matters in its own lines), without importing
    it (a second of torch) for a command that may never load a model: it reads these settings when imported."""
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        return
    os.environ["TRANSFORMERS_VERBOSITY"] = "error"
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"  # what transformers' disable_progress_bar() turns off
    if "huggingface_hub" in sys.modules:  # imported already (by a plugin): its setting is read, set it
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()

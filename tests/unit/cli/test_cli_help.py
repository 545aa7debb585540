"""Every command's `--help` as a newcomer reads it: each option says what it does and what it defaults to."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import typer
from typer.core import TyperGroup, TyperOption

from csekit.cli import app

COMMAND = typer.main.get_command(app)
assert isinstance(COMMAND, TyperGroup)
COMMANDS = sorted(COMMAND.commands.items())


def shows_its_default(option: Any) -> bool:
    """Whether `--help` tells the option's default: `[default: ...]` as click prints it, or the help text says it.

    typer (its own copy of click) prints none for a None or empty default, or for a flag that is off (False).
    """
    if option.required or "default" in (option.help or "").lower():
        return True
    if not option.show_default or option.default in (None, (), []):
        return False
    return not (option.is_flag and not option.secondary_opts and option.default is False)


@pytest.mark.parametrize(("name", "command"), COMMANDS, ids=[name for name, _ in COMMANDS])
def test_every_option_has_a_one_line_help_text_that_gives_its_default(name: str, command: Any) -> None:
    assert (command.help or "").strip(), f"csekit {name} has no description"
    for param in command.params:
        label = f"csekit {name} {param.opts[0]}"
        text = (getattr(param, "help", None) or "").strip()
        assert text, f"{label} has no help text"
        assert "\n" not in text, f"{label}: the help text is more than one line"
        if isinstance(param, TyperOption):
            assert shows_its_default(param), f"{label}: --help does not say its default"


def option(**values: Any) -> SimpleNamespace:
    """A stand-in for an option: the attributes `shows_its_default` reads."""
    return SimpleNamespace(**{"required": False, "show_default": True, "is_flag": False, "secondary_opts": []} | values)


def test_the_check_catches_an_option_that_hides_its_default() -> None:
    assert not shows_its_default(option(default=None, help="Stop after this many sentences."))
    assert not shows_its_default(option(default=False, is_flag=True, help="Whiten."))
    assert not shows_its_default(option(default=128, show_default=False, help="Sentences per pass."))
    assert shows_its_default(option(default=128, help="Sentences per pass."))
    assert shows_its_default(option(default=True, is_flag=True, secondary_opts=["--no-progress"], help="Bar."))
    assert shows_its_default(option(default=None, help="Write JSON here (default: print only)."))

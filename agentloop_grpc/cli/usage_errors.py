"""Usage errors (an unknown option, a bad choice, a missing value) in the style of every other CLI error.

Our commands end a bad config or option with one ``error: <message>`` line on standard error; click and typer
would print a usage line and a rich box instead. ``CommandGroup`` is the ``agentloop`` group's class: it catches
click's errors at the top, prints ``error: <message>`` and ``Try '<command> --help' for help.``, and exits with
click's code (2 for usage errors), for every subcommand below it; ``Command``, every command's class, makes sure
the hint names the command.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup

#: The exceptions of the click typer runs on: its own copy (``typer._click``) since typer 0.29, click before.
click_errors = importlib.import_module(typer.BadParameter.__module__)


class CommandGroup(TyperGroup):
    """A typer group whose click errors, its own and its subcommands', print as ``error: ...`` lines."""

    def make_context(self, *args: Any, **kwargs: Any) -> typer.Context:
        with _plain_errors():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx: typer.Context) -> Any:
        with _plain_errors():
            return super().invoke(ctx)


class Command(TyperCommand):
    """A typer command whose usage errors know their command (typer raises some without it), so the help hint
    names it."""

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click_errors.UsageError as error:
            error.ctx = error.ctx or ctx
            raise


def message(error: Exception) -> str:
    """The ``error: ...`` text of a click error (without the help hint)."""
    if isinstance(error, click_errors.NoSuchOption):
        text = f"no such option {error.option_name}"
        if error.possibilities:
            text += f" (did you mean {' or '.join(error.possibilities)}?)"
        return text
    text = error.format_message().replace("Value error, ", "").rstrip(".")  # pydantic's prefix says nothing
    return text[:1].lower() + text[1:] if text[1:2].islower() else text  # "Missing option" but not "YAML ..."


@contextmanager
def _plain_errors() -> Iterator[None]:
    try:
        yield
    except click_errors.NoArgsIsHelpError:  # not an error: the help is what the user asked for
        raise
    except click_errors.ClickException as error:
        typer.echo(f"error: {message(error)}", err=True)
        ctx = error.ctx if isinstance(error, click_errors.UsageError) else None
        if ctx is not None and ctx.command.get_help_option(ctx) is not None:
            typer.echo(f"Try '{ctx.command_path} --help' for help.", err=True)
        sys.exit(error.exit_code)

"""Where the CLI prints: rich consoles for stdout/stderr, verbosity, JSON output and error paragraphs."""

from __future__ import annotations

import json
import sys
import traceback
from typing import Any

from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup

from reshardctl.errors import ReshardError

_state = {"verbose": False, "quiet": False, "argv": None}


def configure(*, verbose: bool, quiet: bool) -> None:
    _state["verbose"] = verbose
    _state["quiet"] = quiet


def set_argv(argv: list[str]) -> None:
    """The command line as the user gave it (recorded in run directories)."""
    _state["argv"] = list(argv)


def argv() -> list[str]:
    import sys

    return list(_state["argv"] or sys.argv)


def verbose() -> bool:
    return bool(_state["verbose"])


def quiet() -> bool:
    return bool(_state["quiet"])


def console() -> Console:
    """stdout; when stdout is not a terminal (a pipe, a log file), wide enough for the report tables."""
    con = Console(highlight=False, soft_wrap=True)
    if not con.is_terminal:
        con = Console(highlight=False, soft_wrap=True, width=180)
    return con


def err_console() -> Console:
    return Console(stderr=True, highlight=False, soft_wrap=True)


def info(message: str) -> None:
    """Progress/info lines on stderr; silenced by --quiet."""
    if not quiet():
        err_console().print(message)


def print_json(data: Any) -> None:
    """Machine-readable output on stdout (never mixed with rich markup)."""
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()


def error(exc: ReshardError) -> None:
    kind = "error" if exc.exit_code == 2 else "failed"
    err_console().print(f"[bold red]{kind}:[/bold red] {escape(str(exc))}", markup=True, highlight=False)
    if verbose() and exc.exit_code != 2:
        err_console().print("".join(traceback.format_exception(exc)))


class HelpGroup(TyperGroup):
    """A command group that, called with no arguments, prints its help and exits 0 (a help screen is
    not an error); click's ``no_args_is_help`` exits 2. Use as ``typer.Typer(cls=HelpGroup, ...)``."""

    def parse_args(self, ctx, args):
        if not args and not ctx.resilient_parsing:
            text = ctx.get_help()  # typer renders rich help itself and returns ''
            if text:
                print(text)
            ctx.exit(0)
        return super().parse_args(ctx, args)

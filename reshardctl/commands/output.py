"""Where the CLI prints: rich consoles for stdout/stderr, verbosity, JSON output and error paragraphs.

rich is imported where a console or a table is made, not with this module: a command that prints JSON
only (`plan --json`) never loads it (rich.console and rich.table: about 0.03 s of the command's start)."""

from __future__ import annotations

import json
import math
import os
import sys
import traceback
from typing import TYPE_CHECKING, Any, Sequence

from typer.core import TyperGroup

from reshardctl.errors import ReshardError

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

_state = {"verbose": False, "quiet": False, "argv": None, "json_errors": False, "json_printed": False}


def configure(*, verbose: bool, quiet: bool) -> None:
    _state["verbose"] = verbose
    _state["quiet"] = quiet


def set_argv(argv: list[str]) -> None:
    """The command line as the user gave it (recorded in run directories)."""
    _state["argv"] = list(argv)


def set_json_errors(on: bool) -> None:
    """``--json`` was given: errors are printed as one JSON object on stdout (``error``)."""
    _state["json_errors"] = bool(on)
    _state["json_printed"] = False


def argv() -> list[str]:
    return list(_state["argv"] or sys.argv)


def verbose() -> bool:
    return bool(_state["verbose"])


def quiet() -> bool:
    return bool(_state["quiet"])


PIPED_WIDTH = 120  # the width of stdout when it is not a terminal and COLUMNS is not set


def console() -> Console:
    """stdout at the terminal's width; when stdout is not a terminal (a pipe, a log file) at ``COLUMNS``
    when set, else ``PIPED_WIDTH``."""
    from rich.console import Console

    con = Console(highlight=False, soft_wrap=True)
    if not con.is_terminal:
        cols = os.environ.get("COLUMNS", "")
        con = Console(highlight=False, soft_wrap=True, width=int(cols) if cols.isdigit() and int(cols) > 0 else PIPED_WIDTH)
    return con


def table(*columns: str, text: Sequence[str] = (), right: Sequence[str] = (), **kwargs: Any) -> Table:
    """A borderless table of ``columns``. Columns named in ``text`` wrap (words, then folded); every other
    column is a value column (numbers, units, names) kept whole on one line, right-aligned if in ``right``."""
    from rich.table import Table

    t = Table(show_header=True, header_style="bold", box=None, pad_edge=False, **kwargs)
    for c in columns:
        wrap = c in text
        t.add_column(c, justify="right" if c in right else "left", no_wrap=not wrap, overflow="fold")
    return t


_TEXT_MIN = 12  # the narrowest a wrapping column is squeezed to before secondary columns are dropped


def _needed_width(con: Console, t: Table) -> int:
    """The narrowest ``t`` renders without cutting a value column: value columns at their widest cell,
    text columns at ``_TEXT_MIN`` (or their widest cell, if narrower), one padding column each side."""
    from rich.measure import Measurement

    total = 0
    for col in t.columns:
        cells = [col.header, *col.cells]
        widths = [Measurement.get(con, con.options, con.render_str(c) if isinstance(c, str) else c) for c in cells]
        widest = max(m.maximum for m in widths)
        total += widest if col.no_wrap else min(widest, _TEXT_MIN)
    return total + 2 * max(len(t.columns) - 1, 0)


def fit_table(con: Console, t: Table, secondary: Sequence[str] = ()) -> list[str]:
    """Make ``t`` fit ``con``'s width: drop the ``secondary`` columns (by header, in the order named)
    while the value columns and the squeezed text columns do not fit. Returns the dropped headers."""
    dropped: list[str] = []
    for name in secondary:
        if _needed_width(con, t) <= con.width:
            break
        for i, col in enumerate(t.columns):
            if col.header == name:
                del t.columns[i]
                dropped.append(name)
                break
    for i, col in enumerate(t.columns):  # rich pads a column by its index (first/last: no outer padding)
        col._index = i
    return dropped


def print_table(t: Table, secondary: Sequence[str] = (), con: Console | None = None) -> None:
    """Print ``t`` on ``con`` (default stdout) fitted to its width (``fit_table``), and a footnote line
    naming the columns dropped to fit (``--json`` has them all)."""
    con = con or console()
    dropped = fit_table(con, t, secondary)
    con.print(t)
    if dropped:
        con.print(f"(left out to fit {con.width} columns: {', '.join(dropped)}; --json has all)",
                  markup=False, highlight=False)


def err_console() -> Console:
    from rich.console import Console

    return Console(stderr=True, highlight=False, soft_wrap=True)


def escape(text: str) -> str:
    """``rich.markup.escape``: ``text`` printed as itself on a console that reads markup."""
    from rich.markup import escape as rich_escape

    return rich_escape(text)


def info(message: str) -> None:
    """Progress/info lines on stderr; silenced by --quiet."""
    if not quiet():
        err_console().print(message)


def _finite(data: Any, path: str, seen: dict[str, str]) -> Any:
    """``data`` with every NaN/infinite float replaced by None, its path and value recorded in ``seen``."""
    if isinstance(data, float) and not math.isfinite(data):
        seen[path or "."] = repr(data)
        return None
    if isinstance(data, dict):
        return {k: _finite(v, f"{path}.{k}" if path else str(k), seen) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_finite(v, f"{path}[{i}]", seen) for i, v in enumerate(data)]
    return data


def strict_json(data: Any) -> str:
    """Strict JSON (RFC 8259: no NaN or Infinity): a non-finite number is printed as null, and an object
    gets ``non_finite``: {path: "nan" | "inf" | "-inf"} saying which values were and why they are null."""
    seen: dict[str, str] = {}
    clean = _finite(data, "", seen)
    if seen and isinstance(clean, dict):
        clean["non_finite"] = seen
    return json.dumps(clean, indent=2, sort_keys=False, default=str, allow_nan=False)


def print_json(data: Any) -> None:
    """Machine-readable output on stdout (never mixed with rich markup), strict JSON (``strict_json``).
    One object per command: a command that printed its report (a failed run's summary, a refused
    promotion) carries its error in it, so ``error`` prints no second object."""
    sys.stdout.write(strict_json(data) + "\n")
    sys.stdout.flush()
    _state["json_printed"] = True


def error_json(kind: str, message: str, exit_code: int, **extra: Any) -> None:
    """One error as JSON on stdout: ``{"error": {"type", "message", "exit_code", ...}}``."""
    print_json({"error": {"type": kind, "message": message, "exit_code": exit_code, **extra}})


def error(exc: ReshardError) -> None:
    if _state["json_errors"]:
        if _state["json_printed"]:  # the report on stdout says what failed (its "error"/"decision")
            return
        extra = {"problems": exc.violations} if len(getattr(exc, "violations", ())) > 1 else {}
        if exc.hint:
            extra["hint"] = exc.hint
        error_json(type(exc).__name__, exc.message, exc.exit_code, **extra)
        return
    kind = "error" if exc.exit_code == 2 else "failed"
    err_console().print(f"[bold red]{kind}:[/bold red] {escape(str(exc))}", markup=True, highlight=False)
    if verbose() and exc.exit_code != 2:
        err_console().print("".join(traceback.format_exception(exc)))


def usage_error(exc) -> None:
    """A click usage error (unknown option, bad value): click's own rich panel, or JSON with ``--json``."""
    if _state["json_errors"]:
        error_json("UsageError", exc.format_message(), exc.exit_code)
        return
    from typer import rich_utils

    rich_utils.rich_format_error(exc)


def os_error(exc: OSError) -> None:
    """An OS error no command turned into a ReshardError (exit 1)."""
    where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
    message = f"{exc.strerror or exc}{where}"
    if _state["json_errors"]:
        error_json("OSError", message, 1)
        return
    err_console().print(f"[bold red]failed:[/bold red] {escape(message)}\n"
                        "an operating-system error (a file, directory or device) stopped reshardctl; "
                        "--verbose shows where", markup=True, highlight=False)
    if verbose():
        err_console().print("".join(traceback.format_exception(exc)), markup=False)


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

"""The typer app. Each command: parse options, call the library, print.

Library code raises ``ReshardError`` subclasses; ``main`` turns them into a one-paragraph message on
stderr and exit code 2 (bad input) or 1 (runtime failure). No traceback for user errors
(``--verbose`` adds it for runtime failures).
"""

from __future__ import annotations

import sys
import traceback

import typer
from rich.markup import escape

from reshardctl import __version__
from reshardctl.commands import output
from reshardctl.errors import ReshardError

app = typer.Typer(
    name="reshardctl",
    help="Plan, run, verify and roll back RL weight refits (M2N reshard vs gather-and-broadcast).",
    cls=output.HelpGroup,
    pretty_exceptions_show_locals=False,
    pretty_exceptions_enable=False,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        print(f"reshardctl {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Add tracebacks to runtime failures (exit code 1) and OS errors."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Only errors and the requested output."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """reshardctl: fast, exact, safe weight refit for disaggregated RL post-training."""
    output.configure(verbose=verbose, quiet=quiet)


# --- command registration: one line per command module -------------------------------------------
from reshardctl.commands import profile as _profile  # noqa: E402
from reshardctl.commands import layout as _layout  # noqa: E402
from reshardctl.commands import model as _model  # noqa: E402
from reshardctl.commands.plan import plan_cmd as _plan_cmd  # noqa: E402
from reshardctl.commands.run import bench_cmd as _bench_cmd  # noqa: E402
from reshardctl.commands.run import run_cmd as _run_cmd  # noqa: E402
from reshardctl.commands import runbook as _runbook  # noqa: E402
from reshardctl.commands.report import report_cmd as _report_cmd  # noqa: E402
from reshardctl.commands import slurm as _slurm  # noqa: E402

app.add_typer(_profile.app, name="profile")
app.add_typer(_layout.app, name="layout")
app.add_typer(_model.app, name="model")
app.command("plan")(_plan_cmd)
app.command("run")(_run_cmd)
app.command("bench")(_bench_cmd)
app.command("status")(_runbook.status_cmd)
app.command("promote")(_runbook.promote_cmd)
app.command("rollback")(_runbook.rollback_cmd)
app.command("report")(_report_cmd)
app.command("jobs")(_slurm.jobs_cmd)
app.command("cancel")(_slurm.cancel_cmd)
app.command("collect")(_slurm.collect_cmd)


def main(argv: list[str] | None = None) -> int:
    """Console entry point. Returns (and, without ``argv``, exits with) the process exit code.

    Typer runs in standalone mode, so usage errors print click's message and exit 2 by themselves.
    """
    output.set_argv(["reshardctl", *argv] if argv is not None else sys.argv)
    try:
        app(args=argv, prog_name="reshardctl")
        code = 0
    except ReshardError as exc:
        output.error(exc)
        code = exc.exit_code
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except OSError as exc:  # last resort: a file or device error no command turned into a ReshardError
        where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
        output.err_console().print(
            f"[bold red]failed:[/bold red] {escape(exc.strerror or str(exc))}{escape(where)}\n"
            "an operating-system error (a file, directory or device) stopped reshardctl; "
            "--verbose shows where", markup=True, highlight=False)
        if output.verbose():
            output.err_console().print("".join(traceback.format_exception(exc)), markup=False)
        code = 1
    except KeyboardInterrupt:
        output.err_console().print("interrupted")
        code = 130
    if argv is None:
        sys.exit(code)
    return code


if __name__ == "__main__":  # pragma: no cover
    main()

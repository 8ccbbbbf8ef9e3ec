"""The typer app. Each command: parse options, call the library, print.

Library code raises ``ReshardError`` subclasses; ``main`` turns them into a one-paragraph message on
stderr (with ``--json``: one JSON object on stdout) and exit code 2 (bad input) or 1 (runtime failure).
No traceback for user errors (``--verbose`` adds it for runtime failures). ``-v``/``-q`` work anywhere
on the command line.
"""

from __future__ import annotations

import importlib
import os
import sys


def _import_numpy_with_one_blas_thread() -> None:
    """The commands' numpy work is on small matrices (per round, per bucket), where OpenBLAS's worker
    threads cost more than they give: after each product they spin waiting for the next, and on a machine
    with few cores they take the CPU the planner needs (`plan`, the DeepSeek-V3 256+256 case on 2 busy
    cores: about 0.3 s of 2.5). OpenBLAS reads its thread count once, when numpy loads: one thread for
    this process unless the user set a count, and the environment is restored, so the processes a
    command starts (the refit's ranks) see the user's own."""
    if "numpy" in sys.modules or "OPENBLAS_NUM_THREADS" in os.environ or "OMP_NUM_THREADS" in os.environ:
        return
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    try:
        importlib.import_module("numpy")
    finally:
        del os.environ["OPENBLAS_NUM_THREADS"]


_import_numpy_with_one_blas_thread()

import typer  # noqa: E402
import typer.main  # noqa: E402

from reshardctl import __version__  # noqa: E402
from reshardctl.commands import output  # noqa: E402
from reshardctl.errors import ReshardError  # noqa: E402

app = typer.Typer(
    name="reshardctl",
    help="Plan, run, verify and roll back RL weight refits (M2N reshard vs gather-and-broadcast).",
    cls=output.HelpGroup,
    pretty_exceptions_show_locals=False,
    pretty_exceptions_enable=False,
    add_completion=True,
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
from reshardctl.commands.calibrate import calibrate_cmd as _calibrate_cmd  # noqa: E402
from reshardctl.commands import runbook as _runbook  # noqa: E402
from reshardctl.commands.report import report_cmd as _report_cmd  # noqa: E402
from reshardctl.commands.trace import trace_cmd as _trace_cmd  # noqa: E402
from reshardctl.commands import slurm as _slurm  # noqa: E402
from reshardctl.commands.selftest import selftest_cmd as _selftest_cmd  # noqa: E402

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
app.command("trace")(_trace_cmd)
app.command("jobs")(_slurm.jobs_cmd)
app.command("cancel")(_slurm.cancel_cmd)
app.command("collect")(_slurm.collect_cmd)
app.command("calibrate")(_calibrate_cmd)
app.command("selftest")(_selftest_cmd)


_GLOBAL_FLAGS = ("-v", "--verbose", "-q", "--quiet")


def hoist_global_flags(args: list[str]) -> list[str]:
    """``-v``/``--verbose``/``-q``/``--quiet`` anywhere on the line (before a ``--``) work as if given
    before the command: ``reshardctl plan --verbose`` == ``reshardctl --verbose plan``."""
    end = args.index("--") if "--" in args else len(args)
    flags = [a for a in args[:end] if a in _GLOBAL_FLAGS]
    return flags + [a for a in args[:end] if a not in _GLOBAL_FLAGS] + args[end:]


def _command():
    """The click command of ``app``, with help placeholders that name what to give (``N``, ``FILE``),
    never a Python type, and none for flags (they take no value)."""
    cmd = typer.main.get_command(app)
    _placeholders(cmd)
    return cmd


def _placeholders(cmd) -> None:
    ctx = cmd.context_class(cmd, info_name=cmd.name, help_option_names=["-h", "--help"])
    help_option = cmd.get_help_option(ctx)  # created once per command (typer caches it), -h/--help
    for param in [*cmd.params, *([help_option] if help_option is not None else [])]:
        _placeholder(param)
    for sub in getattr(cmd, "commands", {}).values():
        _placeholders(sub)


def _placeholder(param) -> None:
    """One parameter: a flag shows nothing, a value its metavar (``N``, ``NUMBER``, the option's name),
    an argument its name without a type, and a numeric range is said in words in the help text."""
    lo, hi = getattr(param, "min", None), getattr(param, "max", None)
    if lo is not None or hi is not None:
        words = " and ".join(w for w in (f"at least {lo}" if lo is not None else "",
                                         f"at most {hi}" if hi is not None else "") if w)
        param.help = f"{(param.help or '').rstrip('.')} ({words})."
        param._get_number_range_help_str = lambda: None  # typer would print "[x>=1]"
    if getattr(param, "param_type_name", "") == "argument":
        param.display_type_rich = lambda ctx: None  # the name says it (PROFILE, FILES...)
        if param.metavar is None:
            param.metavar = param.name.upper()
        return
    if param.metavar is not None:
        return
    if param.is_flag:
        param.metavar = ""
    else:
        kind = param.bare_type() if hasattr(param, "bare_type") else ""
        param.metavar = "N" if "int" in kind else "NUMBER" if "float" in kind else param.name.upper().replace("_", "-")


def main(argv: list[str] | None = None) -> int:
    """Console entry point. Returns (and, without ``argv``, exits with) the process exit code.

    Errors: one paragraph on stderr, exit 2 (bad input: ``InputError``, or a usage error) or 1 (runtime
    failure). With ``--json`` every error is instead one JSON object on stdout (docs/plan-format.md,
    "Errors with --json"): ``{"error": {"type", "message", "exit_code"}}``, and nothing on stderr.
    """
    from typer import Abort

    try:
        from typer._click.exceptions import ClickException  # typer >= 0.24 vendors click
    except ImportError:  # pragma: no cover - older typer on top of click
        from click.exceptions import ClickException

    args = hoist_global_flags(list(sys.argv[1:] if argv is None else argv))
    output.set_argv(["reshardctl", *args])
    output.set_json_errors("--json" in args[: args.index("--") if "--" in args else len(args)])
    try:
        rv = _command().main(args=args, prog_name="reshardctl", standalone_mode=False)
        code = rv if isinstance(rv, int) else 0
    except ReshardError as exc:
        output.error(exc)
        code = exc.exit_code
    except ClickException as exc:  # usage errors (unknown option, missing value): exit 2
        output.usage_error(exc)
        code = exc.exit_code
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except OSError as exc:  # last resort: a file or device error no command turned into a ReshardError
        output.os_error(exc)
        code = 1
    except (KeyboardInterrupt, Abort):
        output.err_console().print("interrupted")
        code = 130
    if argv is None:  # the process ends here
        from reshardctl.gc_pause import frozen_for_exit

        frozen_for_exit()
        sys.exit(code)
    return code


if __name__ == "__main__":  # pragma: no cover
    main()

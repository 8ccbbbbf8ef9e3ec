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

def _new_app() -> typer.Typer:
    app = typer.Typer(
        name="reshardctl",
        help="Plan, run, verify and roll back RL weight refits (M2N reshard vs gather-and-broadcast).",
        cls=output.HelpGroup,
        pretty_exceptions_show_locals=False,
        pretty_exceptions_enable=False,
        add_completion=True,
        context_settings={"help_option_names": ["-h", "--help"]},
    )
    app.callback()(_root)
    return app


def _version(value: bool) -> None:
    if value:
        print(f"reshardctl {__version__}")
        raise typer.Exit()


def _root(
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Add tracebacks to runtime failures (exit code 1) and OS errors."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Only errors and the requested output."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """reshardctl: fast, exact, safe weight refit for disaggregated RL post-training."""
    output.configure(verbose=verbose, quiet=quiet)


# --- the commands, in help order: name -> (module, attribute); a typer app is a group of subcommands.
# A command line naming one of them imports that module alone (``plan`` does not load ``run``'s runtime
# or ``report``'s plotting: about 0.05 s of its start); help, completion and unknown names load them all.
COMMANDS: dict[str, tuple[str, str]] = {
    "profile": ("reshardctl.commands.profile", "app"),
    "layout": ("reshardctl.commands.layout", "app"),
    "model": ("reshardctl.commands.model", "app"),
    "plan": ("reshardctl.commands.plan", "plan_cmd"),
    "run": ("reshardctl.commands.run", "run_cmd"),
    "bench": ("reshardctl.commands.run", "bench_cmd"),
    "status": ("reshardctl.commands.runbook", "status_cmd"),
    "promote": ("reshardctl.commands.runbook", "promote_cmd"),
    "rollback": ("reshardctl.commands.runbook", "rollback_cmd"),
    "report": ("reshardctl.commands.report", "report_cmd"),
    "trace": ("reshardctl.commands.trace", "trace_cmd"),
    "jobs": ("reshardctl.commands.slurm", "jobs_cmd"),
    "cancel": ("reshardctl.commands.slurm", "cancel_cmd"),
    "collect": ("reshardctl.commands.slurm", "collect_cmd"),
    "calibrate": ("reshardctl.commands.calibrate", "calibrate_cmd"),
    "selftest": ("reshardctl.commands.selftest", "selftest_cmd"),
}


_GLOBAL_FLAGS = ("-v", "--verbose", "-q", "--quiet")


def named_command(args: list[str]) -> str | None:
    """The command ``args`` (global flags hoisted first) names, or None: no name (help, ``--version``,
    ``--show-completion``), a name that is not a command, or shell completion asking."""
    if "_RESHARDCTL_COMPLETE" in os.environ:
        return None
    first = next((a for a in args if not a.startswith("-")), None)
    if first is None or first != next((a for a in args if a not in _GLOBAL_FLAGS), None):
        return None  # a root option before the name (--show-completion SHELL): not a command line
    return first if first in COMMANDS else None


def _app(only: str | None = None) -> typer.Typer:
    """The typer app with every command, or only the command ``only``."""
    app = _new_app()
    for name, (module, attr) in COMMANDS.items():
        if only is None or name == only:
            obj = getattr(importlib.import_module(module), attr)
            if isinstance(obj, typer.Typer):
                app.add_typer(obj, name=name)
            else:
                app.command(name)(obj)
    return app



def hoist_global_flags(args: list[str]) -> list[str]:
    """``-v``/``--verbose``/``-q``/``--quiet`` anywhere on the line (before a ``--``) work as if given
    before the command: ``reshardctl plan --verbose`` == ``reshardctl --verbose plan``."""
    end = args.index("--") if "--" in args else len(args)
    flags = [a for a in args[:end] if a in _GLOBAL_FLAGS]
    return flags + [a for a in args[:end] if a not in _GLOBAL_FLAGS] + args[end:]


def _command(only: str | None = None):
    """The click command of the app (every command, or only ``only``: ``_app``), with help placeholders
    that name what to give (``N``, ``FILE``), never a Python type, and none for flags (they take no value)."""
    cmd = typer.main.get_command(_app(only))
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
        rv = _command(named_command(args)).main(args=args, prog_name="reshardctl", standalone_mode=False)
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

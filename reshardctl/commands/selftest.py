"""`reshardctl selftest [--gpu]`: check the runtime's pack/unpack, checksums, stream ordering and pinned
staging on this machine's device (and, with several GPUs, a real NCCL refit). One line per check; exit 0
when all passed (or when --gpu found no CUDA device: skipped, said why), 1 when a check failed.
The checks: reshardctl/runtime/selftest.py (in-process), commands/selftest_refit.py (the NCCL refit through
`reshardctl run`); docs/gpu.md."""

from __future__ import annotations

from typing import List, Optional

import typer

from reshardctl.commands import options as opt
from reshardctl.commands import output
from reshardctl.errors import InputError


def selftest_cmd(
    gpu: bool = typer.Option(False, "--gpu", help="Run the checks on this process's CUDA device (and a real NCCL refit "
                                                  "with >= 2 GPUs); without a CUDA device: skipped, exit 0."),
    as_json: bool = opt.JSON,
    inject_fault: Optional[List[str]] = typer.Option(None, "--inject-fault", hidden=True, metavar="CHECK",
                                                     help="Break this check on purpose (tests: each check can fail)."),
) -> None:
    """Prove the GPU path on this machine: pack, checksums, stream order, pinned staging, NCCL refit."""
    from reshardctl.commands.selftest_refit import GPU_CHECKS  # torch: imported when the command runs
    from reshardctl.runtime.selftest import CPU_CHECKS, run_selftest

    from reshardctl.runtime.checksum_choice import env_problem

    if env_problem():
        raise InputError(env_problem())
    checks = (*CPU_CHECKS, *GPU_CHECKS)
    inject = list(inject_fault or [])
    unknown = sorted(set(inject) - set(checks))
    if unknown:
        raise InputError(f"--inject-fault {', '.join(unknown)}: the checks are {', '.join(checks)}")
    con = output.console()
    live = not as_json
    if live:
        output.info("selftest: " + ("GPU checks" if gpu else "CPU checks (the same code; --gpu for the device)"))
    report = run_selftest(gpu, inject=inject, gpu_checks=GPU_CHECKS,
                          on_result=(lambda c: con.print(c.line(), markup=False, highlight=False)) if live else None)
    if as_json:
        output.print_json(report.to_json())
    elif report.skipped:
        con.print(f"GPU checks skipped: {report.why}", markup=False, highlight=False)
    else:
        failed = [c.name for c in report.checks if not c.ok]
        ran = [c for c in report.checks if not c.skipped]
        head = f"selftest on {report.device} ({report.why}), {report.wall_s:.1f} s: "
        if failed:
            con.print(head + f"{len(failed)} of {len(report.checks)} checks FAILED: {', '.join(failed)}",
                      markup=False, highlight=False)
        else:
            skipped = len(report.checks) - len(ran)
            con.print(head + f"all {len(ran)} checks passed" + (f", {skipped} skipped" if skipped else ""),
                      markup=False, highlight=False)
    if not report.ok:
        raise typer.Exit(1)

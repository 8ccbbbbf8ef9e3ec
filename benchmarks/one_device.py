"""The steps of benchmarks/gpu_one_device.sh, one per process (the script puts each under `timeout`):

    python benchmarks/one_device.py STEP OUT_DIR [--cpu]     # writes OUT_DIR/STEP.json
    python benchmarks/one_device.py summary OUT_DIR          # OUT_DIR/summary.json and the pass/fail table

Each step writes ``{step, status, ok, seconds, why, device, torch, detail}``: ``status`` is ``pass``,
``fail`` or ``skipped`` (``ok`` is False only for ``fail``). ``--cpu`` (or no CUDA device): the steps that
can run on the CPU run there (install, selftest, checksums, rates, gloo_refit); the GPU-only steps
(staging, nccl_abort, calibrate) are ``skipped`` with the reason and, where it is cheap, a CPU rehearsal
of their own code in ``detail.rehearsal`` (so a typo shows before a GPU is lent; a rehearsal proves
nothing about the GPU). ``ONE_DEVICE_INJECT=step,...`` breaks those steps on purpose (a corrupted byte in
what they compare, or a wrong expectation), ``ONE_DEVICE_HANG=step`` makes one hang: the tests prove a step
can fail and that the script's limit ends a hung one.

Step logic: one_device_checks.py (checksums, rates, staging, calibrate), one_device_refit.py
(gloo_refit), one_device_nccl.py (nccl_abort); docs/gpu.md, "What one GPU proves".
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(ROOT))
if __name__ == "__main__":  # the step modules import Skip and Fail from here: one module, one class each
    sys.modules.setdefault("one_device", sys.modules[__name__])

STEPS = ("install", "selftest", "checksums", "rates", "staging", "gloo_refit", "nccl_abort", "calibrate")
GPU_ONLY = ("staging", "nccl_abort", "calibrate")  # skipped without CUDA (a CPU rehearsal where cheap)
DEPS = ("numpy", "typer", "rich", "yaml", "safetensors")  # pyproject's, torch apart (matplotlib: reports only)


class Skip(Exception):
    """The step cannot run here; ``detail`` still goes to its JSON (a rehearsal, what it would need)."""

    def __init__(self, why: str, detail: dict | None = None):
        super().__init__(why)
        self.detail = detail or {}


class Fail(Exception):
    def __init__(self, why: str, detail: dict | None = None):
        super().__init__(why)
        self.detail = detail or {}


def injected(step: str) -> bool:
    return step in {s.strip() for s in os.environ.get("ONE_DEVICE_INJECT", "").split(",")}


def write_json(path: Path, obj: dict) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=str) + "\n")
    tmp.replace(path)


# ---- install / selftest ----------------------------------------------------------------------------
def step_install(ctx) -> dict:
    """The interpreter the script chose: torch (never installed here), its CUDA, the device, the deps."""
    import importlib

    import torch

    deps, missing = {}, []
    for name in DEPS:
        try:
            deps[name] = getattr(importlib.import_module(name), "__version__", "?")
        except ImportError:
            missing.append(name)
    import reshardctl

    detail = {"python": sys.executable, "python_version": sys.version.split()[0], "torch": torch.__version__,
              "torch_cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available(),
              "reshardctl": reshardctl.__version__, "reshardctl_from": str(Path(reshardctl.__file__).parent),
              "deps": deps, "missing": missing, "pydeps": os.environ.get("ONE_DEVICE_PYDEPS") or None,
              "how": os.environ.get("ONE_DEVICE_HOW", "")}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        detail.update(device_count=torch.cuda.device_count(), device_name=props.name,
                      capability=f"{props.major}.{props.minor}", memory_gib=round(props.total_memory / 2**30, 1),
                      nccl=".".join(map(str, torch.cuda.nccl.version())),
                      cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"))
    if missing:
        raise Fail(f"missing {', '.join(missing)} (no network here: install them from a local wheel directory, "
                   "RESHARDCTL_WHEELS=DIR)", detail)
    if not ctx["cpu"] and not torch.cuda.is_available():
        raise Fail("no CUDA device visible to this torch", detail)
    where = (f"{detail['device_name']} x{detail['device_count']}, CUDA {torch.version.cuda}, NCCL {detail['nccl']}"
             if torch.cuda.is_available() else "no CUDA")
    detail["headline"] = f"torch {torch.__version__} ({where}), python {detail['python_version']}; {detail['how']}"
    return detail


def step_selftest(ctx) -> dict:
    """`reshardctl selftest --gpu --json` (the CPU checks without CUDA): the CLI's own entry point, here."""
    import contextlib
    import io

    from reshardctl.cli import main as cli

    argv = ["selftest", "--json"] + ([] if ctx["cpu"] else ["--gpu"])
    if injected("selftest"):
        argv += ["--inject-fault", "checksums"]
    if not ctx["cpu"]:
        os.environ.pop("RESHARDCTL_FORCE_CPU", None)  # the NCCL check's ranks would refuse CUDA
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = cli(argv)
    try:
        rep = json.loads(buf.getvalue())
    except json.JSONDecodeError:
        raise Fail(f"exit {code}, no JSON: {buf.getvalue()[-600:]}") from None
    checks = [{k: c.get(k) for k in ("name", "ok", "skipped", "numbers", "detail")} for c in rep.get("checks", [])]
    detail = {"argv": argv, "exit": code, "device": rep.get("device"), "why": rep.get("why"),
              "skipped": rep.get("skipped"), "checks": checks}
    failed = [c["name"] for c in checks if not c["ok"]]
    if code != 0 or failed or not rep.get("ok"):
        raise Fail(f"exit {code}; failed: {', '.join(failed) or '-'}", detail)
    if not ctx["cpu"] and rep.get("skipped"):
        raise Fail(f"--gpu skipped: {rep.get('why')}", detail)
    ran = [c["name"] for c in checks if not c["skipped"]]
    skipped = [c["name"] for c in checks if c["skipped"]]
    detail["headline"] = (f"on {rep.get('device')}: {', '.join(ran)} ok" + (f"; skipped {', '.join(skipped)}"
                                                                             if skipped else ""))
    return detail


# ---- the runner ------------------------------------------------------------------------------------
def _funcs():
    import one_device_checks as checks
    import one_device_nccl as nccl
    import one_device_refit as refit

    return {"install": step_install, "selftest": step_selftest, "checksums": checks.step_checksums,
            "rates": checks.step_rates, "staging": checks.step_staging, "gloo_refit": refit.step_gloo_refit,
            "nccl_abort": nccl.step_nccl_abort, "calibrate": checks.step_calibrate}


def run_step(step: str, out: Path, cpu: bool) -> int:
    t0 = time.perf_counter()
    rec = {"step": step, "status": "fail", "ok": False, "seconds": 0.0, "why": "", "device": "", "torch": "",
           "detail": {}}
    try:
        import torch

        cuda = torch.cuda.is_available() and not cpu
        rec.update(torch=torch.__version__, device=torch.cuda.get_device_name(0) if cuda else "cpu")
        ctx = {"cpu": not cuda, "out": out, "device": torch.device("cuda", 0) if cuda else torch.device("cpu")}
        if cuda:
            torch.cuda.set_device(0)
        if os.environ.get("ONE_DEVICE_HANG") == step:  # the tests: a step the script's `timeout` must end
            time.sleep(3600)
        rec["detail"] = _funcs()[step](ctx) or {}
        rec.update(status="pass", ok=True)
    except Skip as exc:
        rec.update(status="skipped", ok=True, why=str(exc), detail=exc.detail)
    except Fail as exc:
        rec.update(why=str(exc), detail=exc.detail)
    except BaseException as exc:  # noqa: BLE001 - the step failed; the script goes on with the next
        rec.update(why=f"{type(exc).__name__}: {exc}", detail={"traceback": traceback.format_exc()[-3000:]})
    rec["seconds"] = round(time.perf_counter() - t0, 3)
    write_json(out / f"{step}.json", rec)
    print(f"{rec['status'].upper()} {step} ({rec['seconds']:.1f} s){': ' + rec['why'] if rec['why'] else ''}")
    return 0 if rec["ok"] else 1


def _headline(rec: dict) -> str:
    d = rec.get("detail") or {}
    if rec.get("status") != "pass":
        return rec.get("why", "")
    return str(d.get("headline", ""))


def summary(out: Path, steps: list[str]) -> int:
    """summary.json from the steps' files (a step without one: failed, as the script recorded), and the
    table; exit 1 when any step failed."""
    rows = []
    for step in steps:
        p = out / f"{step}.json"
        try:
            rec = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            rec = {"step": step, "status": "fail", "ok": False, "seconds": None, "why": f"no result ({exc})"}
        rows.append(rec)
    ok = all(r.get("ok") for r in rows)
    total = sum(r.get("seconds") or 0 for r in rows)
    doc = {"ok": ok, "passed": [r["step"] for r in rows if r.get("status") == "pass"],
           "failed": [r["step"] for r in rows if r.get("status") == "fail"],
           "skipped": [r["step"] for r in rows if r.get("status") == "skipped"],
           "device": next((r.get("device") for r in rows if r.get("device")), ""), "steps_seconds": round(total, 1),
           "steps": [{k: r.get(k) for k in ("step", "status", "seconds", "why")} | {"headline": _headline(r)}
                     for r in rows]}
    write_json(out / "summary.json", doc)
    print(f"{'step':<11} {'status':<8} {'seconds':>8}  what")
    for r in rows:
        secs = "-" if r.get("seconds") is None else f"{r['seconds']:.1f}"
        text = _headline(r)
        print(f"{r['step']:<11} {r.get('status', 'fail'):<8} {secs:>8}  {text[:160]}")
    print(f"gpu_one_device: {'all steps passed or skipped' if ok else 'FAILED: ' + ', '.join(doc['failed'])} "
          f"({len(doc['passed'])} passed, {len(doc['skipped'])} skipped, {len(doc['failed'])} failed; "
          f"{total:.0f} s in steps)")
    return 0 if ok else 1


def main(argv: list[str]) -> int:
    if len(argv) < 2 or (argv[0] not in STEPS and argv[0] != "summary"):
        print(f"usage: one_device.py STEP|summary OUT_DIR [--cpu] [STEPS...]; steps: {' '.join(STEPS)}",
              file=sys.stderr)
        return 2
    out = Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    if argv[0] == "summary":
        return summary(out, argv[2:] or list(STEPS))
    return run_step(argv[0], out, "--cpu" in argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Step nccl_abort of benchmarks/gpu_one_device.sh: the bounded failure path of one NCCL rank.

One GPU cannot hold a two-rank NCCL communicator, so the probe is one process, world size 1, built by the
runtime's own code (``groups.rendezvous`` and ``groups.init_groups``: reshardctl's monitor settings,
``TORCH_NCCL_ASYNC_ERROR_HANDLING=2``, the device-bound default group) with a short
``TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC`` set by the parent:

* A1, a receive whose sender never comes: ``irecv`` from its own rank (torch allows it), no send, on
  groups whose own timeout is long (``LONG_S``); waited by ``bounded_wait.wait_works`` (host blocked in
  ``Event.synchronize()``, the deadline in a ``DeadlineWatch`` thread). Where NCCL leaves it pending, only
  reshardctl's watch can end it: it must abort the communicator (``abort.abort_data_plane``) past the
  deadline and the host must be released: the claim docs/gpu.md could only reason about.
* A2, the same on groups rebuilt with torch's timeout equal to the deadline, as a refit builds them:
  torch's watchdog times the work out first (then sleeps 4 s and aborts); whoever ends it, the host must
  be back within the bound, and the process must live ``2 x heartbeat + 1`` seconds after it (torch's
  monitor would have killed it by then), whether or not torch wrote ``exception_dump`` to the store.
* B, only where the self-receive never stayed pending (NCCL refused or completed it): an all-reduce
  posted behind a device sleep longer than the deadline: the watch aborts at the deadline and the wait
  ends (when the sleep ends) with the timeout's error.
* After each: ``groups.rebuild`` (the key deleted, fresh groups) and an all-reduce on the rebuilt group.

Run as a child (``--child``) by ``step_nccl_abort``, which judges its JSON and its exit status (a
monitor kill is a signal). Without CUDA the child runs on gloo as a rehearsal of this code (gloo refuses
a receive from itself at once; nothing of NCCL is shown).
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

# TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC for the child (torch's default: 480 s). Above the 4 s a failed group's
# watchdog sleeps before it aborts (4 x TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC, 1000 ms under reshardctl), so
# a kill inside the window is the monitor reacting to the failure, not a watchdog that merely slept
HEARTBEAT_S = 6
LONG_S = 60.0  # the groups' own (torch's) timeout in phase A1 and B: beyond reshardctl's deadline
MONITOR_VARS = ("TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", "TORCH_NCCL_DUMP_ON_TIMEOUT", "TORCH_NCCL_ENABLE_MONITORING",
                "TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC")


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _health(groups, timeout_s: float) -> dict:
    import torch
    import torch.distributed as dist

    from reshardctl.runtime.bounded_wait import wait_works

    x = torch.full((4,), 3.0, device=groups.device)
    t0 = time.monotonic()
    wait_works([dist.all_reduce(x, group=groups.data, async_op=True)], groups, timeout_s, "health all-reduce")
    return {"ok": bool((x.cpu() == 3.0).all()), "seconds": round(time.monotonic() - t0, 3)}


def _dump_key(store) -> bool | None:
    from reshardctl.runtime.nccl_watchdog import DUMP_KEY, root_store
    from reshardctl.runtime.run_store import for_torch

    try:
        return bool(root_store(for_torch(store)).check([DUMP_KEY]))
    except Exception:  # noqa: BLE001 - informational
        return None


def _wait_phase(name: str, post, groups, timeout_s: float, aborts: list) -> dict:
    """Post (``post()`` -> works) and wait bounded; what happened, and how long until the host was back.
    ``outcome``: refused (the post raised), timeout (reshardctl's deadline: ``TransferError``), error (a
    ``RuntimeError``, or a ``TransferError`` of another kind), completed (the wait returned: then
    ``work_after`` says whether the work itself had failed, e.g. torch's watchdog timed it out first)."""
    from reshardctl.errors import TransferError
    from reshardctl.runtime.bounded_wait import wait_works

    out: dict = {"phase": name}
    t0 = time.monotonic()
    try:
        works = post()
    except (RuntimeError, ValueError) as exc:
        out.update(outcome="refused", error=f"{type(exc).__name__}: {exc}"[:400])
        return out
    out["post_s"] = round(time.monotonic() - t0, 3)
    say(f"{name}: posted; waiting (deadline {timeout_s:g} s)")
    n0 = len(aborts)
    try:
        wait_works(works, groups, timeout_s, name)
        out["outcome"] = "completed"
    except TransferError as exc:
        out.update(outcome="timeout" if "not complete within" in str(exc) else "error", error=str(exc)[:400])
    except RuntimeError as exc:
        out.update(outcome="error", error=f"{type(exc).__name__}: {exc}"[:400])
    out["released_s"] = round(time.monotonic() - t0, 3)
    out["aborts"] = aborts[n0:]
    out["groups_aborted"] = bool(getattr(groups, "aborted", False))
    if out["outcome"] == "completed":
        after = {"is_completed": bool(works[0].is_completed())}
        try:
            works[0].wait()
            after["wait_again"] = "ok"
        except Exception as exc:  # noqa: BLE001 - informational: the work had failed although the wait returned
            after["wait_again"] = f"{type(exc).__name__}: {exc}"[:300]
            out["outcome"] = "completed_with_error"
        out["work_after"] = after
    say(f"{name}: {out['outcome']} after {out['released_s']} s")
    return out


def child(backend: str, timeout_s: float, window_s: float, save) -> dict:
    """The probe; ``save(res)`` after every phase (a hang later still leaves what came before).

    A1: the groups' own timeout long (``LONG_S``), reshardctl's deadline ``timeout_s``: only reshardctl's
    watch can end the pending receive (its abort). A2: both ``timeout_s``, as a refit builds them: torch's
    watchdog times the work out at ``timeout_s`` and reshardctl's watch would abort at ``timeout_s + 1``;
    whoever ends it, within a bound. Then the heartbeat window, the dump key, a rebuild. B only where the
    self-receive never stayed pending (refused or completed): an all-reduce behind a device sleep."""
    import torch
    import torch.distributed as dist

    from reshardctl.launch.ports import free_port
    from reshardctl.runtime import bounded_wait
    from reshardctl.runtime.env import make_rank_env
    from reshardctl.runtime.groups import init_groups, rebuild, rendezvous, shutdown

    aborts: list = []
    real_abort = bounded_wait.abort_data_plane

    def timed_abort(groups):  # the watch's abort, timed (the call itself must not block)
        t0 = time.monotonic()
        real_abort(groups)
        aborts.append({"abort_call_s": round(time.monotonic() - t0, 3)})
    bounded_wait.abort_data_plane = timed_abort

    res: dict = {"backend": backend, "timeout_s": timeout_s, "long_s": LONG_S, "window_s": window_s, "phases": [],
                 "health": [], "alive_after_window": window_s == 0}
    env = make_rank_env(0, 1, 0, "127.0.0.1", free_port(), backend=backend)
    store = rendezvous(env, 30.0, secrets.token_hex(16))
    t0 = time.monotonic()
    groups = init_groups(env, [], store, LONG_S)
    res["group_init_s"] = round(time.monotonic() - t0, 3)
    res["torch_env"] = {k: os.environ.get(k) for k in MONITOR_VARS}  # after init_groups
    res["torch_env_note"] = ("TORCH_NCCL_ASYNC_ERROR_HANDLING is 2 while reshardctl's NCCL groups are built "
                             "(groups.nccl_error_handling) and restored after; the others as set for torch")
    res["device"] = str(groups.device)
    say(f"groups up on {groups.device} ({backend}) in {res['group_init_s']} s")
    buf = torch.zeros(1 << 20, dtype=torch.uint8, device=groups.device)

    def phase(name, post, groups):
        got = _wait_phase(name, post, groups, timeout_s, aborts)
        res["phases"].append(got)
        save(res)
        return got

    def rebuilt(groups, pg_timeout_s: float):
        res["dump_key_set"] = _dump_key(store)  # before the rebuild deletes it
        t1 = time.monotonic()
        groups = rebuild(groups, [], store, pg_timeout_s)
        res.setdefault("rebuild_s", []).append(round(time.monotonic() - t1, 3))
        res["health"].append(_health(groups, timeout_s))
        say(f"rebuilt in {res['rebuild_s'][-1]} s, health {res['health'][-1]}")
        save(res)
        return groups

    def window():
        if window_s > 0:
            say(f"alive through {window_s:g} s (2 x heartbeat + 1) after the last failed work")
            time.sleep(window_s)
        res["alive_after_window"] = True
        save(res)

    recv = lambda: [dist.irecv(buf, src=0, group=groups.data)]  # noqa: E731 - groups rebinds below
    a1 = phase("A1 unmatched self-receive, reshardctl's deadline only", recv, groups)
    groups = rebuilt(groups, timeout_s)
    pending = {"timeout", "error", "completed_with_error"}
    a2 = phase("A2 unmatched self-receive, torch's timeout = the deadline", recv, groups)
    if a2["outcome"] in pending:
        window()
    groups = rebuilt(groups, LONG_S)
    if a1["outcome"] not in pending and groups.device.type == "cuda":
        sleep_s = timeout_s + 3.0
        ev = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        ev[0].record()
        torch.cuda._sleep(100_000_000)
        ev[1].record()
        ev[1].synchronize()
        per_s = 1e8 / max(ev[0].elapsed_time(ev[1]) / 1e3, 1e-6)  # sleep cycles per second on this GPU
        x = torch.ones(8, device=groups.device)

        def post():
            torch.cuda._sleep(int(per_s * sleep_s))  # the current stream busy past the deadline
            return [dist.all_reduce(x, group=groups.data, async_op=True)]
        b = phase("B all-reduce behind a device sleep", post, groups)
        b["device_sleep_s"] = sleep_s
        if b["outcome"] in pending:
            window()
        groups = rebuilt(groups, LONG_S)
    shutdown()
    return res


def judge(res: dict, rc: int, cuda: bool) -> tuple[list[str], str]:
    """Problems with a child's result, and a one-line headline."""
    bad = []
    if rc != 0:
        bad.append(f"the probe exited with {rc}" + (f" (signal {-rc}: torch's monitor?)" if rc < 0 else ""))
    if res.get("error"):
        bad.append(f"the probe raised: {res['error'][:300]}")
    phases = {p["phase"].split()[0]: p for p in res.get("phases", [])}
    t = res.get("timeout_s", 0.0)
    if cuda:
        own = phases.get("B") if phases.get("A1", {}).get("outcome") in ("refused", "completed") else phases.get("A1")
        if own is None or own.get("outcome") != "timeout":
            bad.append(f"reshardctl's deadline did not end a pending NCCL work: {own}")
        else:
            bound = t + 1.0 + 5.0 + own.get("device_sleep_s", 0.0)
            if not own.get("aborts") or not own.get("groups_aborted"):
                bad.append(f"{own['phase']}: timed out without reshardctl's abort")
            elif any(x["abort_call_s"] > 5.0 for x in own["aborts"]):
                bad.append(f"{own['phase']}: the abort call took {own['aborts']}")
            if own.get("released_s", 1e9) > bound:
                bad.append(f"{own['phase']}: host released after {own['released_s']} s (bound {bound:g} s)")
        a2 = phases.get("A2", {})
        bound2 = t + 1.0 + 4.0 + 5.0  # + torch's 4 s sleep before its own abort
        if a2.get("outcome") not in ("refused", "completed") and a2.get("released_s", 1e9) > bound2:
            bad.append(f"A2: host released after {a2.get('released_s')} s (bound {bound2:g} s)")
    if not res.get("alive_after_window"):
        bad.append("no heartbeat window was lived through after the last failed work")
    if not res.get("health") or not all(h.get("ok") for h in res["health"]):
        bad.append(f"rebuilt groups unhealthy: {res.get('health')}")
    head = "; ".join(f"{k}: {p.get('outcome')}" + (f" after {p['released_s']} s" if "released_s" in p else "")
                     for k, p in phases.items())
    head += (f"; alive {res.get('window_s', 0):g} s after, exception_dump key {res.get('dump_key_set')}, rebuilt "
             f"groups {'ok' if res.get('health') and all(h.get('ok') for h in res['health']) else 'FAILED'}")
    return bad, head


def step_nccl_abort(ctx) -> dict:
    from one_device import Fail, Skip, injected

    cuda = not ctx["cpu"]
    timeout_s = 2.0 if cuda else 1.0
    window = 2 * HEARTBEAT_S + 1 if cuda else 0
    out_file = ctx["out"] / "nccl_abort_child.json"
    env = dict(os.environ, TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC=str(HEARTBEAT_S))
    env.pop("TORCH_NCCL_DUMP_ON_TIMEOUT", None)  # reshardctl's own rank settings decide (nccl_watchdog.py)
    argv = [sys.executable, str(Path(__file__).resolve()), "--child", "--backend", "nccl" if cuda else "gloo",
            "--timeout", str(timeout_s), "--window", str(window), "--out", str(out_file)]
    limit = 45.0  # A1, A2 (or B) at ~3-6 s each, one heartbeat window (13 s), rebuilds: ~30 s; the step's 55 s
    t0 = time.monotonic()
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=limit)
        rc, log = proc.returncode, (proc.stdout + proc.stderr)[-4000:]
    except subprocess.TimeoutExpired as exc:
        rc, log = None, ((exc.stdout or b"").decode(errors="replace") + (exc.stderr or b"").decode(errors="replace"))[-4000:]
    secs = round(time.monotonic() - t0, 3)
    try:
        res = json.loads(out_file.read_text())
    except (OSError, json.JSONDecodeError):
        res = {}
    detail = {"child": res, "exit": rc, "seconds": secs, "log_tail": log, "heartbeat_s": HEARTBEAT_S}
    if rc is None:
        raise Fail(f"the probe did not end within {limit:g} s (the host was not released?); last lines: "
                   f"{log.strip().splitlines()[-1:]}", detail)
    bad, head = judge(res, rc, cuda)
    if injected("nccl_abort"):
        bad.append("injected (ONE_DEVICE_INJECT=nccl_abort)")
    detail["headline"] = head
    if not cuda:
        detail["rehearsal_ok"] = not bad
        raise Skip("no CUDA device: NCCL needs one", {"rehearsal": detail | {"ok": not bad, "problems": bad}})
    if bad:
        raise Fail("; ".join(bad[:4]), detail)
    return detail


def main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--backend", default="nccl")
    ap.add_argument("--timeout", type=float, default=2.0)
    ap.add_argument("--window", type=float, default=7.0)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    out = Path(a.out)

    def save(res: dict) -> None:
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(res, indent=1, default=str))
        tmp.replace(out)
    code = 0
    try:
        save(child(a.backend, a.timeout, a.window, save) | {"finished": True})
    except BaseException as exc:  # noqa: BLE001 - reported in the JSON, exit 1
        import traceback

        prev = json.loads(out.read_text()) if out.exists() else {}
        save(prev | {"finished": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]})
        code = 1
    sys.stdout.flush()
    os._exit(code)  # no teardown: an aborted communicator's destructor must not hold the exit


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

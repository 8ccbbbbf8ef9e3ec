"""Step nccl_abort of benchmarks/gpu_one_device.sh: the bounded failure path of one NCCL rank.

One GPU cannot hold a two-rank NCCL communicator, so the probe is one process, world size 1, built by the
runtime's own code (``groups.rendezvous`` and ``groups.init_groups``: reshardctl's monitor settings,
``TORCH_NCCL_ASYNC_ERROR_HANDLING=2``, the device-bound default group) with a short
``TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC`` set by the parent:

* A, a receive whose sender never comes: ``irecv`` from its own rank (torch allows it), no send; waited by
  ``bounded_wait.wait_works`` (host blocked in ``Event.synchronize()``, the deadline in a
  ``DeadlineWatch`` thread). Where NCCL leaves it pending, the watch must abort the communicator
  (``abort.abort_data_plane``) past the timeout and the host must be released: the claim docs/gpu.md
  could only reason about. NCCL may instead refuse or complete it: then A proves nothing and says so.
* B, only when A did not time out: an all-reduce posted behind a device sleep longer than the timeout:
  the watch aborts at the deadline and the wait ends (when the sleep ends), with the timeout's error.
* After an abort: ``2 x heartbeat + 1`` seconds alive (torch's monitor would have killed the process by
  then), whether torch wrote ``exception_dump`` to the store, then ``groups.rebuild`` (the key deleted,
  fresh groups) and an all-reduce on the rebuilt data group.

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
    """Post (``post()`` -> works) and wait bounded; what happened, and how long until the host was back."""
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
    say(f"{name}: posted; waiting (timeout {timeout_s:g} s)")
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
    say(f"{name}: {out['outcome']} after {out['released_s']} s")
    return out


def child(backend: str, timeout_s: float, window_s: float, save) -> dict:
    """The probe; ``save(res)`` after every phase (a hang later still leaves what came before)."""
    import torch
    import torch.distributed as dist

    from reshardctl.launch.local import free_port
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

    res: dict = {"backend": backend, "timeout_s": timeout_s, "window_s": window_s, "phases": [], "health": []}
    env = make_rank_env(0, 1, 0, "127.0.0.1", free_port(), backend=backend)
    store = rendezvous(env, 30.0, secrets.token_hex(16))
    t0 = time.monotonic()
    groups = init_groups(env, [], store, timeout_s)
    res["group_init_s"] = round(time.monotonic() - t0, 3)
    res["torch_env"] = {k: os.environ.get(k) for k in MONITOR_VARS}  # after init_groups
    res["torch_env_note"] = ("TORCH_NCCL_ASYNC_ERROR_HANDLING is 2 while reshardctl's NCCL groups are built "
                             "(groups.nccl_error_handling) and restored after; the others as set for torch")
    res["device"] = str(groups.device)
    say(f"groups up on {groups.device} ({backend}) in {res['group_init_s']} s")

    buf = torch.zeros(1 << 20, dtype=torch.uint8, device=groups.device)
    a = _wait_phase("A unmatched self-receive", lambda: [dist.irecv(buf, src=0, group=groups.data)], groups,
                    timeout_s, aborts)
    res["phases"].append(a)
    save(res)

    def after(groups, phase: dict):
        """After a phase: the heartbeat window where it timed out (an abort), the dump key, a rebuild."""
        if window_s > 0 and phase.get("outcome") == "timeout":
            say(f"alive through {window_s:g} s (2 x heartbeat + 1)")
            time.sleep(window_s)
            res["alive_after_window"] = True
        res.setdefault("alive_after_window", window_s == 0)
        res["dump_key_set"] = _dump_key(store)
        t1 = time.monotonic()
        groups = rebuild(groups, [], store, timeout_s)
        res["rebuild_s"] = round(time.monotonic() - t1, 3)
        res["health"].append(_health(groups, timeout_s))
        say(f"rebuilt in {res['rebuild_s']} s, health {res['health'][-1]}")
        save(res)
        return groups

    groups = after(groups, a)
    if a.get("outcome") != "timeout" and groups.device.type == "cuda":
        sleep_s = timeout_s + 3.0
        probe = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        probe[0].record()
        torch.cuda._sleep(100_000_000)
        probe[1].record()
        probe[1].synchronize()
        per_s = 1e8 / max(probe[0].elapsed_time(probe[1]) / 1e3, 1e-6)  # sleep cycles per second on this GPU
        x = torch.ones(8, device=groups.device)

        def post():
            torch.cuda._sleep(int(per_s * sleep_s))  # the current stream busy past the deadline
            return [dist.all_reduce(x, group=groups.data, async_op=True)]
        b = _wait_phase("B all-reduce behind a device sleep", post, groups, timeout_s, aborts)
        b["device_sleep_s"] = sleep_s
        res["phases"].append(b)
        save(res)
        groups = after(groups, b)
    shutdown()
    return res


def judge(res: dict, rc: int, cuda: bool) -> tuple[list[str], str]:
    """Problems with a child's result, and a one-line headline."""
    bad = []
    if rc != 0:
        bad.append(f"the probe exited with {rc}" + (f" (signal {-rc}: torch's monitor?)" if rc < 0 else ""))
    phases = res.get("phases", [])
    timed_out = [p for p in phases if p.get("outcome") == "timeout"]
    limit = res.get("timeout_s", 0) + 1.0 + 5.0
    if cuda:
        if not timed_out:
            bad.append("no phase timed out: the abort path was not reached")
        for p in timed_out:
            bound = limit + p.get("device_sleep_s", 0.0)
            if not p.get("aborts") or not p.get("groups_aborted"):
                bad.append(f"{p['phase']}: timed out without an abort")
            elif any(x["abort_call_s"] > 5.0 for x in p["aborts"]):
                bad.append(f"{p['phase']}: the abort call took {p['aborts']}")
            if p.get("released_s", 1e9) > bound:
                bad.append(f"{p['phase']}: host released after {p['released_s']} s (bound {bound:g} s)")
    if res.get("error"):
        bad.append(f"the probe raised: {res['error'][:300]}")
    if not res.get("alive_after_window"):
        bad.append("no heartbeat window was lived through after an abort")
    if not res.get("health") or not all(h.get("ok") for h in res["health"]):
        bad.append(f"rebuilt groups unhealthy: {res.get('health')}")
    a = phases[0] if phases else {}
    head = (f"A (unmatched self-receive): {a.get('outcome', '?')}"
            + (f" after {a.get('released_s')} s" if a.get("released_s") is not None else "")
            + "".join(f"; B: {p.get('outcome')} after {p.get('released_s')} s" for p in phases[1:])
            + f"; alive {res.get('window_s', 0):g} s after, dump key {res.get('dump_key_set')}, rebuilt group "
              f"{'ok' if res.get('health') and all(h.get('ok') for h in res['health']) else 'FAILED'}")
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
    limit = 45.0  # A and B at ~5 s each, one heartbeat window, two rebuilds: about 30 s; the step's limit 55 s
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

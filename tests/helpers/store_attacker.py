"""An outsider of a run: knows the run directory's events (so the store's address and port) but not the
run token. Run as ``python store_attacker.py RUN_DIR RESULT.json NON_LOOPBACK_ADDR WORLD``; it waits
until rank 1's drill fired (the run is mid-refit), then tries everything below against the run's
store and writes what each attempt gave to RESULT.json. As ``python store_attacker.py join|overwrite
PORT WORLD GO STOP RESULT.json`` it attacks the group creation instead (``during_setup``). It imports torch only, nothing of reshardctl:
it attacks both today's and the former key scheme (``reshardctl/run-digest`` and ``run-<digest[:16]>/``).
"""

from __future__ import annotations

import json
import socket
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

OLD_DIGEST_KEY = "reshardctl/run-digest"
FORGED = "rank 9 (outsider) failed in transfer: FORGED BY AN OUTSIDER"


def other_address() -> str | None:
    """A non-loopback IPv4 address of this machine (the route a datagram would take), or None."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # no packet is sent
            addr = s.getsockname()[0]
    except OSError:
        return None
    return None if addr.startswith("127.") else addr


def events(run_dir: Path, rank: int) -> list[dict]:
    path = run_dir / "events" / f"rank-{rank}.jsonl"
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip().endswith("}")]


def namespace(key: str) -> str:
    """The run's namespace a listed key lies in: ``run-<prefix>/`` (torch's PrefixStore then adds a ``/``)."""
    return key.split("/")[0] + "/"


def attempt(fn):
    try:
        return {"ok": True, "value": fn()}
    except Exception as exc:  # noqa: BLE001 - every outcome is a result
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}


def main() -> None:
    run_dir, out, other_addr, world = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    while not any(e.get("phase") == "drill" for e in events(run_dir, 1)):
        time.sleep(0.05)
    addr, port = next(e for e in events(run_dir, 0) if e["phase"] == "rendezvous")["peers"]
    res: dict = {"port": port}

    def connect(host):
        with socket.create_connection((host, port), timeout=3):
            return "connected"

    res["loopback_connect"] = attempt(lambda: connect(addr))
    res["other_interface_connect"] = attempt(lambda: connect(other_addr))
    client = dist.TCPStore(addr, port, is_master=False, timeout=timedelta(seconds=3), wait_for_workers=False)
    res["old_digest"] = attempt(lambda: client.get(OLD_DIGEST_KEY).decode())
    listed = attempt(lambda: client.list_keys())
    res["keys"] = listed
    values = {}
    for k in (listed["value"] if listed["ok"] else []):
        got = attempt(lambda k=k: client.get(k).decode("latin-1"))
        values[k] = got["value"] if got["ok"] else None
    res["values"] = values
    # forged failure records: the raw key, the former scheme's prefix (from the digest if it was there),
    # and under every namespace seen in the listed keys
    digest = res["old_digest"]["value"] if res["old_digest"]["ok"] else ""
    targets = [("raw", client)]
    old_run = dist.PrefixStore(f"run-{digest[:16]}/", client)
    for a in range(3):
        targets.append((f"old-scheme attempt {a}", dist.PrefixStore(f"attempt-{a}/ctl/", old_run)))
    seen = {namespace(k) + "/" for k in values if k.startswith("run-")}  # "run-<prefix>//"
    for head in sorted(seen):
        for a in range(3):
            targets.append((f"seen {head}attempt-{a}", (head, a)))
    written = []
    for name, target in targets:
        if isinstance(target, tuple):  # a key spelled as the listed keys are
            head, a = target
            key = f"{head}attempt-{a}/ctl//failed"
            r = attempt(lambda key=key: client.set(key, FORGED))
        else:
            r = attempt(lambda target=target: target.set("failed", FORGED))
        written.append({"target": name, **r})
    res["forged"] = written
    res["forged_at"] = time.time()
    out.write_text(json.dumps(res))  # before the join attempt below, which may take its timeout
    # join the run's groups as its last rank on the former scheme's prefix
    store = dist.PrefixStore("attempt-0/", old_run)
    res["init_old_prefix"] = attempt(lambda: (dist.init_process_group(
        "gloo", store=store, rank=world - 1, world_size=world, timeout=timedelta(seconds=3)), "joined")[1])
    out.write_text(json.dumps(res))
    sys.stdout.flush()


# ---- during group creation ---------------------------------------------------------------------------
def run_keys(client, world: int, limit_s: float = 60.0) -> list[str]:
    """The keys of the run's namespace once the ranks that are there have written their set-up records
    (``world - 1``: one rank is held back until the outsider is done)."""
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        keys = [k for k in client.list_keys() if k.startswith("run-")]
        if len(keys) >= world - 1:
            time.sleep(0.5)  # the ranks there now wait for the missing rank's record
            return [k for k in client.list_keys() if k.startswith("run-")]
        time.sleep(0.05)
    raise TimeoutError("the run's set-up records never appeared")


def current_prefix(keys: list[str]) -> str:
    """Where the ranks create their groups: the namespace and the attempt a listed key names (reshardctl
    before sealing: ``run-<prefix>//attempt-<k>//...``), else attempt 0 of the namespace."""
    for k in keys:
        _, sep, rest = k.partition("/attempt-")
        if sep:
            return f"attempt-{rest.split('/')[0]}/"
    return "attempt-0/"


def patched(value: bytes, port: int) -> bytes:
    """``value`` with every IPv4 loopback socket address in it (gloo's address record: a ``sockaddr_in``,
    family 2, big-endian port, 127.0.0.1) pointed at ``port``."""
    out = bytearray(value)
    i = out.find(b"\x02\x00", 0)
    while i >= 0:
        if out[i + 4:i + 8] == b"\x7f\x00\x00\x01":
            out[i + 2:i + 4] = port.to_bytes(2, "big")
        i = out.find(b"\x02\x00", i + 1)
    return bytes(out)


def during_setup(mode: str, port: int, world: int, go: Path, stop: Path, out: Path) -> None:
    """``join``: ``init_process_group`` on the run's namespace and current attempt (from the listing) as the
    rank that is not there yet. ``overwrite``: every record in the run's namespace rewritten to point at
    this process's own listening socket (a stand-in for those ranks' connections). Then the held-back
    rank is let go (``go``); connections to the outsider are counted until ``stop`` appears."""
    client = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=5), wait_for_workers=False)
    keys = run_keys(client, world)
    res: dict = {"keys": keys, "connections": 0}
    lsock = socket.create_server(("127.0.0.1", 0))
    lsock.settimeout(0.2)
    if mode == "join":
        prefix = current_prefix(keys)
        res["prefix"] = prefix
        store = dist.PrefixStore(prefix, dist.PrefixStore(namespace(keys[0]), client))
        res["join"] = attempt(lambda: (dist.init_process_group(
            "gloo", store=store, rank=world - 1, world_size=world, timeout=timedelta(seconds=3)), "joined")[1])
    else:
        mine = lsock.getsockname()[1]
        res["overwritten"] = []
        for k in keys:
            v = client.get(k)
            if patched(v, mine) != v:
                client.set(k, patched(v, mine))
                res["overwritten"].append(k)
    go.touch()
    end = time.monotonic() + 120
    while not stop.exists() and time.monotonic() < end:
        try:
            conn, _ = lsock.accept()
            res["connections"] += 1
            conn.close()
        except OSError:
            pass
    out.write_text(json.dumps(res))


if __name__ == "__main__":
    if sys.argv[1] in ("join", "overwrite"):
        mode, port, world, go, stop, out = sys.argv[1:7]
        during_setup(mode, int(port), int(world), Path(go), Path(stop), Path(out))
    else:
        main()
    import os

    os._exit(0)  # no teardown of a half-joined group

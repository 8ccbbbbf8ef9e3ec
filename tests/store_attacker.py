"""An outsider of a run: knows the run directory's events (so the store's address and port) but not the
run token. Run as ``python store_attacker.py RUN_DIR RESULT.json NON_LOOPBACK_ADDR WORLD``; it waits
until rank 1's drill fired (the run is mid-refit), then tries everything below against the run's
store and writes what each attempt gave to RESULT.json. It imports torch only, nothing of reshardctl:
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
    seen = set()
    for k in values:
        head, sep, _ = k.partition("attempt-")
        if sep:
            seen.add(head)
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


if __name__ == "__main__":
    main()
    import os

    os._exit(0)  # no teardown of a half-joined group

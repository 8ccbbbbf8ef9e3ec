"""The rendezvous port of a local session (and of the tests' and benchmarks' spawned worlds).

A port is chosen now and bound later, by rank 0, seconds after, in another process. ``bind(0)`` gives a
port of the kernel's ephemeral range (``net.ipv4.ip_local_port_range``), the range every outgoing
connection on the machine takes its local port from; a gloo world of 8 ranks opens dozens of such
connections, so on a busy machine one of them could take the port in that window and rank 0's store
would fail to bind or, worse, a client would connect to a stranger. ``free_port`` draws from the ports
below that range instead: the kernel never gives those away by itself, and the draw is checked by a bind.
Two drawers racing for one of ~20 000 ports is the residual risk.
"""

from __future__ import annotations

import random
import socket

LOWEST = 10_000  # below this, the well-known and registered services many sites run
EPHEMERAL_DEFAULT = (32768, 60999)  # Linux's default ip_local_port_range
RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
DRAWS = 64


def ephemeral_range(path: str = RANGE_FILE) -> tuple[int, int]:
    """The kernel's ephemeral port range (Linux's default where the file cannot be read)."""
    try:
        with open(path) as f:
            lo, hi = (int(x) for x in f.read().split()[:2])
    except (OSError, ValueError):
        return EPHEMERAL_DEFAULT
    return (lo, hi) if 0 < lo <= hi <= 65535 else EPHEMERAL_DEFAULT


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1", *, range_file: str = RANGE_FILE, lowest: int = LOWEST) -> int:
    """A TCP port, free a moment ago, that no outgoing connection of this machine will take meanwhile: a
    random one in [``lowest``, the ephemeral range's start) or above its end that binds now. Where the
    ephemeral range leaves fewer than 1 000 such ports on either side, or ``DRAWS`` draws find none free,
    the OS picks one (``bind(0)``)."""
    lo, hi = ephemeral_range(range_file)
    below = (lowest, lo - 1) if lo - lowest >= 1000 else None
    above = (hi + 1, 65535) if 65535 - hi >= 1000 else None
    spans = [s for s in (below, above) if s]
    rng = random.SystemRandom()
    for _ in range(DRAWS if spans else 0):
        a, b = rng.choice(spans)
        port = rng.randint(a, b)
        if _bindable(host, port):
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, 0))
        return s.getsockname()[1]

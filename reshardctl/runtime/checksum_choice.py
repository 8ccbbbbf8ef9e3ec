"""Which checksum path a CPU process takes: the fastest exact one, measured on this machine.

The paths (checksum_rows.py: ``c-avx2``, ``c-base``, ``int8``, ``float64``) give the same residues
by construction, but their speed depends on the CPU in ways its flags do not tell: the int8 path ran
at 2.3 GB/s on a CPU with AVX-512 VNNI and at 58 MB/s on one with AVX2 only (issue 35). So at first use
each path that can run here is

1. **probed**: its row sums of extreme and random bytes (whole, partial and odd-length rows, at the
   shortest row length and the compiled paths' one) must equal the definition's, computed in int64
   without any path's kernel (``exact_row_sums``); a path that differs or raises is refused, however fast;
2. **timed**: best of ``REPEATS`` on ``TIME_BYTES`` of random bytes cut as a refit cuts them (one long
   message and many short ones), after one untimed call that builds its tables, in rounds across the
   paths (a load that comes and goes hits them alike); a path ``GIVE_UP``x slower than the best after
   the first round is not timed again.

The fastest exact path wins. The choice is kept per process and in a cache file,
``$XDG_CACHE_HOME/reshardctl/checksum-paths.json`` (``~/.cache/...``), keyed by what decides the speed:
the CPU's model and flags, the torch build and its CPU capability (and the ISA caps ``ATEN_CPU_CAPABILITY``
/ ``ONEDNN_MAX_CPU_ISA``), the compiled kernel's file, and torch's thread count (the paths are timed with
the threads the process has: a rank's, ``torch.set_num_threads`` before its first checksum; the torch
paths use them all, the compiled one runs on one). Ranks that start together on one node take a
lock, so one measures and the others read its result. ``RESHARDCTL_CHECKSUM_PATH=<path>`` forces a path
(it is still probed, a path that fails the probe is an error, never used, and timed alone); ``auto`` or unset measures.
CUDA buffers always take the float64 path.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch

from reshardctl.atomic_write import write_json_atomic
from reshardctl.runtime import checksum_rows as rows

ENV = "RESHARDCTL_CHECKSUM_PATH"
TIME_BYTES = 16 << 20
REPEATS = 3
GIVE_UP = 4.0  # a path this much slower than the best on its first call is not timed further
LOCK_WAIT_S = 60.0  # another process measuring this long is taken as gone: measure without the lock
CACHE_NAME = "checksum-paths.json"

RowSums = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor]  # (buf, start, valid, R)


@dataclass(frozen=True)
class Choice:
    """The path a CPU process takes and how it was decided."""

    path: str
    how: str  # "measured", "cached (<file>)", "forced by RESHARDCTL_CHECKSUM_PATH"
    rates: dict[str, float] = field(default_factory=dict)  # bytes/s of each exact path timed here (a forced one: its own)
    refused: dict[str, str] = field(default_factory=dict)  # path -> why it was not used (failed probe)
    copy_rate: float | None = None  # bytes/s of a copy_ of the timing buffer, for scale
    cpu: str = ""

    @property
    def rate(self) -> float | None:
        """bytes/s of the chosen path (None where it was forced and not timed)."""
        return self.rates.get(self.path)

    def line(self) -> str:
        """One line for selftest, calibrate and run: the path, its rate beside the copy rate."""
        others = ", ".join(f"{p} {r / 1e9:.2f} GB/s" for p, r in sorted(self.rates.items(), key=lambda x: -x[1])
                           if p != self.path)
        rate = f" at {self.rate / 1e9:.2f} GB/s" if self.rate else ""
        copy = f" (copy_ {self.copy_rate / 1e9:.2f} GB/s)" if self.copy_rate else ""
        bad = "; refused: " + ", ".join(f"{p} ({why})" for p, why in self.refused.items()) if self.refused else ""
        return f"checksum path {self.path}{rate}{copy}, {self.how}" + (f"; others: {others}" if others else "") + bad


# ---- probing and timing (pure in their inputs: the candidates are callables) ---------------------------

def _probe_case() -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor, int]]]:
    """Extreme and random bytes, and row windows over them: whole rows, partial and odd-length ones,
    one of a single byte, at the shortest row length and at the compiled paths' row length."""
    g = torch.Generator().manual_seed(0)
    n = 4 * rows.C_ROW + 2 * rows.GRAIN + 7
    buf = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g)
    buf[: 4 * rows.GRAIN] = 255
    buf[4 * rows.GRAIN : 6 * rows.GRAIN] = 0
    buf[6 * rows.GRAIN : 8 * rows.GRAIN] = 128
    buf[8 * rows.GRAIN : 10 * rows.GRAIN] = 127
    cases = []
    for R in (rows.GRAIN, rows.C_ROW):
        W = 2 * R
        start = [0, 2 * rows.GRAIN, 4 * rows.GRAIN, 6 * rows.GRAIN, 8 * rows.GRAIN, n - 1, n - W // 2 - 1, 0]
        valid = [W, W, W // 2 + 1, W - 1, W, 1, W // 2 + 1, 0]
        keep = [(s, v) for s, v in zip(start, valid) if s >= 0 and s + v <= n]
        cases.append((torch.tensor([s for s, _ in keep]), torch.tensor([v for _, v in keep]), R))
    return buf, cases


def _timing_case() -> tuple[torch.Tensor, list[int], list[int]]:
    """``TIME_BYTES`` of random bytes as a refit's buffers hold them: three quarters in one message, the
    rest in 8-byte aligned messages of 4-40 KB (layer norms, biases, small experts)."""
    g = torch.Generator().manual_seed(1)
    buf = torch.randint(0, 256, (TIME_BYTES,), dtype=torch.uint8, generator=g)
    offs, sizes = [0], [3 * TIME_BYTES // 4]
    o = sizes[0]
    small = torch.randint(4_000, 40_000, (4096,), generator=g).tolist()
    for s in small:
        if o + s > TIME_BYTES:
            break
        offs.append(o)
        sizes.append(s)
        o = (o + s + 7) & ~7
    return buf, offs, sizes


def probe_failure(fn: RowSums, reference: RowSums) -> str | None:
    """Why ``fn`` is not exact on the probe (its row sums differ from ``reference``'s, or it raised), or None."""
    buf, cases = _probe_case()
    for start, valid, R in cases:
        try:
            got = fn(buf, start, valid, R)
        except (RuntimeError, TypeError, ValueError) as exc:  # an older torch, a kernel that cannot run here
            return f"raised {type(exc).__name__}: {exc}"[:200]
        if not torch.equal(got, reference(buf, start, valid, R)):
            return f"row sums differ from the definition's at rows of {R} limbs"
    return None


def measure(candidates: dict[str, RowSums], row_length: Callable[[list[int], str], int],
            reference: RowSums, repeats: int = REPEATS) -> tuple[str, dict[str, float], dict[str, str], float]:
    """(fastest exact path, bytes/s per timed path, refused path -> why, copy bytes/s): every candidate
    probed against ``reference``, the exact ones timed on the same buffer, in the order given."""
    refused = {}
    for name, fn in candidates.items():
        why = probe_failure(fn, reference)
        if why is not None:
            refused[name] = why
    buf, offs, sizes = _timing_case()
    total = sum(sizes)
    runs = {}
    for name, fn in candidates.items():
        if name not in refused:
            R = row_length(sizes, name)
            start, valid, _, _ = rows.windows(offs, sizes, R)
            fn(buf, start[:64], valid[:64], R)  # tables built, untimed
            runs[name] = (lambda fn=fn, start=start, valid=valid, R=R: fn(buf, start, valid, R))
    # rounds across the paths (a load that comes and goes hits them alike), the best time of each kept;
    # after the first round a path GIVE_UP times slower than the best is not timed again
    best_t = {name: _timed(run) for name, run in runs.items()}
    for _ in range(repeats - 1):
        lead = min(best_t.values(), default=0.0)
        for name, run in runs.items():
            if best_t[name] < GIVE_UP * lead:
                best_t[name] = min(best_t[name], _timed(run))
    rates = {name: total / t for name, t in best_t.items()}
    if not rates:
        raise RuntimeError("no checksum path passed its probe on this machine: " +
                           "; ".join(f"{k}: {v}" for k, v in refused.items()))
    dst = torch.empty_like(buf)
    dst.copy_(buf)
    copy_t = min(_timed(lambda: dst.copy_(buf)) for _ in range(repeats))
    return max(rates, key=rates.get), rates, refused, TIME_BYTES / copy_t


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return max(time.perf_counter() - t0, 1e-9)


# ---- this process's choice: forced, memo, cache file, measurement -------------------------------------

_memo: dict[int, Choice] = {}  # torch's thread count -> the choice made with it


def cpu_path() -> str:
    """The path this process uses on the CPU now (``choice().path``; a dict lookup once decided)."""
    got = _memo.get(torch.get_num_threads())
    return (got or choice()).path


def choice(threads: int | None = None) -> Choice:
    """The choice for this process's torch thread count (or ``threads``, set for the measurement and
    restored), decided once per count: forced by ``RESHARDCTL_CHECKSUM_PATH``, else the cache file's
    entry for this machine, else measured now (under a lock shared with the node's other ranks)."""
    before = torch.get_num_threads()
    n = threads or before
    if n not in _memo:
        if n != before:
            torch.set_num_threads(n)
        try:
            _memo[n] = _decide()
        finally:
            if n != before:
                torch.set_num_threads(before)
    return _memo[n]


def forget() -> None:
    """Drop this process's choices (tests; a changed environment)."""
    _memo.clear()


def _candidates() -> dict[str, RowSums]:
    return {p: (lambda b, s, v, R, p=p: rows.row_sums(b, s, v, R, p)) for p in rows.paths(torch.device("cpu"))}


def exact_row_sums(buf: torch.Tensor, start: torch.Tensor, valid: torch.Tensor, R: int) -> torch.Tensor:
    """The row sums by their definition, in int64 (no path's kernel): each limb times its eight weights,
    products below ``2**47`` and row sums below ``2**62``; slow, for the probe's few rows."""
    out = torch.zeros(start.numel(), rows.SUMS, dtype=torch.int64)
    w = rows._table()[:R]
    for i, (s0, n) in enumerate(zip(start.tolist(), valid.tolist())):
        b = torch.zeros(2 * R, dtype=torch.uint8)
        b[:n] = buf[s0 : s0 + n]
        x = b.view(torch.int8).to(torch.int64).view(R, 2)
        out[i] = ((x[:, 0] + 256 * x[:, 1])[:, None] * w).sum(0) % rows.P
    return out


_reference = exact_row_sums


def env_problem() -> str | None:
    """What is wrong with ``RESHARDCTL_CHECKSUM_PATH`` here (not a path this machine can run), or None."""
    forced = os.environ.get(ENV, "").strip()
    avail = rows.paths(torch.device("cpu"))
    if forced and forced != "auto" and forced not in avail:
        known = "" if forced in rows.ALL_PATHS else f" (the paths are {', '.join(rows.ALL_PATHS)})"
        return f"{ENV}={forced}: not a checksum path of this machine; one of auto, {', '.join(avail)}{known}"
    return None


def _decide() -> Choice:
    forced = os.environ.get(ENV, "").strip()
    if forced and forced != "auto":
        why = env_problem()
        if why:
            raise ValueError(why)
        fn = _candidates()[forced]
        why = probe_failure(fn, _reference)
        if why is not None:
            raise ValueError(f"{ENV}={forced}: the path fails its exactness probe here ({why})")
        _, rates, _, copy = measure({forced: fn}, rows.row_length, _reference)  # its rate, for predictions
        return Choice(forced, f"forced by {ENV}", rates, {}, copy, cpu_name())
    path = cache_file()
    key = machine_key()
    got = _cached(path, key)
    if got is not None:
        return got
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = open(path.with_suffix(".lock"), "a")
    except OSError:  # no writable cache directory: measure for this process only
        return _measured()
    with lock:
        _lock(lock)
        got = _cached(path, key)  # another rank measured while this one waited
        if got is not None:
            return got
        c = _measured()
        entries = _read(path)
        entries[key] = {**asdict(c), "how": "measured", "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        try:
            write_json_atomic(path, entries, indent=1)
        except OSError:
            pass  # the choice stands for this process; the next one measures again
        return c


def _measured() -> Choice:
    path, rates, refused, copy = measure(_candidates(), rows.row_length, _reference)
    return Choice(path, "measured", rates, refused, copy, cpu_name())


def _lock(f) -> None:
    """The cache's lock, waited for at most ``LOCK_WAIT_S`` (a holder that died releases it; one that
    hangs is outwaited and this process measures on its own)."""
    end = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except OSError:
            if time.monotonic() > end:
                return
            time.sleep(0.05)


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _cached(path: Path, key: str) -> Choice | None:
    e = _read(path).get(key)
    try:
        if e["path"] not in rows.paths(torch.device("cpu")):
            return None
        return Choice(e["path"], f"cached ({path}, measured {e.get('measured_at', '?')})",
                      {k: float(v) for k, v in e["rates"].items()}, dict(e.get("refused", {})),
                      float(e["copy_rate"]) if e.get("copy_rate") else None, str(e.get("cpu", "")))
    except (KeyError, TypeError, ValueError, AttributeError):
        return None  # an entry of another version or a damaged file: measure again


def cache_file() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "reshardctl" / CACHE_NAME


def cpu_name() -> str:
    """The CPU's model name and torch's CPU capability, e.g. ``AMD EPYC (torch AVX2)``."""
    return f"{_cpuinfo().get('model name', platform.processor() or platform.machine())} " \
           f"(torch {torch.backends.cpu.get_cpu_capability()})"


def machine_key() -> str:
    """What decides the paths' speeds here, hashed: CPU model and flags, torch build and capability, the
    ISA caps in the environment, the compiled kernel's file, torch's thread count."""
    info = _cpuinfo()
    kernel = getattr(rows._rowsums, "__file__", None) if rows._rowsums is not None else None
    st = os.stat(kernel) if kernel else None
    parts = [platform.machine(), info.get("model name", ""), " ".join(sorted(info.get("flags", "").split())),
             torch.__version__, torch.backends.cpu.get_cpu_capability(), os.environ.get("ATEN_CPU_CAPABILITY", ""),
             os.environ.get("ONEDNN_MAX_CPU_ISA", ""), f"{kernel}:{st.st_size}:{st.st_mtime_ns}" if st else "-",
             ",".join(rows.paths(torch.device("cpu"))), f"threads={torch.get_num_threads()}"]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (empty elsewhere)."""
    out: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break
                k, _, v = line.partition(":")
                out[k.strip()] = v.strip()
    except OSError:
        pass
    if "flags" not in out and "Features" in out:  # aarch64
        out["flags"] = out["Features"]
    return out

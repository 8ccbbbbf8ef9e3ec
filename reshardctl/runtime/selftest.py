"""`reshardctl selftest [--gpu]`: named checks of the runtime's own code on one device, each with what
it checked and its numbers. How a site (and this project, on a GPU machine) proves the GPU path.

Checks (``CPU_CHECKS``), all through the runtime's real functions:

* ``pack_roundtrip``: regions of boxes of eight dtypes (fp8, bool and 3-d included), copied out of
  non-contiguous column-slice views into one 8-byte aligned message and then into other
  non-contiguous views, as the executor does outside an arena (piece_copy.py: piece views, one
  ``torch._foreach_copy_`` each way; a region spanning two local boxes is two pieces); the message
  and every destination byte (written or not) compared byte for byte with a reference built on the CPU.
* ``checksum_path``: which row-sum path this process's CPU checksums take (checksum_choice.py: the
  fastest exact one, measured here or read from the machine's cache), its rate beside the other
  paths' and a ``copy_`` of the same buffer; the path passes its exactness probe again, and a kernel
  whose sums differ by one residue fails it. On a device: the path CUDA buffers take (float64).
* ``checksums``: ``checksum`` / ``segment_checksums`` (checksum.py) of adversarial buffers (all zeros,
  all 0xFF, odd lengths, row boundaries, random) equal on the CPU and on the device, and on the device a
  flipped bit, two swapped 8-byte words and one more zero byte each change the sum.
* ``stream_order``: a producer stream writes a large tensor; a transfer stream waits for it (an event;
  and for the current stream, where the destination was allocated), copies it; the result is exact.
  Without the wait the copy could read the tensor before the producer wrote it (the race the
  executor's rule prevents: docs/gpu.md). Device times of both phases come from cuda_timing.py.
* ``pinned_pool``: host tensors (odd sizes, several dtypes, up to 3.5x the pool) copied to the device
  through a 1 MiB ``PinnedStagingPool`` (pinned_pool.py): exact, and the pool never held more than its
  capacity.

Without ``--gpu`` they run on the CPU (the same code, so CI exercises it). The caller adds its own
checks for ``--gpu`` (``gpu_checks``): `reshardctl selftest` adds ``nccl_refit``, a real `reshardctl run`
on NCCL (``commands/selftest_refit.py``). ``inject``: names of checks to break on purpose (a flipped
byte in their result), to prove each check can fail.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable, Mapping

import torch

from reshardctl.runtime.local_weights import LocalWeights, byte_slices, byte_view
from reshardctl.runtime.piece_copy import copy_pieces, message_pieces

CPU_CHECKS = ("pack_roundtrip", "checksum_path", "checksums", "stream_order", "pinned_pool")  # in-process: CPU or one device


@dataclass
class CheckResult:
    name: str
    ok: bool
    what: str
    numbers: dict[str, Any] = field(default_factory=dict)
    skipped: bool = False
    detail: str = ""  # why it failed or was skipped

    def line(self) -> str:
        status = "skipped" if self.skipped else "ok" if self.ok else "FAILED"
        nums = " ".join(f"{k}={_fmt(v)}" for k, v in self.numbers.items())
        tail = f" -- {self.detail}" if self.detail else ""
        return f"{self.name:<15} {status:<7} {self.what}" + (f" [{nums}]" if nums else "") + tail


@dataclass
class SelftestReport:
    device: str
    gpu: bool  # --gpu was asked
    skipped: bool = False  # --gpu without a CUDA device: nothing ran
    why: str = ""
    checks: list[CheckResult] = field(default_factory=list)
    torch_version: str = torch.__version__
    cuda_version: str | None = torch.version.cuda
    wall_s: float = 0.0

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "skipped": self.skipped, "why": self.why, "gpu": self.gpu, "device": self.device,
                "torch": self.torch_version, "cuda": self.cuda_version, "wall_s": round(self.wall_s, 3),
                "checks": [asdict(c) for c in self.checks]}


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _rand(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---- (a) pack / unpack ------------------------------------------------------------------------------
_PACK_TENSORS = (  # name, shape, dtype
    ("a.bf16", (9, 14), "bfloat16"), ("b.f32", (6, 5), "float32"), ("c.fp8", (7, 11), "float8_e4m3fn"),
    ("d.i64", (4, 3), "int64"), ("e.i8", (5, 3, 7), "int8"), ("f.f16", (13,), "float16"),
    ("g.bool", (3, 5), "bool"), ("h.f64", (3, 9), "float64"),
)


def _bsl(box, origin, itemsize: int):
    """``byte_slices`` of ``box`` in a tensor holding ``origin`` (None: the full tensor)."""
    return byte_slices(box, origin or tuple((0, 0) for _ in box), itemsize)


def check_pack_roundtrip(device: torch.device, corrupt: bool = False) -> CheckResult:
    from reshardctl.layout.placement import box_numel
    from reshardctl.models.spec import ModelDims, ModelSpec, TensorSpec
    from reshardctl.runtime.dtypes import torch_dtype
    from reshardctl.runtime.wire import layout_of

    dims = ModelDims(arch="llama", hidden=8, num_layers=1, num_heads=2, num_kv_heads=2, head_dim=4, vocab=16,
                     intermediate=16)
    model = ModelSpec("selftest", dims, tuple(TensorSpec(n, s, d, "ffn", "mlp_up") for n, s, d in _PACK_TENSORS))
    full, src_hold, src_data, dst_hold, dst_data, regions = {}, {}, {}, {}, {}, []
    for i, t in enumerate(model.tensors):
        dt = torch_dtype(t.dtype)
        raw = _rand(t.nbytes, 100 + i)
        full[i] = ((raw & 1).view(torch.bool) if dt == torch.bool else raw.view(dt)).view(t.shape)
        if len(t.shape) == 1:  # 1-d: two ranges of the only dim
            n = t.shape[0]
            src_hold[i] = (((0, 6),), ((6, n),))
            dst_hold[i] = (((0, 4),), ((4, n),))
            regions.append((i, ((2, 11),)))
            regions.append((i, ((0, 2),)))
        else:  # column halves at the source, row halves at the destination
            rows, cols = t.shape[0], t.shape[-1]
            mid = t.shape[-2] if len(t.shape) == 3 else None
            k, r = cols // 2, rows // 2
            inner = ((0, mid),) if mid is not None else ()
            src_hold[i] = (((0, rows),) + inner + ((0, k),), ((0, rows),) + inner + ((k, cols),))
            dst_hold[i] = (((0, r),) + inner + ((0, cols),), ((r, rows),) + inner + ((0, cols),))
            regions.append((i, ((0, rows),) + inner + ((max(0, k - 2), min(cols, k + 3)),)))  # a column slice
            regions.append((i, ((1, rows),) + inner + ((0, 1),)))  # one column, not from row 0
        # every local tensor is a column-slice VIEW of a wider (fused) tensor: non-contiguous rows
        for hold, data in ((src_hold, src_data), (dst_hold, dst_data)):
            views = []
            for box in hold[i]:
                shape = tuple(b - a for a, b in box)
                pad = shape[:-1] + (shape[-1] + 5,)
                fused = torch.empty(pad, dtype=dt, device=device)
                byte_view(fused).fill_(0x5A)
                v = fused[..., 2 : 2 + shape[-1]]
                if data is src_data:  # byte views throughout: fp8 / bool copies are plain bytes
                    byte_view(v).copy_(byte_view(full[i])[_bsl(box, None, t.itemsize)].to(device))
                views.append(v)
            data[i] = views
    src = LocalWeights(model, src_hold, src_data)
    dst = LocalWeights(model, dst_hold, dst_data)
    sizes = [box_numel(box) * model.tensors[i].itemsize for i, box in regions]
    lay = layout_of(sizes)
    buf = torch.zeros(lay.trailer, dtype=torch.uint8, device=device)
    items = [(i, box, off, n) for (i, box), off, n in zip(regions, lay.offsets, sizes)]
    copy_pieces(message_pieces(src, items, buf, send=True))
    if corrupt:
        buf[lay.offsets[1] + sizes[1] // 2] ^= 0x10
    ref = torch.zeros(lay.trailer, dtype=torch.uint8)
    for (i, box), off, n in zip(regions, lay.offsets, sizes):
        ref[off : off + n] = byte_view(full[i])[_bsl(box, None, model.tensors[i].itemsize)].contiguous().reshape(-1)
    bad = []
    packed_ok = torch.equal(buf.cpu(), ref)
    if not packed_ok:
        diff = int((buf.cpu() != ref).sum())
        bad.append(f"packed message differs from the CPU reference in {diff} byte(s)")
    copy_pieces(message_pieces(dst, items, buf, send=False))
    checked = 0
    for i, t in enumerate(model.tensors):
        for box, got in zip(dst_hold[i], dst_data[i]):
            want = torch.empty(got.shape, dtype=got.dtype)
            byte_view(want).fill_(0x5A)
            for ri, rbox in regions:
                if ri != i:
                    continue
                inter = tuple((max(a, c), min(b, d)) for (a, b), (c, d) in zip(box, rbox))
                if all(a < b for a, b in inter):
                    byte_view(want)[_bsl(inter, box, t.itemsize)] = byte_view(full[i])[_bsl(inter, None, t.itemsize)]
            checked += got.numel() * got.element_size()
            if not torch.equal(byte_view(got).cpu().contiguous(), byte_view(want)):
                bad.append(f"{t.name} box {box}: unpacked bytes differ")
    _sync(device)
    what = (f"piece views -> one _foreach_copy_ into one message -> one _foreach_copy_ out (the executor's "
            f"path outside an arena), {len(regions)} regions of {len(_PACK_TENSORS)} dtypes from/to "
            f"non-contiguous column-slice views, byte-exact vs CPU")
    return CheckResult("pack_roundtrip", not bad, what,
                       {"regions": len(regions), "message_bytes": lay.trailer, "dst_bytes_checked": checked},
                       detail="; ".join(bad[:3]))


# ---- (b) checksums ----------------------------------------------------------------------------------
def _adversarial() -> list[tuple[str, torch.Tensor]]:
    rnd = _rand((1 << 20) + 3, 7)
    return [
        ("zeros-4096", torch.zeros(4096, dtype=torch.uint8)),
        ("zeros-4097", torch.zeros(4097, dtype=torch.uint8)),
        ("ff-65537", torch.full((65537,), 0xFF, dtype=torch.uint8)),
        ("ff-1", torch.full((1,), 0xFF, dtype=torch.uint8)),
        ("rand-3", rnd[:3].clone()),
        ("rand-33", rnd[:33].clone()),
        ("rand-row+1", rnd[: 2 * (1 << 15) + 1].clone()),  # one full row of 2**15 limbs + an odd byte
        ("rand-3rows+5", rnd[: 6 * (1 << 15) + 5].clone()),
        ("rand-1MiB+3", rnd),
    ]


def _mutations() -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    base = _rand(8191, 11)
    flip = base.clone()
    flip[1234] ^= 1 << 5
    swap = base.clone()
    a, b = swap[800:808].clone(), swap[1600:1608].clone()
    while torch.equal(a, b):  # (never for this seed) two different words
        b = b ^ 1
    swap[800:808], swap[1600:1608] = b, a
    zeros = torch.zeros(4096, dtype=torch.uint8)
    return [("flipped bit", base, flip), ("swapped 8-byte words", base, swap),
            ("one more zero byte", zeros, torch.zeros(4097, dtype=torch.uint8)),
            ("ff high bit cleared", torch.full((65537,), 0xFF, dtype=torch.uint8),
             torch.cat([torch.full((65536,), 0xFF, dtype=torch.uint8), torch.tensor([0x7F], dtype=torch.uint8)]))]


def check_checksums(device: torch.device, corrupt: bool = False) -> CheckResult:
    from reshardctl.runtime.checksum import checksum, segment_checksums

    bad, nbytes = [], 0
    inputs = _adversarial()
    for k, (name, x) in enumerate(inputs):
        on_dev = x.to(device, copy=True)
        if corrupt and k == len(inputs) - 1:
            on_dev[len(x) // 2] ^= 1  # the device copy differs by one bit: the sums must differ
        want, got = checksum(x), checksum(on_dev).cpu()
        nbytes += x.numel()
        if not torch.equal(want, got):
            bad.append(f"{name}: CPU {want.tolist()} != {device.type} {got.tolist()}")
    big = inputs[-1][1]
    offs, sizes = [0, 4096, 70000, 200002], [4095, 1, 65537, (1 << 19) + 7]
    seg_cpu = segment_checksums(big, offs, sizes)
    seg_dev = segment_checksums(big.to(device), offs, sizes).cpu()
    if not torch.equal(seg_cpu, seg_dev):
        bad.append(f"segment_checksums differ between CPU and {device.type}")
    detected = 0
    muts = _mutations()
    for name, x, y in muts:
        if torch.equal(checksum(x.to(device)).cpu(), checksum(y.to(device)).cpu()):
            bad.append(f"{name}: the corruption left the {device.type} checksum unchanged")
        else:
            detected += 1
    where = f"on CPU and {device}" if device.type == "cuda" else "on CPU (no device: CPU against itself)"
    what = (f"checksum/segment_checksums equal {where} (zeros, 0xFF, odd lengths, row boundaries, random), "
            f"and {len(muts)} corruptions change the {device.type} sum")
    return CheckResult("checksums", not bad, what,
                       {"inputs": len(inputs) + 1, "bytes": nbytes, "corruptions_detected": f"{detected}/{len(muts)}"},
                       detail="; ".join(bad[:3]))


def check_checksum_path(device: torch.device, corrupt: bool = False) -> CheckResult:
    from reshardctl.runtime import checksum_choice, checksum_rows
    from reshardctl.runtime.checksum import path_for

    c = checksum_choice.choice()

    def chosen(b, s, v, R):
        out = checksum_rows.row_sums(b, s, v, R, c.path)
        if corrupt:
            out[-1, 0] = (out[-1, 0] + 1) % checksum_rows.P  # one residue of one row off by one
        return out
    why = checksum_choice.probe_failure(chosen, checksum_choice.exact_row_sums)
    numbers: dict[str, Any] = {"path": c.path, "how": c.how.split(" (")[0]}
    if c.rate:
        numbers["GB/s"] = round(c.rate / 1e9, 3)
    if c.copy_rate:
        numbers["copy_GB/s"] = round(c.copy_rate / 1e9, 3)
        if c.rate:
            numbers["vs_copy"] = round(c.rate / c.copy_rate, 3)
    numbers.update({f"{p}_GB/s": round(r / 1e9, 3) for p, r in c.rates.items() if p != c.path})
    if device.type != "cpu":
        numbers["device_path"] = path_for(device)
    how = c.how if c.how.startswith("forced") else "the fastest exact path measured here"
    what = f"CPU checksums take {c.path} ({c.cpu}; {how}); it passes its exactness probe"
    return CheckResult("checksum_path", why is None, what, numbers,
                       detail="" if why is None else f"{c.path}: {why}")


# ---- (c) stream ordering ----------------------------------------------------------------------------
def _produce(x: torch.Tensor, rounds: int) -> None:
    """Several full passes over ``x`` (long enough on a GPU for an unordered reader to overtake them)."""
    torch.arange(x.numel(), dtype=torch.int64, device=x.device, out=x)
    for r in range(rounds):
        x.mul_(0x9E3779B97F4A7C15 - (1 << 64)).bitwise_xor_((x >> 29) & 0x7FFFFFFFF).add_(r)


def check_stream_order(device: torch.device, corrupt: bool = False, *, numel: int | None = None) -> CheckResult:
    from reshardctl.runtime.cuda_timing import Span

    cuda = device.type == "cuda"
    n = numel or ((32 << 20) if cuda else (1 << 20))  # 256 MiB of int64 on a GPU
    rounds = 8
    x = torch.empty(n, dtype=torch.int64, device=device)
    y = torch.empty(n, dtype=torch.int64, device=device)
    numbers: dict[str, Any] = {"bytes": n * 8}
    if cuda:
        current = torch.cuda.current_stream(device)
        producer, transfer = torch.cuda.Stream(device), torch.cuda.Stream(device)
        producer.wait_stream(current)  # x was allocated on the current stream
        x.record_stream(producer)
        with torch.cuda.stream(producer):
            p_span = Span(device, producer).start()
            _produce(x, rounds)
            p_span.stop()
            produced = torch.cuda.Event()
            produced.record(producer)
        transfer.wait_event(produced)  # THE rule: the transfer stream waits for the producer...
        transfer.wait_stream(current)  # ...and for the stream y was allocated on
        x.record_stream(transfer)
        with torch.cuda.stream(transfer):
            t_span = Span(device, transfer).start()
            y.copy_(x)
            if corrupt:
                y[n // 2] ^= 1
            t_span.stop()
        current.wait_stream(transfer)  # the consumer (the comparison below) waits for the transfer
        want = torch.empty_like(x)
        _produce(want, rounds)
        ok = torch.equal(y, want)
        numbers["producer_device_ms"] = p_span.seconds(wait=True) * 1e3
        numbers["copy_device_ms"] = t_span.seconds(wait=True) * 1e3
        numbers["copy_host_enqueue_ms"] = t_span.host_seconds * 1e3
        # informational: the same copy WITHOUT the wait, to show the hazard the rule prevents
        z = torch.empty_like(x)
        x.zero_()  # on the current stream: stale data reads as zeros
        racer = torch.cuda.Stream(device)
        racer.wait_stream(current)  # ordered after the allocations and the zeroing, NOT after the producer below
        producer.wait_stream(current)
        x.record_stream(racer)
        with torch.cuda.stream(producer):
            _produce(x, rounds)
        with torch.cuda.stream(racer):
            z.copy_(x)
        current.wait_stream(racer)
        current.wait_stream(producer)
        numbers["unordered_copy_raced"] = not torch.equal(z, want)
        what = ("transfer stream waits on the producer stream (event) and the allocating stream, copies "
                f"{n * 8 >> 20} MiB, consumer waits on the transfer: exact (device times from CUDA events; "
                "unordered_copy_raced: whether the same copy without the wait read stale data this time)")
    else:
        span = Span(device).start()
        _produce(x, rounds)
        y.copy_(x)
        if corrupt:
            y[n // 2] ^= 1
        span.stop()
        want = torch.empty_like(x)
        _produce(want, rounds)
        ok = torch.equal(y, want)
        numbers["host_ms"] = span.seconds() * 1e3
        what = (f"cpu: produce then copy {n * 8 >> 20} MiB in program order, exact (no streams on a CPU; "
                "on a GPU the transfer stream must wait for the producer or the copy races)")
    return CheckResult("stream_order", ok, what, numbers,
                       detail="" if ok else f"the copied tensor differs in {int((y != want).sum())} element(s)")


# ---- (d) pinned pool --------------------------------------------------------------------------------
def check_pinned_pool(device: torch.device, corrupt: bool = False) -> CheckResult:
    from reshardctl.runtime.pinned_pool import PinnedStagingPool

    cuda = device.type == "cuda"
    pool = PinnedStagingPool(1 << 20)  # two 512 KiB slots
    big = _rand((7 << 19) + 4093, 21)  # 3.5 MiB + an odd tail
    wide = big[: 96 * 1000 * 4].view(torch.float32).view(96, 1000)
    sources = [
        big[:0].clone(), big[:1].clone(), big[:4097].clone(), big[: pool.chunk].clone(), big[: pool.chunk + 1].clone(),
        big[: 600_000].view(torch.bfloat16).view(600, 500), wide[:, 17:650],  # a non-contiguous column slice
        big[: (1 << 20) + 8].view(torch.float64), big,
    ]
    bad, total, peak = [], 0, 0
    t0 = time.perf_counter()
    for k, s in enumerate(sources):
        if cuda:
            got = pool.to_device(s.contiguous(), device)
        else:
            got = torch.empty(s.shape, dtype=s.dtype)
            pool.copy_(got, s, always_stage=True)  # the same chunk loop, unpinned
        peak = max(peak, pool.allocated_bytes)
        if corrupt and k == len(sources) - 1:
            byte_view(got).view(-1)[s.numel() // 3] ^= 0x40
        total += s.numel() * s.element_size()
        if not torch.equal(byte_view(got.cpu().contiguous()), byte_view(s.contiguous())):
            bad.append(f"copy {k} ({s.dtype} {tuple(s.shape)}) differs")
    _sync(device)
    secs = time.perf_counter() - t0
    if peak > pool.capacity:
        bad.append(f"the pool held {peak} bytes, over its {pool.capacity}")
    if cuda and not pool.pinned:
        bad.append("the staging buffer is not pinned")
    chunks_want = sum(-(-(s.numel() * s.element_size()) // pool.chunk) for s in sources)
    if pool.stats.chunks != chunks_want:
        bad.append(f"{pool.stats.chunks} chunks, expected {chunks_want}")
    where = "pinned buffer, non_blocking H2D, slot events" if cuda else "cpu: unpinned buffer, plain copies"
    numbers = {"copies": len(sources), "bytes": total, "capacity": pool.capacity, "peak_held": peak,
               "chunks": pool.stats.chunks, "host_waits": pool.stats.host_waits}
    if cuda:
        numbers["GB_per_s"] = total / secs / 1e9 if secs > 0 else 0.0
    pool.close()
    return CheckResult("pinned_pool", not bad, f"PinnedStagingPool chunked copies of {len(sources)} host tensors "
                       f"(odd sizes, 4 dtypes, a column slice, 3.5x the pool) exact, bounded ({where})",
                       numbers, detail="; ".join(bad[:3]))


_CHECK_FUNCS: dict[str, Callable[..., CheckResult]] = {
    "pack_roundtrip": check_pack_roundtrip, "checksum_path": check_checksum_path, "checksums": check_checksums,
    "stream_order": check_stream_order,
    "pinned_pool": check_pinned_pool,
}


Check = Callable[[torch.device, bool], CheckResult]  # (device, corrupt) -> result


def _run_check(name: str, func: Check, device: torch.device, corrupt: bool) -> CheckResult:
    try:
        return func(device, corrupt)
    except Exception as exc:  # noqa: BLE001 - a check that raises has failed; the others still run
        return CheckResult(name, False, "raised", detail=f"{type(exc).__name__}: {exc}")


def run_selftest(gpu: bool = False, *, inject: Iterable[str] = (), checks: Iterable[str] | None = None,
                 cuda_available: Callable[[], bool] | None = None,
                 on_result: Callable[[CheckResult], None] | None = None,
                 gpu_checks: Mapping[str, Check] | None = None) -> SelftestReport:
    """Run the checks (on the GPU with ``gpu``, else on the CPU); ``on_result`` is called after each.
    ``gpu_checks``: the caller's own checks, run after these with ``gpu`` only, in order (the CLI's
    ``nccl_refit``: commands/selftest_refit.py). With ``gpu`` and no CUDA device: a report with
    ``skipped`` and why, no check run."""
    funcs: dict[str, Check] = {**_CHECK_FUNCS, **(gpu_checks or {})}
    inject = set(inject)
    unknown = inject - set(funcs)
    if unknown:
        raise ValueError(f"unknown check(s) {sorted(unknown)}: the checks are {', '.join(funcs)}")
    t0 = time.perf_counter()
    if gpu:
        available = (cuda_available or torch.cuda.is_available)()
        if not available:
            why = (f"no CUDA device: torch.cuda.is_available() is False (torch {torch.__version__}, built "
                   f"{'with CUDA ' + torch.version.cuda if torch.version.cuda else 'without CUDA'}; "
                   f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '(unset)')})")
            return SelftestReport(device="none", gpu=True, skipped=True, why=why)
        from reshardctl.runtime.device import resolve_cuda_device

        choice = resolve_cuda_device()
        device = torch.device("cuda", choice.index)
        torch.cuda.set_device(device)
        names = list(funcs)
        why = f"{torch.cuda.get_device_name(device)}; {choice.why}"
    else:
        device = torch.device("cpu")
        names = list(CPU_CHECKS)
        why = "no --gpu: the same checks on the CPU"
    if checks is not None:
        wanted = list(checks)
        names = [n for n in names if n in wanted]
    report = SelftestReport(device=str(device), gpu=gpu, why=why)
    for name in names:
        res = _run_check(name, funcs[name], device, name in inject)
        report.checks.append(res)
        if on_result is not None:
            on_result(res)
    report.wall_s = time.perf_counter() - t0
    return report

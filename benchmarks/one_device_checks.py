"""Steps checksums, rates, staging and calibrate of benchmarks/gpu_one_device.sh (one_device.py runs them).

* checksums: ``checksum`` / ``segment_checksums`` (runtime/checksum.py, public functions only) of
  structured buffers (zeros, all ones bits, extremes, ramps, alternating signs, inf/NaN for floats) and
  random ones of every dtype a model holds, at odd lengths and row boundaries: on CUDA equal to the CPU's
  value bit for bit; everywhere ``segment_checksums`` of the buffers laid out together equals each
  buffer's ``checksum``, and a flipped bit changes the sum (on the device where there is one).
* rates: device GB/s of the checksum, of the executor's staged-message pack (``MessageCopy.gather``) and
  unpack (``scatter``) over a real plan's programs, beside a plain contiguous ``copy_`` of the same bytes;
  CUDA events on a GPU, perf_counter on the CPU. The packed bytes are checked once.
* staging: host -> device copies through a ``PinnedStagingPool`` on a side stream while a producer stream
  keeps the device busy, each checked through a consumer stream; then a producer writes a tensor behind a
  device sleep while the transfer stream, ordered by an event, copies it to pinned host memory: exact
  every round. GPU only (a CPU rehearsal of the pool's chunk loop).
* calibrate: the figures of a calibration file (site/measured.py) one GPU can give: copy, checksum, and
  the landing's host costs on the device; the rest need two nodes (listed). GPU only (CPU rehearsal).
"""

from __future__ import annotations

import statistics
import time

import torch

from one_device import Fail, Skip, injected

DTYPES = ("float32", "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2", "float64", "int8", "uint8", "int16",
          "int32", "int64", "bool")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8)


def _structured(dt: torch.dtype, n: int) -> dict[str, torch.Tensor]:
    if dt == torch.bool:
        alt = torch.arange(n) % 2 == 0
        return {"false": torch.zeros(n, dtype=torch.bool), "true": torch.ones(n, dtype=torch.bool), "alternating": alt}
    ones = torch.full((n,), 0xFF, dtype=torch.uint8).repeat_interleave(dt.itemsize).view(dt)
    out = {"zeros": torch.zeros(n, dtype=dt), "all-ones-bits": ones}
    if dt.is_floating_point:
        fin = torch.finfo(dt)
        ramp = (torch.arange(n, dtype=torch.float64) - n / 2) / max(1, n // 8)
        out["ramp"] = ramp.to(dt)
        big = torch.tensor(fin.max, dtype=torch.float64)
        out["+-max"] = torch.where(torch.arange(n) % 2 == 0, big, -big).to(dt)
        out["-0.0"] = torch.full((n,), -0.0, dtype=torch.float32).to(dt)
        out["tiny"] = torch.full((n,), fin.tiny, dtype=torch.float64).to(dt)
        special = torch.tensor([float("inf"), float("-inf"), float("nan"), 1.0], dtype=torch.float32)
        out["inf-nan"] = special.repeat(n // 4 + 1)[:n].to(dt)
    else:
        info = torch.iinfo(dt)
        out["min"] = torch.full((n,), info.min, dtype=dt)
        out["max"] = torch.full((n,), info.max, dtype=dt)
        span = info.max - info.min + 1
        ramp = torch.arange(n, dtype=torch.int64)
        out["ramp"] = (ramp if span > 1 << 62 else ramp % span + info.min).to(dt)
        out["alternating"] = torch.where(torch.arange(n) % 2 == 0, info.max, info.min).to(dt)
    return out


def _random(dt: torch.dtype, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (n * dt.itemsize,), dtype=torch.uint8, generator=g)
    return (raw & 1).view(torch.bool) if dt == torch.bool else raw.view(dt)


def _buffers(cpu: bool):
    """(dtype, name, tensor) for every dtype: structured at several lengths, random at odd sizes."""
    lengths = (3, 4097) if cpu else (1, 3, 33, 4097, (1 << 15) + 1, (1 << 20) + 3)
    big = (1 << 16) + 5 if cpu else (8 << 20) + 5
    for k, name in enumerate(DTYPES):
        dt = getattr(torch, name, None)
        if dt is None:
            continue
        for n in lengths:
            for label, t in _structured(dt, n).items():
                yield name, f"{label}-{n}", t
        yield name, f"random-{big}", _random(dt, big, 1000 + k)
        yield name, "random-odd", _random(dt, 12345, 2000 + k)


def step_checksums(ctx) -> dict:
    from reshardctl.runtime.checksum import checksum, segment_checksums

    dev, cpu = ctx["device"], ctx["cpu"]
    bad, per_dtype, n_bufs, n_bytes = [], {}, 0, 0
    groups: dict[str, list[tuple[str, torch.Tensor]]] = {}
    for name, label, t in _buffers(cpu):
        groups.setdefault(name, []).append((label, _bytes(t).clone()))
    corrupt = injected("checksums")
    for name, bufs in groups.items():
        offs, o = [], 0
        for _, b in bufs:
            offs.append(o)
            o = (o + b.numel() + 7) & ~7
        arena = torch.zeros(max(o, 8), dtype=torch.uint8)
        for (_, b), off in zip(bufs, offs):
            arena[off:off + b.numel()] = b
        sizes = [b.numel() for _, b in bufs]
        want = torch.stack([checksum(b) for _, b in bufs])  # the CPU's values
        if corrupt and cpu and name == "bfloat16":
            arena[offs[-1] + 7] ^= 0x04  # the buffers laid out together differ by one bit: must be caught
        seg_cpu = segment_checksums(arena, offs, sizes)
        if not torch.equal(want, seg_cpu):
            bad.append(f"{name}: segment_checksums != checksum on the CPU")
        if not cpu:
            dev_arena = arena.to(dev)
            if corrupt and name == "bfloat16":
                dev_arena[offs[-1] + 7] ^= 0x04
            got = torch.stack([checksum(dev_arena[off:off + n]) for off, n in zip(offs, sizes)]).cpu()
            seg_dev = segment_checksums(dev_arena, offs, sizes).cpu()
            for (label, _), w, g in zip(bufs, want, got):
                if not torch.equal(w, g):
                    bad.append(f"{name} {label}: CPU {w.tolist()} != CUDA {g.tolist()}")
            if not torch.equal(seg_dev, want):
                bad.append(f"{name}: segment_checksums on CUDA != the CPU's checksums")
        flip = arena.to(dev, copy=True)
        flip[offs[-1] + sizes[-1] // 2] ^= 0x01
        if torch.equal(segment_checksums(flip, offs[-1:], sizes[-1:]).cpu(), want[-1:]):
            bad.append(f"{name}: a flipped bit left the {dev.type} checksum unchanged")
        per_dtype[name] = len(bufs)
        n_bufs += len(bufs)
        n_bytes += sum(sizes)
    from reshardctl.runtime.checksum import path_for

    paths = {"cpu": path_for(torch.device("cpu"))} | ({} if cpu else {"cuda": path_for(dev)})
    where = (f"CPU ({paths['cpu']}) == CUDA ({paths.get('cuda')}) bit for bit" if not cpu
             else f"CPU only ({paths['cpu']}; no CUDA: checksum == segment_checksums)")
    detail = {"dtypes": per_dtype, "buffers": n_bufs, "bytes": n_bytes, "where": where, "paths": paths,
              "headline": f"{n_bufs} buffers of {len(per_dtype)} dtypes ({n_bytes / 2**20:.1f} MiB): {where}; "
                          "a flipped bit changes every sum"}
    if bad:
        raise Fail(f"{len(bad)} mismatch(es): {'; '.join(bad[:4])}", detail | {"mismatches": bad[:50]})
    return detail


# ---- rates -------------------------------------------------------------------------------------------
def _timed(fn, device: torch.device, reps: int) -> float:
    """Median seconds of ``fn()`` after a warm-up: CUDA events on a GPU (device time), else perf_counter."""
    from reshardctl.runtime.cuda_timing import Span

    fn()
    _sync(device)
    out = []
    for _ in range(reps):
        s = Span(device).start()
        fn()
        s.stop()
        out.append(s.seconds(wait=True))
    return statistics.median(out)


def _staged_messages(device: torch.device, cpu: bool):
    """The staged (not in place) messages of every rank of a real plan, with their arenas on ``device``."""
    from reshardctl.request.request import RefitRequest
    from reshardctl.request.resolve import prepare
    from reshardctl.runs.session import plan_transports
    from reshardctl.runtime.executor import arena_place
    from reshardctl.runtime.local_weights import LocalWeights
    from reshardctl.runtime.program import compile_program
    from reshardctl.runtime.span_copy import MessageCopy, copy_spec

    model, train, infer = ("tiny-llama", "tp=2,pp=2", "tp=2,dp=2")
    plan = plan_transports(prepare(RefitRequest(model=model, train=train, infer=infer)), ["reshard"])["reshard"]
    ranks = [0, plan.train_world] if cpu else range(plan.train_world + plan.infer_world)
    for rank in ranks:
        prog = compile_program(plan, rank)
        side = "recvs" if rank >= plan.train_world else "sends"
        w = LocalWeights.in_arena(plan.model, prog.holdings, device, order=prog.order)
        n = w.arena.numel() - w.arena.numel() % 251  # a pattern of period 251: no two messages alike
        w.arena[:n].view(-1, 251).copy_(torch.arange(251, dtype=torch.uint8, device=device))
        for st in prog.steps:
            for link in getattr(st, side):
                for m in link.messages:
                    if arena_place(w, m) is None:
                        spec = copy_spec(w, m.regions, m.offsets)
                        if spec is not None:
                            yield f"{model} {train} -> {infer}", w, m, MessageCopy(spec, device)


def step_rates(ctx) -> dict:
    from reshardctl.runtime.checksum import checksum

    dev, cpu = ctx["device"], ctx["cpu"]
    reps = 3 if cpu else 10
    msgs = list(_staged_messages(dev, cpu))
    if not msgs:
        raise Fail("the plan has no staged messages to pack")
    total = sum(m.nbytes for _, _, m, _ in msgs)
    block = torch.empty(total + 8 * len(msgs), dtype=torch.uint8, device=dev)
    offs, o = [], 0
    for _, _, m, _ in msgs:
        offs.append(o)
        o = (o + m.nbytes + 7) & ~7

    def pack():
        for (_, w, m, cp), off in zip(msgs, offs):
            cp.gather(w, block[off:off + m.nbytes])

    def unpack():
        for (_, w, m, cp), off in zip(msgs, offs):
            cp.scatter(w, block[off:off + m.nbytes])

    pack()
    packed = block.clone()
    unpack()
    pack()  # an unpack of what was packed leaves the arenas as they were: the same bytes again
    if not torch.equal(packed, block) or injected("rates"):
        raise Fail("pack -> unpack -> pack did not give the same bytes", {"bytes": total})
    src = torch.empty(total, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    sum_buf = block[: total - total % 2]
    figures = {"pack_s": _timed(pack, dev, reps), "unpack_s": _timed(unpack, dev, reps),
               "copy_s": _timed(lambda: dst.copy_(src), dev, reps),
               "checksum_s": _timed(lambda: checksum(sum_buf), dev, reps)}
    gbs = {k.replace("_s", "_GB_per_s"): total / v / 1e9 for k, v in figures.items()}
    case = msgs[0][0]
    return {"case": case, "messages": len(msgs), "bytes": total, "reps": reps, "clock": "cuda" if not cpu else "host",
            **{k: round(v, 3) for k, v in gbs.items()},
            "pack_vs_copy": round(figures["copy_s"] / figures["pack_s"], 3),
            "unpack_vs_copy": round(figures["copy_s"] / figures["unpack_s"], 3),
            "headline": f"{len(msgs)} staged messages ({total / 2**20:.1f} MiB, {case}): pack "
                        f"{gbs['pack_GB_per_s']:.2f}, unpack {gbs['unpack_GB_per_s']:.2f}, copy_ "
                        f"{gbs['copy_GB_per_s']:.2f}, checksum {gbs['checksum_GB_per_s']:.2f} GB/s "
                        f"({'device' if not cpu else 'host'} time)"}


# ---- staging under a producer stream -------------------------------------------------------------------
def _sources(total_mb: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, ((total_mb << 20) + 4093,), dtype=torch.uint8, generator=g)
    return [raw[:0].clone(), raw[:1].clone(), raw[:4097].clone(), raw[: (1 << 20) + 3].clone(),
            raw[: 600_000].view(torch.bfloat16).view(600, 500).clone(), raw.clone()]


def _pool_copies(device: torch.device, rounds: int, total_mb: int, corrupt: bool) -> dict:
    """Host tensors -> ``device`` through a 1 MiB pool (two slots) on a transfer stream while a producer
    stream runs matrix products; a consumer stream checks each copy's checksum against the host's."""
    from reshardctl.runtime.checksum import checksum
    from reshardctl.runtime.pinned_pool import PinnedStagingPool

    cuda = device.type == "cuda"
    pool = PinnedStagingPool(1 << 20)
    bad, total, peak = [], 0, 0
    t0 = time.perf_counter()
    x = torch.randn(2048, 2048, device=device) if cuda else None
    producer = torch.cuda.Stream(device) if cuda else None
    transfer = torch.cuda.Stream(device) if cuda else None
    for r in range(rounds):
        if cuda:
            with torch.cuda.stream(producer):  # the device busy while the copies run
                for _ in range(4):
                    x = (x @ x).tanh_()
        for k, s in enumerate(_sources(total_mb, 100 + r)):
            if cuda:
                dst = torch.empty(s.shape, dtype=s.dtype, device=device)
                transfer.wait_stream(torch.cuda.current_stream(device))  # dst was allocated on the current stream
                pool.copy_(dst, s, stream=transfer)
                torch.cuda.current_stream(device).wait_stream(transfer)  # the consumer after the copy
            else:
                dst = torch.empty(s.shape, dtype=s.dtype)
                pool.copy_(dst, s, always_stage=True)
            peak = max(peak, pool.allocated_bytes)
            if corrupt and r == rounds - 1 and k == 3:
                dst.view(-1)[5] ^= 1
            total += s.numel() * s.element_size()
            if s.numel() and not torch.equal(checksum(_bytes(dst)).cpu(), checksum(_bytes(s))):
                bad.append(f"round {r} copy {k} ({s.dtype} {tuple(s.shape)}) differs")
    _sync(device)
    secs = time.perf_counter() - t0
    out = {"rounds": rounds, "bytes": total, "capacity": pool.capacity, "peak_held": peak, "chunks": pool.stats.chunks,
           "host_waits": pool.stats.host_waits, "pinned": pool.pinned, "bad": bad,
           "GB_per_s": round(total / secs / 1e9, 3)}  # copies and their checksum checks together: not the H2D rate
    if peak > pool.capacity:
        bad.append(f"the pool held {peak} bytes, over its {pool.capacity}")
    if cuda and not pool.pinned:
        bad.append("the staging buffer is not pinned")
    pool.close()
    return out


def _produce(x: torch.Tensor, r: int) -> None:
    torch.arange(x.numel(), dtype=torch.int64, device=x.device, out=x)
    x.mul_(0x9E3779B97F4A7C15 - (1 << 64)).add_(r)


def _ordered_readback(device: torch.device, rounds: int, corrupt: bool) -> dict:
    """A producer writes a tensor behind a device sleep; the transfer stream waits on its event, then
    copies it to pinned host memory; the host compares after the transfer's event: exact every round."""
    n = 16 << 20  # 128 MiB of int64
    x = torch.empty(n, dtype=torch.int64, device=device)
    host = torch.empty(n, dtype=torch.int64, pin_memory=True)
    producer, transfer = torch.cuda.Stream(device), torch.cuda.Stream(device)
    current = torch.cuda.current_stream(device)
    bad = []
    want = torch.empty(n, dtype=torch.int64)
    for r in range(rounds):
        producer.wait_stream(current)
        transfer.wait_stream(current)  # the previous round's host compare is done (host-side, below)
        with torch.cuda.stream(producer):
            torch.cuda._sleep(20_000_000)  # the producer still busy when the transfer is enqueued
            _produce(x, r)
            written = torch.cuda.Event()
            written.record(producer)
        transfer.wait_event(written)
        with torch.cuda.stream(transfer):
            host.copy_(x, non_blocking=True)
            done = torch.cuda.Event(blocking=True)
            done.record(transfer)
        done.synchronize()
        _produce(want, r)
        if corrupt and r == rounds - 1:
            want[7] ^= 1
        if not torch.equal(host, want):
            bad.append(f"round {r}: {int((host != want).sum())} element(s) read before the producer wrote them")
    x.record_stream(producer)
    x.record_stream(transfer)
    return {"rounds": rounds, "bytes_per_round": n * 8, "bad": bad}


def step_staging(ctx) -> dict:
    dev, cpu = ctx["device"], ctx["cpu"]
    corrupt = injected("staging")
    if cpu:
        rehearsal = _pool_copies(dev, 1, 2, corrupt)
        raise Skip("no CUDA device: pinned staging and stream order need one", {
            "rehearsal": rehearsal | {"what": "the pool's chunk loop through an unpinned buffer, no streams",
                                      "ok": not rehearsal["bad"]}})
    pool = _pool_copies(dev, 4, 8, corrupt)
    order = _ordered_readback(dev, 6, False)
    bad = pool["bad"] + order["bad"]
    detail = {"pool": pool, "ordered_readback": order,
              "headline": f"{pool['rounds']} x 6 pinned-pool copies under a busy producer stream exact, peak "
                          f"{pool['peak_held']} <= {pool['capacity']} B ({pool['GB_per_s']:.2f} GB/s copied and checked); "
                          f"{order['rounds']} producer->transfer->host rounds exact"}
    if bad:
        raise Fail("; ".join(bad[:4]), detail)
    return detail


# ---- calibrate ---------------------------------------------------------------------------------------
NEED_A_NODE = ("intra_node_bytes_per_s", "intra_node_latency_s", "cross_node_bytes_per_s", "cross_node_latency_s",
               "node_aggregate_bytes_per_s", "launch_s", "per_message_s", "broadcast_bytes_per_s",
               "copy_side_bytes_per_s", "checksum_side_bytes_per_s", "checksum_world_bytes_per_s",
               "control_round_s")


def _one_device_figures(device: torch.device, reps: int, views: int) -> dict:
    from reshardctl.calibrate.landing import host_cost
    from reshardctl.calibrate.microbench import _checksum_rate, _copy_rate

    copy, summ = _copy_rate(device, reps), _checksum_rate(device, reps)
    land = host_cost(device, reps=reps, n=views)
    return {"copy_bytes_per_s": copy["bytes"] / copy["seconds"],
            "checksum_bytes_per_s": summ["bytes"] / summ["seconds"],
            "landing_s_per_param": max(land["direct_seconds"] / land["views"], 1e-12),
            "loader_s_per_tensor": max(land["loader_seconds"] / land["views"], 1e-12),
            "samples": {"copy": copy, "checksum": summ, "landing": land}}


def step_calibrate(ctx) -> dict:
    from reshardctl.site.measured import FIGURES, OPTIONAL_FIGURES

    dev, cpu = ctx["device"], ctx["cpu"]
    if cpu:
        got = _one_device_figures(dev, 1, 64)
        raise Skip("no CUDA device: the GPU figures need one", {"rehearsal": {
            "what": "the same microbenchmarks on the CPU (not a calibration)", "ok": True,
            "figures": {k: v for k, v in got.items() if k != "samples"}}})
    got = _one_device_figures(dev, 5, 2048)
    figures = {k: v for k, v in got.items() if k != "samples"}
    unknown = set(figures) - set(FIGURES) - set(OPTIONAL_FIGURES)
    if unknown or set(NEED_A_NODE) | set(figures) != set(FIGURES) | set(OPTIONAL_FIGURES):
        raise Fail(f"figures out of step with site/measured.py: {sorted(unknown)}")
    if any(not v > 0 for v in figures.values()) or injected("calibrate"):
        raise Fail(f"a figure is not positive: {figures}")
    return {"figures": figures, "samples": got["samples"], "need_a_node": list(NEED_A_NODE),
            "note": "copy/checksum of one rank; the *_side figures are a node's ranks at once (its GPUs together)",
            "headline": f"copy {figures['copy_bytes_per_s'] / 1e9:.1f} GB/s, checksum "
                        f"{figures['checksum_bytes_per_s'] / 1e9:.1f} GB/s, landing "
                        f"{figures['landing_s_per_param'] * 1e6:.2f} us/param on the device; "
                        f"{len(NEED_A_NODE)} figures need a node"}

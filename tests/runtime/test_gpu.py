"""NCCL / CUDA checks, marked ``gpu``: they run only when asked (``make test-gpu``, i.e.
``RESHARDCTL_TEST_GPU=1``); the CPU suite never picks NCCL. Each needs one CUDA device unless marked
``gpus(n)`` (an NCCL world of n ranks, one device each): on a machine with fewer, it is skipped with
"needs n GPUs, found k" (tests/helpers/gpu_marks.py); ``make test-gpu-one`` runs the one-device ones.

* the checksum gives the same value on CUDA as on the CPU (the pinned values of test_checksum.py);
* a refit on NCCL (data plane) with the gloo control plane is byte exact;
* a killed rank on NCCL ends the refit on every survivor within the bound, with records, and the
  survivors are not killed by the NCCL watchdog (TORCH_NCCL_ASYNC_ERROR_HANDLING=2: abort, not kill);
* `reshardctl selftest --gpu` passes every check (pack, checksums, stream order, pinned pool; the NCCL
  refit with >= 2 GPUs, skipped with one)."""

from __future__ import annotations

import json

import pytest
import torch

from reshardctl.cli import main
from reshardctl.errors import TransferError
from reshardctl.launch.local import run_local
from reshardctl.runtime.checksum import checksum, segment_checksums
from reshardctl.runtime.contract import RunOptions
from reshardctl.runtime.selftest import CPU_CHECKS

from helpers.runtime_plans import p2p_plan, rows_cols_case
from helpers.pinned_checksums import PINNED_ARANGE
from helpers.fault_drills import drill_time, survivors_detect_within_bound
from helpers.weight_checks import assert_previous_weights

pytestmark = pytest.mark.gpu


def test_checksum_same_value_on_cuda_and_cpu():
    assert checksum(torch.arange(256, dtype=torch.uint8).repeat(37).cuda()).tolist() == PINNED_ARANGE
    g = torch.Generator().manual_seed(5)
    buf = torch.randint(0, 256, (3 << 20,), dtype=torch.uint8, generator=g)
    offs, sizes = [0, 1 << 20, 2 << 20], [1000001, 4097, (1 << 20) - 3]
    assert torch.equal(segment_checksums(buf, offs, sizes), segment_checksums(buf.cuda(), offs, sizes).cpu())


@pytest.mark.gpus(4)
def test_nccl_refit_is_byte_exact(tmp_path):
    m, src, dst = rows_cols_case()
    plan = p2p_plan(m, src, dst, per_tensor_rounds=True)
    reports = run_local(plan, RunOptions(run_dir=str(tmp_path), iterations=2, device="cuda", dump_weights=True,
                                         full_check=True, timeout_s=30))
    assert all(r.ok and r.backend == "nccl" for r in reports)
    assert_previous_weights(tmp_path, plan, 2, [2, 3])


@pytest.mark.gpus(4)
def test_nccl_killed_rank_is_detected_and_survivors_report(tmp_path):
    m, src, dst = rows_cols_case()
    plan = p2p_plan(m, src, dst, per_tensor_rounds=True)
    timeout = 10.0
    with pytest.raises(TransferError) as info:
        run_local(plan, RunOptions(run_dir=str(tmp_path), iterations=3, device="cuda", dump_weights=True,
                                   timeout_s=timeout, faults="kill:rank=1:phase=transfer:step=2"))
    err = info.value
    assert err.failures[0]["rank"] == 1
    assert len(err.failures) == 4  # three survivors reported (none killed by a watchdog)
    survivors_detect_within_bound(err, drill_time(tmp_path, 1), timeout + 10)
    assert_previous_weights(tmp_path, plan, 1, [2, 3])


def test_selftest_gpu_passes_every_check(capsys):
    code = main(["selftest", "--gpu", "--json"])
    rep = json.loads(capsys.readouterr().out)
    failed = [(c["name"], c["detail"]) for c in rep["checks"] if not c["ok"]]
    assert code == 0 and rep["ok"] and not rep["skipped"] and failed == [], failed
    assert rep["device"].startswith("cuda:")
    checks = {c["name"]: c for c in rep["checks"]}
    assert list(checks) == [*CPU_CHECKS, "nccl_refit"]  # the runtime's checks, then the CLI's NCCL refit
    assert all(not c["skipped"] for n, c in checks.items() if n != "nccl_refit")
    assert checks["pinned_pool"]["numbers"]["peak_held"] <= checks["pinned_pool"]["numbers"]["capacity"]
    nccl = checks["nccl_refit"]
    if torch.cuda.device_count() >= 2:
        assert not nccl["skipped"] and nccl["numbers"]["backend"] == "nccl" and nccl["numbers"]["commits"] > 0
    else:
        assert nccl["skipped"]


# --- issue 27: the NCCL path after a failure (docs/gpu.md "Failures on NCCL"); each would have caught one
# of its findings on the first GPU run.

@pytest.mark.gpus(4)
def test_nccl_hang_before_any_connection_is_bounded_by_the_pre_connect(tmp_path):
    """A hang at first contact (phase connect, step 1: no p2p connection exists yet): without the bounded
    pre-connect every other rank blocks inside ncclGroupEnd to the walltime."""
    m, src, dst = rows_cols_case()
    plan = p2p_plan(m, src, dst, per_tensor_rounds=True)
    timeout = 10.0
    with pytest.raises(TransferError) as info:
        run_local(plan, RunOptions(run_dir=str(tmp_path), iterations=2, device="cuda", dump_weights=True,
                                   timeout_s=timeout, faults="hang:rank=2:phase=connect:step=1"))
    err = info.value
    assert err.failures[0]["rank"] == 2 and len(err.failures) == 4
    survivors_detect_within_bound(err, drill_time(tmp_path, 2), timeout + 10)
    assert all(f["phase"] in ("connect", "start") for f in err.failures[1:])


@pytest.mark.gpus(4)
def test_nccl_hang_at_step_2_with_a_retry_ends_bounded_and_no_survivor_is_killed(tmp_path, monkeypatch):
    """Rank 2 stalls in step 2 past the timeout with ``--retries 1``: the silent rank is lost (settling
    does not wait for it again: no retry), reshardctl's communicators are aborted at the failure exit,
    every other rank reports its own error within the bound (none killed by torch's monitor, whose
    heartbeat timeout is 5 s here, nor left spinning in a kernel) and serves step 1."""
    monkeypatch.setenv("TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", "5")
    m, src, dst = rows_cols_case()
    plan = p2p_plan(m, src, dst, per_tensor_rounds=True)
    timeout = 15.0
    with pytest.raises(TransferError) as info:
        run_local(plan, RunOptions(run_dir=str(tmp_path), iterations=4, device="cuda", dump_weights=True,
                                   timeout_s=timeout, retries=1,
                                   faults="hang:rank=2:phase=transfer:step=2:seconds=120"))
    err = info.value
    assert err.failures[0]["rank"] == 2 and len(err.failures) == 4
    assert all(f.get("error") != "RankLost" for f in err.failures[1:]), err.failures
    survivors_detect_within_bound(err, drill_time(tmp_path, 2), timeout + 10)
    assert_previous_weights(tmp_path, plan, 1, [3])


@pytest.mark.gpus(4)
def test_nccl_retry_on_rebuilt_groups_commits(tmp_path):
    """A corrupted byte at step 2 fails verification on every rank (all alive): every rank settles, the
    NCCL groups are released (aborted, not destroyed) and rebuilt, and attempt 1 of step 2 commits."""
    m, src, dst = rows_cols_case()
    plan = p2p_plan(m, src, dst, per_tensor_rounds=True)
    reports = run_local(plan, RunOptions(run_dir=str(tmp_path), iterations=4, device="cuda", dump_weights=True,
                                         timeout_s=15.0, retries=1, faults="corrupt:rank=2:step=2"))
    assert all(r.ok for r in reports) and len(reports) == 4
    assert [(a["step"], a["attempt"]) for a in reports[0].attempts] == [(2, 0), (2, 1)]
    assert_previous_weights(tmp_path, plan, 4, [2, 3])


@pytest.mark.gpus(4)
def test_nccl_gather_and_broadcast_over_two_sub_communicators_with_the_baseline(tmp_path):
    """Buckets alternating between two broadcast groups (two sub-communicators), refit and raw baseline:
    one communicator at a time, pre-connected, byte exact."""
    from helpers.runtime_plans import alternating_plan
    plan = alternating_plan()
    reports = run_local(plan, RunOptions(run_dir=str(tmp_path), iterations=2, device="cuda", dump_weights=True,
                                         full_check=True, timeout_s=30, baseline=True))
    assert all(r.ok and r.backend == "nccl" for r in reports)
    assert all(r.baseline.get("broadcast_bytes", 0) > 0 for r in reports if r.global_rank in (2, 3))
    assert_previous_weights(tmp_path, plan, 2, [2, 3])


def _api_probe_rank(rank: int, world: int, port: int, cfg: str, q) -> None:
    """An RL framework's rank: NCCL default group (monitor safe), a Refitter; rank 3 stalls mid-transfer
    past the timeout once; then, after twice the heartbeat timeout, every rank is alive and its default
    group works, and the next refit (rebuilt groups) commits."""
    import os
    import time

    import torch.distributed as dist

    from reshardctl import api
    from reshardctl.errors import ReshardError
    from reshardctl.runtime.synthetic_weights import synthetic_region

    try:
        os.environ.update({"TORCH_NCCL_DUMP_ON_TIMEOUT": "0", "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "5"})
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                device_id=torch.device("cuda", rank))
        plan = api.plan_refit(model=cfg, train="tp=2", infer="tp=2")
        by_name = {t.name: t for t in plan.model.tensors}
        refitter = api.Refitter(plan, timeout_s=5)
        if rank == 3:
            done = []

            def tap(at, buf, n):
                if at == 1 and not done:
                    done.append(at)
                    time.sleep(15)
            refitter.executor.tap = tap
        holdings = refitter.holdings()
        local = {n: [synthetic_region(by_name[n], b, 1).cuda() for b in boxes] for n, boxes in holdings.items()}
        outcomes = []
        for step in (1, 2):
            try:
                if rank < plan.train_world:
                    refitter.refit(step, local_src=local)
                else:
                    refitter.refit(step, local_dst=local)
                outcomes.append(True)
            except ReshardError as exc:
                outcomes.append(type(exc).__name__)
            if step == 1:
                time.sleep(12)  # > 2 heartbeat timeouts: a monitor that reacted would have killed us by now
                probe = torch.ones(1, device="cuda")
                dist.all_reduce(probe)
                outcomes.append(int(probe.item()))
        refitter.close()
        dist.destroy_process_group()
        q.put((rank, outcomes, None))
    except BaseException as exc:  # noqa: BLE001
        q.put((rank, None, repr(exc)))


@pytest.mark.gpus(4)
def test_api_rank_stalled_mid_transfer_every_rank_lives_and_its_default_group_works(tmp_path):
    from helpers.small_llama import SMALL_LLAMA
    from helpers.spawned_ranks import run_ranks
    cfg = tmp_path / "small" / "config.json"
    cfg.parent.mkdir()
    cfg.write_text(json.dumps(SMALL_LLAMA))
    res = run_ranks(_api_probe_rank, 4, lambda r, port, q: (r, 4, port, str(cfg), q), timeout_s=300)
    for rank, outcomes in res.items():
        assert outcomes[0] != True and outcomes[1] == 4 and outcomes[2] is True, (rank, outcomes)  # noqa: E712


def _producer_rank(rank: int, world: int, port: int, cfg: str, q) -> None:
    """Trainer weights written on a producer stream behind a 50 ms device sleep; ``producer=`` orders
    the refit after it: the inference ranks get exactly those bytes."""
    import os

    import torch.distributed as dist

    from reshardctl import api
    from reshardctl.runtime.synthetic_weights import synthetic_region

    try:
        os.environ["TORCH_NCCL_DUMP_ON_TIMEOUT"] = "0"
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                device_id=torch.device("cuda", rank))
        plan = api.plan_refit(model=cfg, train="tp=2", infer="tp=2")
        by_name = {t.name: t for t in plan.model.tensors}
        refitter = api.Refitter(plan, timeout_s=30)
        holdings = refitter.holdings()
        local = {n: [torch.zeros_like(synthetic_region(by_name[n], b, 0)).cuda() for b in boxes]
                 for n, boxes in holdings.items()}
        producer = torch.cuda.Stream()
        if rank < plan.train_world:
            with torch.cuda.stream(producer):
                torch.cuda._sleep(50_000_000)  # ~50 ms of device time before the weights are written
                for n, boxes in holdings.items():
                    for b, t in zip(boxes, local[n]):
                        t.copy_(synthetic_region(by_name[n], b, 1).cuda(non_blocking=False))
            refitter.refit(1, local_src=local, producer=producer)
            ok = True
        else:
            refitter.refit(1, local_dst=local, producer=producer)
            ok = all(torch.equal(t.cpu().view(torch.uint8), synthetic_region(by_name[n], b, 1).view(torch.uint8))
                     for n, boxes in holdings.items() for b, t in zip(boxes, local[n]))
        refitter.close()
        dist.destroy_process_group()
        q.put((rank, ok, None))
    except BaseException as exc:  # noqa: BLE001
        q.put((rank, None, repr(exc)))


@pytest.mark.gpus(4)
def test_api_producer_stream_orders_the_refit_after_the_callers_writes(tmp_path):
    from helpers.small_llama import SMALL_LLAMA
    from helpers.spawned_ranks import run_ranks
    cfg = tmp_path / "small" / "config.json"
    cfg.parent.mkdir()
    cfg.write_text(json.dumps(SMALL_LLAMA))
    res = run_ranks(_producer_rank, 4, lambda r, port, q: (r, 4, port, str(cfg), q), timeout_s=300)
    assert all(res.values()), res


class SyncCounter:
    """Counts the host's waits on the device while installed: torch.cuda has no counter, so the sync
    points reshardctl uses (``Event.synchronize``, ``Stream.synchronize``, ``torch.cuda.synchronize``)
    and the device-to-host reads (``Tensor.cpu``, ``.item``, ``.tolist`` of a CUDA tensor) are wrapped."""

    def __init__(self):
        self.n = 0
        self._saved = []

    def _wrap(self, owner, name, counts=lambda *a, **k: True):
        orig = getattr(owner, name)

        def wrapper(*a, **k):
            if counts(*a, **k):
                self.n += 1
            return orig(*a, **k)

        self._saved.append((owner, name, orig))
        setattr(owner, name, wrapper)

    def __enter__(self):
        on_device = lambda t, *a, **k: t.is_cuda  # noqa: E731
        self._wrap(torch.cuda.Event, "synchronize")
        self._wrap(torch.cuda.Stream, "synchronize")
        self._wrap(torch.cuda, "synchronize")
        for name in ("cpu", "item", "tolist"):
            self._wrap(torch.Tensor, name, on_device)
        return self

    def __exit__(self, *exc):
        for owner, name, orig in reversed(self._saved):
            setattr(owner, name, orig)


def _stream_order_rank(rank: int, world: int, port: int, cfg: str, refits: int, q) -> None:
    """API ranks, ``refits`` refits in a row with a small bucket (many steps per refit, so staging blocks
    are reused from step to step and refit to refit), while a busy side stream keeps the device loaded
    and the trainer writes each refit's weights on a producer stream behind a device sleep. Reports
    whether every refit delivered exactly its own bytes, the host syncs per refit and the steps."""
    import os

    import torch.distributed as dist

    from reshardctl import api
    from reshardctl.runtime.synthetic_weights import synthetic_region

    try:
        os.environ["TORCH_NCCL_DUMP_ON_TIMEOUT"] = "0"
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                device_id=torch.device("cuda", rank))
        plan = api.plan_refit(model=cfg, train="tp=2", infer="tp=2", bucket_mb=0.25)
        by_name = {t.name: t for t in plan.model.tensors}
        refitter = api.Refitter(plan, timeout_s=60)
        holdings = refitter.holdings()
        local = {n: [torch.zeros_like(synthetic_region(by_name[n], b, 0)).cuda() for b in boxes]
                 for n, boxes in holdings.items()}
        producer, busy = torch.cuda.Stream(), torch.cuda.Stream()
        x = torch.randn(2048, 2048, device="cuda")
        ok, syncs = True, []
        for step in range(1, refits + 1):
            with torch.cuda.stream(busy):  # load the device: the side stream's kernels run late
                for _ in range(8):
                    x = (x @ x).tanh_()
            if rank < plan.train_world:
                with torch.cuda.stream(producer):
                    torch.cuda._sleep(20_000_000)  # the producer still writing when the refit is called
                    for n, boxes in holdings.items():
                        for b, t in zip(boxes, local[n]):
                            t.copy_(synthetic_region(by_name[n], b, step).pin_memory(), non_blocking=True)
                with SyncCounter() as c:
                    refitter.refit(step, local_src=local, producer=producer)
            else:
                with SyncCounter() as c:
                    refitter.refit(step, local_dst=local, producer=producer)
                ok = ok and all(
                    torch.equal(t.cpu().view(torch.uint8), synthetic_region(by_name[n], b, step).view(torch.uint8))
                    for n, boxes in holdings.items() for b, t in zip(boxes, local[n]))
            syncs.append(c.n)
        steps = len(refitter.executor.program.steps)
        refitter.close()
        dist.destroy_process_group()
        q.put((rank, (ok, syncs, steps), None))
    except BaseException as exc:  # noqa: BLE001
        q.put((rank, None, repr(exc)))


@pytest.mark.gpus(4)
def test_stream_ordered_refits_deliver_exact_bytes_under_a_busy_device_with_few_host_syncs(tmp_path):
    """A missing event wait (the pack reading before the producer wrote, a staging block reused while the
    previous step's unpack still reads it, an unpack before the bytes landed) shows as wrong bytes in
    some refit under load; the host syncs per refit stay a constant, not one per step (docs/gpu.md,
    "Stream discipline")."""
    from helpers.small_llama import SMALL_LLAMA
    from helpers.spawned_ranks import run_ranks
    cfg = tmp_path / "small" / "config.json"
    cfg.parent.mkdir()
    cfg.write_text(json.dumps(SMALL_LLAMA))
    res = run_ranks(_stream_order_rank, 4, lambda r, port, q: (r, 4, port, str(cfg), 20, q), timeout_s=400)
    for rank, (ok, syncs, steps) in res.items():
        assert ok, (rank, syncs)
        assert steps >= 8, (rank, steps)  # enough steps that one sync per step would show
        assert max(syncs[1:]) < steps, (rank, syncs, steps)

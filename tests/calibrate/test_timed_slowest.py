"""The aggregate microbenchmark's timing: each repetition is the slowest rank's (the last receiver), not
rank 0's own part (a sender whose wait ends when its bytes are queued)."""

from __future__ import annotations

import time

from helpers.spawned_ranks import run_ranks

LAG_S = 0.05


def _rank(rank: int, port: int, q) -> None:
    try:
        import torch.distributed as dist

        from reshardctl.calibrate.microbench import _timed, _timed_slowest

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)

        def fn() -> None:  # rank 1's part takes LAG_S longer than rank 0's
            if rank == 1:
                time.sleep(LAG_S)

        own, slowest = _timed(fn, 3), _timed_slowest(fn, 3)
        dist.destroy_process_group()
        q.put((rank, (own, slowest), None))
    except BaseException as exc:  # noqa: BLE001
        q.put((rank, None, repr(exc)))


def test_every_rank_reports_the_slowest_ranks_time():
    got = run_ranks(_rank, 2, lambda r, port, q: (r, port, q), timeout_s=120)
    own0, slowest0 = got[0]
    own1, slowest1 = got[1]
    assert own0 < LAG_S <= own1  # rank 0 alone would not see rank 1's lag
    assert slowest0 == slowest1 >= LAG_S  # both see the slowest rank's time, the same value

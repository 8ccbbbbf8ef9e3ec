"""The time-limit signal (runtime/time_limit.py) in real worker processes: a SIGUSR1 sent to ONE rank
stops every rank before the same refit, with consistent inference weights. (On Slurm every rank gets
it, tests/launch/test_slurm_resources.py; one rank is the hard case: the others never saw a signal.)"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from reshardctl.launch.ports import free_port
from reshardctl.runtime.contract import RunOptions
from reshardctl.runtime.session_file import write_session

from helpers.runtime_plans import p2p_plan, rows_cols_case


def _commits(run_dir: Path) -> int:
    ev = run_dir / "events"
    return sum(f.read_text().count('"phase":"commit"') for f in ev.glob("rank-*.jsonl")) if ev.is_dir() else 0


def test_a_signal_to_one_rank_stops_every_rank_at_one_refit_boundary(tmp_path):
    m, src, dst = rows_cols_case()
    plan = p2p_plan(m, src, dst)
    options = RunOptions(run_dir=str(tmp_path), iterations=100000, timeout_s=15.0, device="cpu")
    session = write_session(tmp_path / "session.pkl", {"plan": plan}, options, warmup=0)
    port = free_port()
    path = os.pathsep.join([str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")])
    procs = [subprocess.Popen([sys.executable, "-m", "reshardctl.runtime.worker", "--session", str(session)],
                              env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path, "RANK": str(r),
                                   "WORLD_SIZE": "4", "LOCAL_RANK": str(r), "MASTER_ADDR": "127.0.0.1",
                                   "MASTER_PORT": str(port), "RESHARDCTL_STOP_SIGNAL": "USR1"},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for r in range(4)]
    try:
        while _commits(tmp_path) < 6:  # a few refits committed: every rank armed its handler long ago
            assert all(p.poll() is None for p in procs), [p.communicate()[0].decode()[-2000:] for p in procs]
            time.sleep(0.2)
        procs[1].send_signal(signal.SIGUSR1)  # a trainer rank only
        outs = [p.communicate(timeout=120)[0].decode() for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [1] * 4, outs  # each ended itself: none killed by the signal
    reports = [json.loads((tmp_path / "reports" / f"rank-{r}.json").read_text())["plan"] for r in range(4)]
    assert {r["error_type"] for r in reports} == {"TimeLimitStop"}, outs
    assert all("reached rank(s) 1 " in r["error_message"] for r in reports)
    steps = {int(re.search(r"before refit step (\d+)", r["error_message"]).group(1)) for r in reports}
    committed = {reports[2]["committed_step"], reports[3]["committed_step"]}
    assert len(steps) == 1 and len(committed) == 1 and steps == {committed.pop() + 1}

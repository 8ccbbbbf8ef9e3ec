"""A small real week on one site for the report tests: a bench (three transports), a promote refused on a
tight budget, a forced promote, a rollback --verify (a real gather_broadcast validation run), and an API
refit's events_dir (a 4-rank gloo world through ``Refitter(events_dir=...)``), all with a tiny llama."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from reshardctl import api
from reshardctl.cli import main
from reshardctl.runtime.synthetic_weights import synthetic_region

from helpers.runbook_helpers import site_profile
from helpers.small_llama import SMALL_LLAMA
from helpers.spawned_ranks import run_ranks

LAYOUT = ["--train", "tp=2", "--infer", "tp=2"]
API_STEPS = (1, 2, 3)


@dataclass(frozen=True)
class Week:
    base: Path
    site: str  # the profile file (budget 60 s) the week ran on
    tight: str  # the same site (same ledger) with a 1 us budget
    state: Path  # its state dir: state/local.ledger.jsonl
    config: str  # the model's config.json
    bench: Path
    rollback: Path  # the rollback's validation run
    api: Path  # the API refits' events_dir
    promoted: str  # the transport promoted (forced)


def _api_rank(rank: int, world: int, port: int, cfg: str, events: str, q) -> None:
    """An RL framework's rank: three refits through ``Refitter(events_dir=...)``."""
    try:
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        plan = api.plan_refit(model=cfg, train="tp=2", infer="tp=2")
        by_name = {t.name: t for t in plan.model.tensors}
        refitter = api.Refitter(plan, events_dir=events, timeout_s=60)
        holdings = refitter.holdings()
        for step in API_STEPS:
            local = {n: [synthetic_region(by_name[n], b, step if rank < plan.train_world else 0) for b in boxes]
                     for n, boxes in holdings.items()}
            refitter.refit(step, **({"local_src": local} if rank < plan.train_world else {"local_dst": local}))
        refitter.close()
        dist.destroy_process_group()
        q.put((rank, True, None))
    except BaseException as exc:  # noqa: BLE001
        q.put((rank, None, repr(exc)))


def api_events(base: Path, config: str) -> Path:
    events = base / "api-refits"
    run_ranks(_api_rank, 4, lambda r, port, q: (r, 4, port, config, str(events), q), timeout_s=600)
    return events


def make_week(base: Path) -> Week:
    (base / "small").mkdir()
    config = base / "small" / "config.json"
    config.write_text(json.dumps(SMALL_LLAMA))
    state = base / "state"
    site = site_profile(base, "roomy", budget_s=60, state_dir=state)
    tight = site_profile(base, "tight", budget_s=1e-6, state_dir=state)
    bench, rb, promoted = base / "bench", base / "rollback-check", "hybrid"
    with pytest.MonkeyPatch.context() as mp:  # no test reads the user's calibrations or ledgers
        mp.setenv("XDG_STATE_HOME", str(base / "xdg"))
        mp.delenv("RESHARDCTL_SITE", raising=False)
        assert main(["bench", "--site", site, "--model", str(config), *LAYOUT, "--iters", "3", "--out", str(bench),
                     "--json"]) == 0
        assert main(["promote", "--site", tight, "--run", str(bench), "--transport", promoted]) == 1  # refused
        assert main(["promote", "--site", site, "--run", str(bench), "--transport", promoted, "--force",
                     "--reason", "report drill"]) == 0
        assert main(["rollback", "--site", site, "--verify", "--reason", "p90 drill", "--iters", "2",
                     "--out", str(rb)]) == 0
    return Week(base, site, tight, state, str(config), bench, rb, api_events(base, str(config)), promoted)

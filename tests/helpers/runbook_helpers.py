"""Helpers of the runbook tests: profile copies of the local site with their own budget and ledger."""

from __future__ import annotations

import json
from pathlib import Path

import yaml


def site_profile(tmp_path: Path, name: str, *, budget_s: float, state_dir: Path, site: str = "local",
                 bucket_mb: float = 64) -> str:
    """A copy of the shipped local profile (same nodes and links) with ``budget_s`` and ``state_dir``."""
    data = {
        "site": site, "nodes": ["local-train", "local-infer"], "gpus_per_node": 4, "nvlink_domain_nodes": 1,
        "cpu_only": True,
        "links": {"nvlink_gbytes_per_s": 7, "nic_gbits_per_s": 48, "nics_per_node": 1, "nvlink_latency_us": 50,
                  "nic_latency_us": 50},
        "refit": {"transport": "gather_broadcast", "latency_budget_s": budget_s, "bucket_mb": bucket_mb,
                  "timeout_s": 120, "rendezvous_timeout_s": 60},
        "state_dir": str(state_dir),
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def ledger_lines(state_dir: Path, site: str = "local") -> list[dict]:
    f = state_dir / f"{site}.ledger.jsonl"
    return [json.loads(line) for line in f.read_text().splitlines()] if f.exists() else []


def api_settings(site: str) -> dict:
    """The NeMo RL settings of a job that refits through reshardctl.api (``RESHARDCTL_SITE``: ``site``)."""
    env = {"env_vars": {"RESHARDCTL_SITE": site}}
    return {"policy": {"megatron_cfg": env, "generation": {"colocated": {"enabled": False}, "refit_transport": None,
                                                           "vllm_cfg": env}}}

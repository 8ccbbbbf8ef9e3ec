"""The rank runtime: environment, process groups, executors, checksums, commit protocol, events.

The core entry is ``reshardctl.runtime.worker.run_rank_session(env, plans, options) -> {name: RankReport}``.
"""

from reshardctl.runtime.contract import ExecutablePlan, IterationReport, RankReport, RunOptions, StaticPlan
from reshardctl.runtime.env import RankEnv, make_rank_env, read_rank_env

__all__ = [
    "ExecutablePlan",
    "IterationReport",
    "RankEnv",
    "RankReport",
    "RunOptions",
    "StaticPlan",
    "make_rank_env",
    "read_rank_env",
]

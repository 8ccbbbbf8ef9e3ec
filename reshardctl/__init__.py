"""reshardctl: plan, run, verify and roll back RL weight refits on HPC clusters."""

__version__ = "0.1.0"

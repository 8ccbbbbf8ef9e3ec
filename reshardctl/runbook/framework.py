"""The RL framework settings that match a site's active refit transport.

NeMo RL selects its refit transport with one key, ``policy.generation.refit_transport``
(NVIDIA-NeMo/RL ``docs/guides/refit.md``, ``docs/design-docs/nccl-reshard-refit.md``, and the default
``refit_transport: null`` of ``examples/configs/grpo_math_1B.yaml``):

* ``null`` with ``policy.generation.colocated.enabled: false`` is the NCCL broadcast of full tensors:
  reshardctl's ``gather_broadcast``.
* ``nccl_reshard`` is the shard-to-shard reshard. It is non-colocated only and needs the Megatron
  policy backend (``policy.megatron_cfg.enabled: true``), the vLLM generation backend, Megatron ETP 1,
  no generation-side PP, and matching precision (BF16 <-> BF16, blockwise FP8 <-> FP8). It reshards the
  FFN / expert weights and broadcasts the rest: the same split as reshardctl's ``hybrid``, and the
  nearest NeMo RL has to ``reshard`` (which reshards every tensor).

The setting is only meaningful with non-colocated generation: colocated generation refits through CUDA
IPC and ignores the transport (NeMo RL rejects ``nccl_reshard`` when colocated).
"""

from __future__ import annotations

NEMO_RL_TRANSPORT = {"reshard": "nccl_reshard", "hybrid": "nccl_reshard", "gather_broadcast": None}

_CONDITIONS = {
    "nccl_reshard": [
        "non-colocated generation: policy.generation.colocated.enabled=false (colocated refits use CUDA IPC)",
        "Megatron policy backend: policy.megatron_cfg.enabled=true",
        "vLLM generation backend: policy.generation.backend=vllm",
        "Megatron expert_tensor_parallel_size (ETP) = 1; no generation-side pipeline parallelism",
        "matching precision: BF16 train <-> BF16 generation, or blockwise FP8 <-> vllm_cfg.precision=fp8",
    ],
    None: [
        "non-colocated generation: policy.generation.colocated.enabled=false (NCCL broadcast of full tensors)",
    ],
}


def nemo_rl_settings(transport: str, *, site: str, origin: str) -> str:
    """A YAML fragment to merge into a NeMo RL config, with the conditions as comments."""
    value = NEMO_RL_TRANSPORT[transport]
    shown = "null" if value is None else value
    note = {
        "reshard": "NeMo RL's nccl_reshard reshards FFN/expert weights and broadcasts the rest (reshardctl's "
                   "hybrid split); it is NeMo RL's nearest setting to reshard",
        "hybrid": "NeMo RL's nccl_reshard reshards FFN/expert weights and broadcasts the rest, as hybrid does",
        "gather_broadcast": "null with non-colocated generation is NeMo RL's NCCL broadcast (the rollback baseline)",
    }[transport]
    lines = [
        f"# reshardctl: site {site}, active refit transport {transport} ({origin})",
        f"# NeMo RL: policy.generation.refit_transport = {shown}. {note}.",
        "# Requires:",
        *(f"#   - {c}" for c in _CONDITIONS[value]),
        f"# Command-line form: policy.generation.colocated.enabled=false policy.generation.refit_transport={shown}",
        "policy:",
        "  generation:",
        "    colocated:",
        "      enabled: false",
        f"    refit_transport: {shown}",
    ]
    return "\n".join(lines) + "\n"

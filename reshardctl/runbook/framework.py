"""The RL framework settings that make a job refit with a site's active transport, as it was measured.

NeMo RL (NVIDIA-NeMo/RL at 7ea279ab) selects its refit with one key, ``policy.generation.refit_transport``
(``docs/guides/refit.md:9-14``; default ``null``, ``examples/configs/grpo_math_1B.yaml:382``):

* ``null`` with ``policy.generation.colocated.enabled: false`` is NeMo RL's NCCL broadcast of full tensors
  (``docs/guides/refit.md:12``): reshardctl's ``gather_broadcast``.
* ``nccl_reshard`` (``docs/guides/refit.md:13``, ``docs/design-docs/nccl-reshard-refit.md:56-79``) reshards
  the expert projections shard to shard and broadcasts everything else (dense MLP, shared experts and MTP
  included, ``nccl-reshard-refit.md:63-76``): the nearest NeMo RL has to reshardctl's ``hybrid``. It needs
  non-colocated generation, the Megatron policy and vLLM generation backends, Megatron ETP 1, no custom
  PP layout or virtual PP, no generation-side PP, matching precision (``nccl-reshard-refit.md:24-47``).
* No value runs ``reshard`` (every tensor resharded): ``nccl_reshard`` is the hybrid split, so promoting
  ``reshard`` never emits it (what the job would run is not what was measured).

``nccl_reshard`` reshards only routed experts today (``(experts).N.{gate,up,down}_proj``,
``nccl-reshard-refit.md:66``; vLLM EP only with ``expert_parallel_size == tensor_parallel_size``, ``:42-43``):
on a dense model it broadcasts every tensor. So only a measured ``hybrid`` of a MoE model whose layouts
meet those conditions maps to ``nccl_reshard``; any other hybrid gets the reshardctl.api settings, with
the reasons as comments. For ``reshard`` (and as the alternative for every
transport) the settings make the job refit through ``reshardctl.api``: the policy and generation workers
call ``api.Refitter(..., site=os.environ["RESHARDCTL_SITE"])`` in their refit
(docs/api.md), and the site's ledger decides at each refit, so a later ``promote`` or ``rollback`` takes
effect at the job's next refit with no config change. ``RESHARDCTL_SITE`` reaches the workers through
NeMo RL's ``policy.megatron_cfg.env_vars`` (``nemo_rl/models/policy/__init__.py:331``) and
``policy.generation.vllm_cfg.env_vars`` (``nemo_rl/models/generation/vllm/config.py:92-95``, forwarded to
every vLLM worker: ``vllm_generation.py:213-218``); ``refit_transport`` stays ``null`` there (never
``nccl_reshard``, whose own hybrid path would run instead).

Colocated generation refits through CUDA IPC and ignores the transport (NeMo RL rejects ``nccl_reshard``
when colocated), so every fragment sets ``colocated.enabled: false``. NeMo RL has no non-colocated
generation but vLLM's among the inference layouts reshardctl measures (``docs/guides/refit.md:33``:
non-colocated SGLang is not supported), so a run measured on another inference layout gets no settings:
``nemo_rl_settings`` refuses (``InputError``, exit 2) and says why.
"""

from __future__ import annotations

import re

from reshardctl.errors import InputError

REFITTER_CALL = ('api.Refitter(plan, binding=..., update_group=..., '
                 'site=os.environ["RESHARDCTL_SITE"])')

_NCCL_RESHARD = [
    "non-colocated generation: policy.generation.colocated.enabled=false (colocated refits use CUDA IPC)",
    "Megatron policy backend: policy.megatron_cfg.enabled=true",
    "vLLM generation backend: policy.generation.backend=vllm",
    "Megatron expert_tensor_parallel_size (ETP) = 1; no custom or virtual PP; no generation-side pipeline parallelism",
    "matching precision: BF16 train <-> BF16 generation, or blockwise FP8 <-> vllm_cfg.precision=fp8",
]


def _int(desc: str, key: str) -> int | None:
    m = re.search(rf"\b{key}=(\d+)", desc)
    return None if m is None else int(m[1])


def nemo_rl_refusal(infer: str | None) -> str | None:
    """Why NeMo RL cannot refit onto the measured inference layout at all (its ``describe()`` string, as a
    run's summary.json records it), or None. Unknown (None): no refusal."""
    if infer and not infer.startswith("vllm "):
        return (f"NeMo RL refits non-colocated generation only for vLLM (docs/guides/refit.md: non-colocated "
                f"SGLang is not supported); the run measured the inference layout {infer!r}")
    return None


def nccl_reshard_gaps(train: str | None, infer: str | None) -> list[str]:
    """Why NeMo RL's ``nccl_reshard`` would not run the hybrid measured on these layouts; [] when it would."""
    train, infer = train or "", infer or ""
    out = []
    if not train.startswith("megatron "):
        out.append(f"nccl_reshard needs the Megatron policy backend; the run's trainer layout is {train!r}")
    if "expert_parallel=" not in infer:
        out.append("nccl_reshard reshards only routed experts and the run's model has none: NeMo RL would "
                   "broadcast every tensor (gather_broadcast), not the hybrid split measured")
    for desc, key, what in ((train, "etp", "Megatron ETP"), (infer, "pp", "generation-side PP"),
                            (train, "vpp", "virtual PP")):
        n = _int(desc, key)
        if n is not None and n != 1:
            out.append(f"nccl_reshard needs {what} = 1; the run has {key}={n}")
    if "pp_layout=" in train:
        out.append("nccl_reshard does not support a custom pipeline layout; the run's trainer layout has pp_layout")
    ep, tp = _int(infer, "ep"), _int(infer, "tp")
    if "expert_parallel=on" in infer and ep != tp:
        out.append(f"nccl_reshard needs vLLM expert_parallel_size = tensor_parallel_size; the run has ep={ep}, tp={tp}")
    return out


def nemo_rl_settings(transport: str, *, site: str, origin: str, train: str | None = None,
                     infer: str | None = None) -> str:
    """A YAML fragment to merge into a NeMo RL config, with what it needs as comments. ``site``: how the
    job's workers name the site (``RESHARDCTL_SITE``: a profile name or an absolute profile path);
    ``train``/``infer``: the measured run's layouts (None: not known, e.g. a rollback without --verify).
    ``InputError`` when NeMo RL cannot run the measured layouts at all (``nemo_rl_refusal``)."""
    if transport not in ("reshard", "hybrid", "gather_broadcast"):
        raise InputError(f"no framework settings for transport {transport!r}")
    why = nemo_rl_refusal(infer)
    if why:
        raise InputError(f"no NeMo RL settings for {transport} on site {site}: {why}",
                         hint="a job of another framework refits through reshardctl.api (docs/api.md)")
    head = [f"# reshardctl: site {site}, active refit transport {transport} ({origin})"]
    gen = ["  generation:", "    colocated:", "      enabled: false"]
    api_yaml = ["policy:", "  megatron_cfg:", "    env_vars:", f"      RESHARDCTL_SITE: {site}", *gen,
                "    refit_transport: null", "    vllm_cfg:", "      env_vars:", f"        RESHARDCTL_SITE: {site}"]
    api_comments = [
        "# A job that refits through reshardctl.api (docs/api.md): its policy and vLLM workers call",
        f"#   {REFITTER_CALL}",
        "# in their refit; the site's ledger decides before every refit, so a later promote or rollback takes",
        "# effect at the job's next refit without a restart. RESHARDCTL_SITE reaches the workers through the",
        "# env_vars below; refit_transport stays null (never nccl_reshard, which would run NeMo RL's own split).",
        "# Without that refit call NeMo RL refits by its own NCCL broadcast: gather_broadcast.",
        f"# Command-line form: policy.generation.colocated.enabled=false policy.generation.refit_transport=null "
        f"++policy.megatron_cfg.env_vars.RESHARDCTL_SITE={site} "
        f"++policy.generation.vllm_cfg.env_vars.RESHARDCTL_SITE={site}",
    ]
    if transport == "gather_broadcast":
        lines = head + ["# NeMo RL: policy.generation.refit_transport = null with non-colocated generation is NeMo "
                        "RL's NCCL broadcast of full tensors, gather_broadcast (the rollback baseline)."]
        return "\n".join(lines + api_comments + api_yaml) + "\n"
    gaps = nccl_reshard_gaps(train, infer) if transport == "hybrid" else []
    if transport == "hybrid" and not gaps:
        lines = head + [
            "# NeMo RL: policy.generation.refit_transport = nccl_reshard: NeMo RL reshards the routed-expert weights "
            "and broadcasts the rest, the hybrid split (it broadcasts dense-MLP, shared-expert and MTP weights, "
            "which hybrid reshards).",
            "# Requires:", *(f"#   - {c}" for c in _NCCL_RESHARD),
            "# Command-line form: policy.generation.colocated.enabled=false "
            "policy.generation.refit_transport=nccl_reshard",
            "policy:", *gen, "    refit_transport: nccl_reshard",
        ]
        return "\n".join(lines) + "\n"
    if transport == "reshard":
        lines = head + ["# NeMo RL has no refit_transport that runs reshard (every tensor resharded): its "
                        "nccl_reshard is the hybrid split, so it is not set here (the job would not run what was "
                        "measured)."]
    else:
        lines = head + ["# NeMo RL's nccl_reshard is not set: it would not run the hybrid measured here:",
                        *(f"#   - {g}" for g in gaps)]
    return "\n".join(lines + api_comments + api_yaml) + "\n"

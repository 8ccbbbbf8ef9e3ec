"""A NeMo RL config (GRPO-style YAML with ``defaults:`` inheritance) -> a ``Deployment``.

Read from NVIDIA-NeMo/RL at commit 7ea279abfbeb698b092856d0dab61e7cf39bc909 (2026-08-22):

* inheritance: ``nemo_rl/utils/config.py`` ``load_config_with_inheritance`` (``request/config_tree.py``);
* pools: ``nemo_rl/algorithms/grpo.py`` ``setup``: with ``policy.generation.colocated.enabled: false``,
  one node (``cluster.num_nodes == 1``): inference gets ``colocated.resources.gpus_per_node`` GPUs and the
  trainer the rest of the node; several nodes: inference gets ``colocated.resources.num_nodes`` whole nodes
  (its ``gpus_per_node`` must equal ``cluster.gpus_per_node``), the trainer the other nodes;
* vLLM: ``nemo_rl/models/generation/vllm/vllm_generation.py``: ``dp_size = world // (tp * pp)``,
  ``vllm_dp_size = ep // tp`` and in-engine DP (``VLLM_DP_SIZE``) only when ``ep > tp``; ``ep`` must be a
  multiple of ``tp``; ``vllm_worker.py``: ``enable_expert_parallel = ep > 1``. So ``ep <= tp`` is one vLLM
  engine per replica (``dp_mode=engines``; EP, when on, is ``tp`` inside each engine) and ``ep > tp`` is
  in-engine DP over ``ep // tp`` replicas (``dp_mode=in_engine``), ``world // (pp * ep)`` such engines;
* trainer: Megatron (``policy.megatron_cfg``, through Megatron-Bridge: no vocabulary padding, reshardctl's
  default) ``dp = world // (tp * cp * pp)``; DTensor (``policy.dtensor_cfg``) is FSDP2 over ``dp`` x TP.

Every leaf of the merged config is checked against ``RULES`` (``deployment.check_keys``).
"""

from __future__ import annotations

from pathlib import Path

from reshardctl.errors import InputError
from reshardctl.request.config_tree import ConfigTree, load_with_defaults
from reshardctl.request.deployment import (
    COLOCATED_WHY, READ, Deployment, Rule, Source, check_keys, ignore, only, positive_int,
)

FRAMEWORK = "NeMo RL"
COMMIT = "NVIDIA-NeMo/RL 7ea279ab"

_COMPUTE = "compute only (kernels, fusions, recomputation, memory, numerics): the weights' split is unchanged"
_BATCH = "batching and sequence lengths: not the weights"
_OPTIM = "optimizer, scheduler, gradients and checkpoints: not the weights' placement"
_SAMPLING = "sampling and serving settings: not the weights"
_REFIT = "how NeMo RL itself moves the weights, which a reshardctl refit replaces"
_NOT_POLICY = "not the policy's weights or their placement"

RULES: list[Rule] = [
    # what the derivation reads
    *[(k, READ) for k in (
        "policy.model_name",
        "policy.megatron_cfg.enabled", "policy.megatron_cfg.tensor_model_parallel_size",
        "policy.megatron_cfg.pipeline_model_parallel_size", "policy.megatron_cfg.expert_model_parallel_size",
        "policy.megatron_cfg.expert_tensor_parallel_size", "policy.megatron_cfg.context_parallel_size",
        "policy.megatron_cfg.num_layers_in_first_pipeline_stage",
        "policy.megatron_cfg.num_layers_in_last_pipeline_stage",
        "policy.megatron_cfg.virtual_pipeline_model_parallel_size",
        "policy.dtensor_cfg.enabled", "policy.dtensor_cfg.tensor_parallel_size",
        "policy.dtensor_cfg.context_parallel_size",
        "policy.generation.colocated.enabled", "policy.generation.colocated.resources.gpus_per_node",
        "policy.generation.colocated.resources.num_nodes",
        "policy.generation.vllm_cfg.tensor_parallel_size", "policy.generation.vllm_cfg.pipeline_parallel_size",
        "policy.generation.vllm_cfg.expert_parallel_size",
        "cluster.gpus_per_node", "cluster.num_nodes")],
    # accepted at one value only
    ("policy.generation.backend", only(("vllm",), "--from reads vLLM generation (policy.generation.vllm_cfg) only")),
    ("policy.precision", only(("bfloat16",), "the exchanged tensors are the checkpoint's bf16 tensors")),
    ("policy.generation.vllm_cfg.precision", only(("bfloat16",),
                                                  "vLLM quantizing on load (fp8) changes the inference tensors")),
    ("policy.hf_config_overrides", only(({},), "overrides of the model's config.json change its tensors")),
    ("policy.megatron_cfg.model_overrides", only(({},), "overrides of the Megatron model change its tensors")),
    ("policy.megatron_cfg.peft.enabled", only((False,), "LoRA adapters are refitted as adapters, not modelled")),
    ("policy.dtensor_cfg.lora_cfg.enabled", only((False,), "LoRA adapters are refitted as adapters, not modelled")),
    ("policy.megatron_cfg.fp8_cfg.enabled", only((False,), "FP8 training (fp8 parameters) is not modelled")),
    ("policy.megatron_cfg.mtp_num_layers", only((0, None), "MTP layers: give --mtp and the plan by hand")),
    ("policy.megatron_cfg.distributed_data_parallel_config.use_custom_fsdp",
     only((False,), "Megatron FSDP shards the parameters over data parallel ranks, which is not modelled")),
    ("policy.dtensor_cfg.custom_parallel_plan", only((None,), "a custom TP plan is not modelled")),
    ("policy.dtensor_cfg.automodel_kwargs", only(({},), "Automodel options may change the parallel plan")),
    ("policy.draft.enabled", only((False,), "a draft model (Eagle) is a second model, not modelled")),
    ("policy.generation.vllm_kwargs", only(({},), "vLLM engine options may change the layout")),
    ("policy.generation.vllm_kwargs.moe_backend",
     only(("triton",), "other vLLM MoE backends shuffle the expert weights on load (NeMo RL's own note)")),
    ("policy.generation.vllm_kwargs.speculative_config*",
     only((None, {}), "speculative decoding (deepseek_mtp) puts the MTP layers into the engine: plan with --mtp by hand")),
    ("on_policy_distillation", only((None,), "non-colocated teachers take nodes from the policy (grpo.py setup)")),
    ("env.reward_model.*", only((None, False, {}), "a reward-model environment takes GPUs from the policy's "
                                "nodes (grpo.py setup), which --from does not model")),
    # ignored, with the reason
    *[(k, ignore(_COMPUTE)) for k in (
        "policy.megatron_cfg.sequence_parallel", "policy.megatron_cfg.pipeline_dtype",
        "policy.megatron_cfg.activation_checkpointing", "policy.megatron_cfg.recompute_*",
        "policy.megatron_cfg.cuda_graph_*", "policy.megatron_cfg.fine_grained_activation_offloading",
        "policy.megatron_cfg.offload_modules", "policy.megatron_cfg.apply_rope_fusion",
        "policy.megatron_cfg.bias_activation_fusion", "policy.megatron_cfg.defer_fp32_logits",
        "policy.megatron_cfg.use_gloo_process_groups", "policy.megatron_cfg.gradient_accumulation_fusion",
        "policy.megatron_cfg.use_fused_weighted_squared_relu", "policy.megatron_cfg.use_fused_linear_logprobs",
        "policy.megatron_cfg.fused_linear_logprobs_chunk_size", "policy.megatron_cfg.force_reconvert_from_hf",
        "policy.megatron_cfg.empty_unused_memory_level", "policy.megatron_cfg.mtp_*",
        "policy.megatron_cfg.freeze_moe_router", "policy.megatron_cfg.moe_*", "policy.megatron_cfg.env_vars*",
        "policy.megatron_cfg.peft.*", "policy.megatron_cfg.fp8_cfg.*",
        "policy.dtensor_cfg.sequence_parallel", "policy.dtensor_cfg.activation_checkpointing",
        "policy.dtensor_cfg.cpu_offload", "policy.dtensor_cfg._v2", "policy.dtensor_cfg.lora_cfg.*",
        "policy.draft.*", "policy.logprob_chunk_size", "policy.offload_optimizer_for_logprob")],
    *[(k, ignore(_OPTIM)) for k in (
        "policy.megatron_cfg.optimizer*", "policy.megatron_cfg.scheduler*",
        "policy.megatron_cfg.distributed_data_parallel_config.*", "policy.megatron_cfg.checkpoint.*",
        "policy.optimizer*", "policy.scheduler*", "policy.max_grad_norm")],
    *[(k, ignore(_BATCH)) for k in (
        "policy.train_global_batch_size", "policy.train_micro_batch_size", "policy.generation_batch_size",
        "policy.logprob_batch_size", "policy.max_total_sequence_length", "policy.make_sequence_length_divisible_by",
        "policy.dynamic_batching*", "policy.sequence_packing*")],
    ("policy.tokenizer*", ignore("the tokenizer: not the weights")),
    ("policy.hf_config_overrides.max_position_embeddings", ignore("the context length: no tensor shape depends on it")),
    ("policy.hf_config_overrides.router_aux_loss_coef", ignore("a loss coefficient: not the weights")),
    ("policy.megatron_cfg.attention_backend", ignore(_COMPUTE)),
    ("policy.generation.vllm_cfg.enable_expert_parallel",
     ignore("NeMo RL does not read it: vllm_worker.py sets enable_expert_parallel = expert_parallel_size > 1")),
    *[(k, ignore("vLLM compilation, attention kernels and caches: not the weights")) for k in (
        "policy.generation.vllm_kwargs.compilation_config.*", "policy.generation.vllm_kwargs.block_size",
        "policy.generation.vllm_kwargs.attention_backend", "policy.generation.vllm_kwargs.mamba_ssm_cache_dtype",
        "policy.generation.vllm_kwargs.enable_chunked_prefill", "policy.generation.vllm_cfg.http_server_*",
        "policy.generation.vllm_cfg.enable_prefix_caching", "policy.generation.vllm_cfg.expose_http_server")],
    *[(k, ignore(_SAMPLING)) for k in (
        "policy.generation.port_range_*", "policy.generation.max_new_tokens", "policy.generation.temperature",
        "policy.generation.top_p", "policy.generation.top_k", "policy.generation.val_*",
        "policy.generation.stop_*", "policy.generation.real_quant_export_cpu_offload",
        "policy.generation.vllm_cfg.async_engine", "policy.generation.vllm_cfg.kv_cache_dtype",
        "policy.generation.vllm_cfg.logprobs_mode", "policy.generation.vllm_cfg.gpu_memory_utilization",
        "policy.generation.vllm_cfg.max_model_len", "policy.generation.vllm_cfg.enforce_eager",
        "policy.generation.vllm_cfg.use_tqdm", "policy.generation.vllm_cfg.use_deep_gemm",
        "policy.generation.vllm_cfg.num_last_layers_in_bf16", "policy.generation.vllm_cfg.num_first_layers_in_bf16",
        "policy.generation.vllm_cfg.enable_vllm_metrics_logger",
        "policy.generation.vllm_cfg.vllm_metrics_logger_interval",
        "policy.generation.vllm_cfg.reset_encoder_cache_after_weight_update",
        "policy.generation.vllm_cfg.skip_tokenizer_init", "policy.generation.vllm_cfg.load_format")],
    *[(k, ignore(_REFIT)) for k in (
        "policy.generation.refit_transport", "policy.generation.refit_cfg*",
        "policy.generation.vllm_cfg.http_refit_*", "policy.generation.vllm_cfg.zmq_refit_*")],
    ("policy.generation.mcore_generation_config*", ignore("used by NeMo RL's megatron generation backend only")),
    *[(k, ignore("Ray placement ports and segments: reshardctl's site profile gives the nodes and NVLink domains"))
      for k in ("cluster.master_port_range_*", "cluster.segment_size")],
    *[(k + "*", ignore(_NOT_POLICY)) for k in (
        "grpo", "loss_fn", "checkpointing", "data", "logger", "reward_penalties", "data_plane", "env", "async_rl")],
]


def _bool(tree: ConfigTree, key: str, default: bool) -> bool:
    if not tree.has(key):
        return default
    value = tree.resolve(key)
    if not isinstance(value, bool):
        raise InputError(f"{tree.where(key)}: `{key}` must be true or false, got {value!r:.60}")
    return value


def _int(tree: ConfigTree, name: str, key: str, default: int | None = 1) -> tuple[int | None, str]:
    """(value, where) of an integer key; a missing or null key is NeMo RL's default."""
    if not tree.has(key) or tree.raw(key) is None:
        return default, f"default of NeMo RL: {key} = {default}"
    value = tree.resolve(key)
    positive_int(value, where=tree.where(key), key=key)
    return value, f"{tree.where(key)}: {key} = {value}"


def derive(path: str) -> Deployment:
    """The deployment of the NeMo RL config at ``path`` (InputError naming file and key otherwise)."""
    tree = load_with_defaults(path)
    label = Path(path).name
    other = [k for k in ("sft", "dpo", "distillation", "rm", "ppo") if k in tree.data and "grpo" not in tree.data]
    if other:
        raise InputError(f"{label}: a NeMo RL `{other[0]}` config: --from reads GRPO configs (a `grpo` section), "
                         "whose policy generates with a separate vLLM engine that a refit updates")
    ignored = check_keys(list(tree.leaves()), RULES, label=label, where=tree.where, resolve=tree.resolve,
                         framework=FRAMEWORK)
    sources: list[Source] = []

    def src(what: str, where: str) -> None:
        sources.append(Source(what, where))

    colocated = _bool(tree, "policy.generation.colocated.enabled", True)
    if colocated:
        origin = (f"set in {tree.where('policy.generation.colocated.enabled')}"
                  if tree.has("policy.generation.colocated.enabled") else "NeMo RL's default")
        raise InputError(f"{label}: `policy.generation.colocated.enabled` = {colocated!r} ({origin}): {COLOCATED_WHY}",
                         hint="for separate pools set policy.generation.colocated.enabled: false and "
                              "policy.generation.colocated.resources.{gpus_per_node, num_nodes} (docs/deployments.md)")
    # pools (grpo.py setup)
    gpn, w_gpn = _int(tree, label, "cluster.gpus_per_node")
    nodes, w_nodes = _int(tree, label, "cluster.num_nodes")
    r_gpn, w_rgpn = _int(tree, label, "policy.generation.colocated.resources.gpus_per_node", None)
    r_nodes, w_rnodes = _int(tree, label, "policy.generation.colocated.resources.num_nodes", None)
    if nodes == 1:
        if r_gpn is None or (r_nodes is not None and r_nodes != 1) or r_gpn >= gpn:
            raise InputError(f"{label}: one node (cluster.num_nodes = 1, gpus_per_node = {gpn}): "
                             f"policy.generation.colocated.resources must give gpus_per_node in 1..{gpn - 1} and "
                             f"num_nodes 1 or null, got gpus_per_node = {r_gpn}, num_nodes = {r_nodes} "
                             "(NeMo RL's grpo.py setup asserts the same)")
        infer_world, train_world = r_gpn, gpn - r_gpn
        src(f"inference GPUs = {infer_world}", w_rgpn)
        src(f"trainer GPUs = {gpn} - {r_gpn} = {train_world}", w_gpn)
    else:
        if r_nodes is None or r_nodes >= nodes or r_gpn != gpn:
            raise InputError(f"{label}: {nodes} nodes: policy.generation.colocated.resources must give num_nodes "
                             f"in 1..{nodes - 1} and gpus_per_node = cluster.gpus_per_node = {gpn}, got "
                             f"num_nodes = {r_nodes}, gpus_per_node = {r_gpn} (NeMo RL's grpo.py setup asserts the same)")
        infer_world, train_world = r_nodes * gpn, (nodes - r_nodes) * gpn
        src(f"inference GPUs = {r_nodes} nodes x {gpn} = {infer_world}", w_rnodes)
        src(f"trainer GPUs = ({nodes} - {r_nodes}) nodes x {gpn} = {train_world}", w_nodes)

    # trainer
    mcore = _bool(tree, "policy.megatron_cfg.enabled", False)
    dtensor = _bool(tree, "policy.dtensor_cfg.enabled", False)
    if mcore == dtensor:
        raise InputError(f"{label}: `policy.megatron_cfg.enabled` = {mcore} and `policy.dtensor_cfg.enabled` = "
                         f"{dtensor}: exactly one trainer backend must be enabled")
    layout_needed = None
    if mcore:
        m = "policy.megatron_cfg."
        tp, w = _int(tree, label, m + "tensor_model_parallel_size")
        src(f"tp={tp}", w)
        pp, w = _int(tree, label, m + "pipeline_model_parallel_size")
        src(f"pp={pp}", w)
        cp, w = _int(tree, label, m + "context_parallel_size")
        src(f"cp={cp}", w)
        ep, w = _int(tree, label, m + "expert_model_parallel_size")
        src(f"ep={ep}", w)
        etp, w = _int(tree, label, m + "expert_tensor_parallel_size")
        src(f"etp={etp}", w)
        vpp, w = _int(tree, label, m + "virtual_pipeline_model_parallel_size")
        if vpp != 1:
            src(f"vpp={vpp}", w)
        if train_world % (tp * cp * pp):
            raise InputError(f"{label}: trainer GPUs {train_world} not divisible by tp*cp*pp = {tp}*{cp}*{pp} = "
                             f"{tp * cp * pp} ({train_world}/{tp * cp * pp} = {train_world / (tp * cp * pp):.2f})")
        dp = train_world // (tp * cp * pp)
        src(f"dp={dp}", f"trainer GPUs {train_world} / (tp*cp*pp = {tp * cp * pp}) (Megatron's data parallel size)")
        parts = [f"tp={tp}", f"pp={pp}", f"cp={cp}", f"ep={ep}", f"etp={etp}", f"dp={dp}"]
        if vpp != 1:
            parts.append(f"vpp={vpp}")
        for key, name in (("num_layers_in_first_pipeline_stage", "first_stage_layers"),
                          ("num_layers_in_last_pipeline_stage", "last_stage_layers")):
            n, w = _int(tree, label, m + key, None)
            if n is not None:
                parts.append(f"{name}={n}")
                src(f"{name}={n}", w)
        train, train_style = ",".join(parts), "megatron"
    else:
        d = "policy.dtensor_cfg."
        tp, w = _int(tree, label, d + "tensor_parallel_size")
        src(f"tp={tp}", w)
        cp, w = _int(tree, label, d + "context_parallel_size")
        if cp != 1:
            raise InputError(f"{w}: DTensor context parallelism is not modelled (cp={cp})")
        if train_world % tp:
            raise InputError(f"{label}: trainer GPUs {train_world} not divisible by tp = {tp}")
        dp = train_world // tp
        src(f"dp={dp}", f"trainer GPUs {train_world} / tp {tp} (FSDP2 data parallel size)")
        train, train_style = f"tp={tp},dp={dp}", "dtensor"
        if dp > 1:
            layout_needed = (f"{label}: NeMo RL's DTensor policy shards every parameter with FSDP2 over its "
                             f"dp={dp} ranks; `--train-style dtensor` strings model DDP replicas, so the trainer "
                             "side needs a layout file with fsdp2_physical: true (docs/layouts.md, \"Generic layout "
                             "files\"): give it as --train-layout FILE beside --from")

    # inference (vLLM)
    v = "policy.generation.vllm_cfg."
    itp, w = _int(tree, label, v + "tensor_parallel_size")
    src(f"infer tp={itp}", w)
    ipp, w = _int(tree, label, v + "pipeline_parallel_size")
    src(f"infer pp={ipp}", w)
    iep, w_ep = _int(tree, label, v + "expert_parallel_size")
    src(f"infer ep={iep}", w_ep)
    if infer_world % (itp * ipp):
        raise InputError(f"{label}: inference GPUs {infer_world} not divisible by vLLM tp*pp = {itp}*{ipp} = "
                         f"{itp * ipp} (NeMo RL's vllm_generation.py asserts the same)")
    idp = infer_world // (itp * ipp)
    src(f"infer dp={idp}", f"inference GPUs {infer_world} / (tp*pp = {itp * ipp}) (vllm_generation.py dp_size)")
    parts = [f"tp={itp}", f"pp={ipp}", f"dp={idp}"]
    if iep > 1 and iep % itp:
        raise InputError(f"{w_ep}: expert_parallel_size {iep} is not a multiple of tensor_parallel_size {itp} "
                         "(vLLM's EP = DP x TP; NeMo RL's vllm_generation.py asserts the same)")
    if iep > itp:
        if infer_world % (ipp * iep):
            raise InputError(f"{label}: inference GPUs {infer_world} not divisible by pp*ep = {ipp}*{iep} "
                             "(each in-engine DP engine spans ep GPUs per stage)")
        parts += [f"ep={iep}", "dp_mode=in_engine"]
        src("dp_mode=in_engine", f"{w_ep} > tp {itp}: vLLM data parallel of {iep // itp} inside each of "
            f"{infer_world // (ipp * iep)} engine(s) (vllm_generation.py: vllm_dp_size = ep // tp)")
    else:
        if iep > 1:
            parts.append(f"ep={iep}")
        parts.append("dp_mode=engines")
        src("dp_mode=engines", f"ep {iep} <= tp {itp}: one vLLM engine per replica, {idp} engine(s) "
            "(vllm_generation.py: in-engine DP only when ep > tp)")
    infer = ",".join(parts)

    model = tree.resolve("policy.model_name")
    if not isinstance(model, str):
        raise InputError(f"{tree.where('policy.model_name')}: `policy.model_name` must be a string, got {model!r:.60}")
    src(f"model {model}", f"{tree.where('policy.model_name')}: policy.model_name")
    return Deployment(FRAMEWORK, str(path), model, train, train_style, infer, "vllm", train_world, infer_world,
                      tuple(sources), ignored, layout_needed)


__all__ = ["COMMIT", "FRAMEWORK", "RULES", "derive"]

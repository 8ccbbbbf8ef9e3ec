"""A verl config -> a ``Deployment``: its trainer YAML, or a launch script's Hydra overrides.

Read from volcengine/verl at commit b178a3cd56f58b2d502255daba591e92833930a7 (2026-01-29):

* a launch script (``examples/*/*.sh``, ``verl/experimental/*/shell/*.sh``): its ``python3 -m verl....``
  command's ``--config-name`` and ``key=value`` overrides (``request/launch_script.py``); a value that
  cannot be expanded is refused by name where its key is read;
* defaults of the keys not given: ``verl/trainer/config/rollout/rollout.yaml`` (rollout
  ``tensor_model_parallel_size: 2``, ``data_parallel_size: 1``, ``expert_parallel_size: 1``,
  ``pipeline_model_parallel_size: 1``), ``engine/megatron.yaml`` (every size 1,
  ``expert_tensor_parallel_size: null`` = Megatron's ``tp``), ``ppo_megatron_trainer.yaml``
  (``actor_rollout_ref.hybrid_engine: True``), ``trainer.nnodes: 1``, ``trainer.n_gpus_per_node: 8``;
* pools: the hybrid engine (``hybrid_engine: True``, what ``verl.trainer.main_ppo`` asserts,
  ``ray_trainer.py``) is colocated and refused; separate pools are verl's one-step-off-policy / fully-async
  trainers (``hybrid_engine=False``): trainer ``trainer.nnodes x trainer.n_gpus_per_node``, rollout
  ``rollout.nnodes x rollout.n_gpus_per_node`` (``one_step_off_policy/main_ppo.py``);
* vLLM replicas: ``workers/rollout/replica.py``: one replica (one vLLM engine) is ``tp * dp * pp`` GPUs of
  ``actor_rollout_ref.rollout``; ``vllm_async_server.py``: ``enable_expert_parallel = ep > 1`` and vLLM's
  ``data_parallel_size`` = ``rollout.data_parallel_size``. So rollout ``data_parallel_size: 1`` is one
  engine per replica (``dp_mode=engines``), larger is in-engine DP (``dp_mode=in_engine``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reshardctl.errors import InputError
from reshardctl.request.config_tree import ConfigTree, read_mapping, tree_of
from reshardctl.request.deployment import (
    COLOCATED_WHY, READ, Deployment, Rule, Source, check_keys, ignore, only, positive_int,
)
from reshardctl.request.launch_script import Unresolved, read_script

FRAMEWORK = "verl"
COMMIT = "volcengine/verl b178a3cd"

AR = "actor_rollout_ref."
MG = AR + "actor.megatron."
RO = AR + "rollout."
DEFAULTS: dict[str, Any] = {
    AR + "hybrid_engine": (True, "ppo_megatron_trainer.yaml / ppo_trainer.yaml"),
    RO + "tensor_model_parallel_size": (2, "rollout/rollout.yaml"),
    RO + "data_parallel_size": (1, "rollout/rollout.yaml"),
    RO + "expert_parallel_size": (1, "rollout/rollout.yaml"),
    RO + "pipeline_model_parallel_size": (1, "rollout/rollout.yaml"),
    MG + "tensor_model_parallel_size": (1, "engine/megatron.yaml"),
    MG + "pipeline_model_parallel_size": (1, "engine/megatron.yaml"),
    MG + "expert_model_parallel_size": (1, "engine/megatron.yaml"),
    MG + "expert_tensor_parallel_size": (None, "engine/megatron.yaml (null: Megatron's tp)"),
    MG + "context_parallel_size": (1, "engine/megatron.yaml"),
    MG + "virtual_pipeline_model_parallel_size": (None, "engine/megatron.yaml"),
    "trainer.nnodes": (1, "ppo_trainer.yaml"),
    "trainer.n_gpus_per_node": (8, "ppo_trainer.yaml"),
}

_COMPUTE = "compute only (kernels, fusions, recomputation, offloading, numerics): the weights' split is unchanged"
_NOT_POLICY = "not the policy's weights or their placement"
_SAMPLING = "sampling, batching and serving settings: not the weights"

RULES: list[Rule] = [
    *[(k, READ) for k in (*DEFAULTS, AR + "actor.strategy", AR + "model.path", RO + "name",
                          "rollout.nnodes", "rollout.n_gpus_per_node",
                          MG + "override_transformer_config.num_layers_in_first_pipeline_stage",
                          MG + "override_transformer_config.num_layers_in_last_pipeline_stage",
                          MG + "override_transformer_config.account_for_embedding_in_pipeline_split",
                          MG + "override_transformer_config.account_for_loss_in_pipeline_split",
                          AR + "actor.fsdp_config.fsdp_size")],
    (AR + "model.lora_rank", only((0,), "LoRA adapters are refitted as adapters, not modelled")),
    (AR + "model.lora.rank", only((0,), "LoRA adapters are refitted as adapters, not modelled")),
    (AR + "model.lora.*", ignore("LoRA settings, off while lora.rank is 0")),
    *[(AR + "model." + k, ignore("LoRA settings, off while lora_rank is 0"))
      for k in ("lora_alpha", "target_modules", "exclude_modules")],
    *[(k, ignore("the fully-async trainer's schedule: not the weights"))
      for k in ("rollout.total_rollout_steps", "rollout.total_epochs", "rollout.test_freq")],
    (RO + "engine_kwargs.vllm.disable_mm_preprocessor_cache", ignore("a multimodal cache: not the weights")),
    (RO + "enable_sleep_mode", ignore("memory release between steps: not the weights' split")),
    (MG + "dtype", only(("bfloat16",), "the exchanged tensors are the checkpoint's bf16 tensors")),
    (RO + "dtype", only(("bfloat16",), "the exchanged tensors are the checkpoint's bf16 tensors")),
    (RO + "quantization", only((None,), "vLLM quantizing on load changes the inference tensors")),
    *[(AR + "model.override_config." + k, ignore("the context length: no tensor shape depends on it"))
      for k in ("max_position_embeddings", "model_config.max_position_embeddings")],
    (AR + "model.override_config.moe_config.freeze_moe_router", ignore("training only: the router's shape is unchanged")),
    *[(MG + "override_transformer_config." + k, ignore(_COMPUTE)) for k in (
        "*fusion*", "recompute_*", "deallocate_pipeline_outputs", "persist_layer_norm", "moe_*",
        "attention_backend")],
    (MG + "override_transformer_config", only(({},), "Megatron transformer overrides may change the layout")),
    *[(MG + k, ignore(_COMPUTE)) for k in (
        "param_offload", "grad_offload", "optimizer_offload", "use_dist_checkpointing", "dist_checkpointing_*",
        "use_mbridge", "vanilla_mbridge", "seed", "sequence_parallel", "use_distributed_optimizer",
        "use_remove_padding", "forward_only", "override_ddp_config*")],
    (MG + "override_mcore_model_config", only(({},), "Megatron model overrides may change the layout")),
    *[(AR + "actor." + k, ignore("the actor's loss, optimizer and micro-batching: not the weights' placement"))
      for k in ("optim.*", "ppo_*", "use_kl_loss", "kl_loss_*", "clip_ratio*", "entropy_*", "loss_agg_mode",
                "use_dynamic_bsz", "policy_loss.*", "checkpoint.*", "use_torch_compile", "grad_clip",
                "ulysses_sequence_parallel_size", "shuffle", "data_loader_seed", "profiler.*", "router_replay.*",
                "use_prefix_grouper", "calculate_sum_pi_squared")],
    *[(AR + "actor.fsdp_config." + k, ignore(_COMPUTE)) for k in (
        "param_offload", "optimizer_offload", "offload_policy", "reshard_after_forward", "forward_prefetch",
        "wrap_policy.*", "model_dtype", "mixed_precision.*")],
    *[(AR + "model." + k, ignore("loading and kernel options: not the weights' placement")) for k in (
        "trust_remote_code", "use_remove_padding", "use_fused_kernels", "enable_gradient_checkpointing",
        "enable_activation_offload", "use_shm", "external_lib", "custom_chat_template", "tokenizer_path",
        "fused_kernel_options.*", "use_liger")],
    *[(RO + k, ignore(_SAMPLING)) for k in (
        "n", "temperature", "top_p", "top_k", "val_kwargs.*", "gpu_memory_utilization", "enforce_eager",
        "free_cache_engine", "enable_chunked_prefill", "max_num_batched_tokens", "max_model_len", "max_num_seqs",
        "log_prob_*", "calculate_log_probs", "mode", "load_format", "prompt_length", "response_length",
        "ignore_eos", "cudagraph_capture_sizes", "disable_log_stats", "do_sample", "multi_turn.*", "agent.*",
        "layered_summon", "update_weights_bucket_megabytes", "enable_prefix_caching", "skip_tokenizer_init",
        "trace.*", "over_sample_rate", "multi_stage_wake_up")],
    (AR + "ref.*", ignore("the reference policy is not refitted")),
    (AR + "nccl_timeout", ignore("a timeout")),
    *[(k + "*", ignore(_NOT_POLICY)) for k in (
        "data", "algorithm", "critic", "reward_model", "reward_manager", "custom_reward_function", "trainer",
        "ray_kwargs", "ray_init", "global_profiler", "transfer_queue", "async_training")],
]


# ----------------------------------------------------------------------------- derivation ------------
def _value(tree: ConfigTree, key: str) -> tuple[Any, str]:
    if tree.has(key):
        value = tree.raw(key)
        if isinstance(value, Unresolved):
            raise InputError(f"{tree.where(key)}: `{key}`: cannot expand {value}",
                             hint="set it in the script (or give the flag it maps to beside --from)")
        return value, f"{tree.where(key)}: {key} = {value}"
    default, source = DEFAULTS.get(key, (None, "verl"))
    return default, f"default of verl ({source}): {key} = {default}"


def _int(tree: ConfigTree, key: str) -> tuple[int | None, str]:
    value, where = _value(tree, key)
    if value is None:
        return None, where
    positive_int(value, where=tree.where(key) if tree.has(key) else "verl", key=key)
    return value, where


def load(path: str) -> tuple[ConfigTree, str, str]:
    if Path(path).suffix in (".sh", ".bash"):
        return read_script(path)
    data = read_mapping(Path(path), Path(path).name)
    data.pop("defaults", None)
    data.pop("hydra", None)
    return tree_of(data, Path(path).name), "", ""


def derive(path: str, *, model_given: bool = False) -> Deployment:
    tree, config_name, module = load(path)
    label = Path(path).name
    leaves = [(p, v) for p, v in tree.leaves()]
    ignored = check_keys(leaves, RULES, label=label, where=tree.where, resolve=tree.raw, framework=FRAMEWORK)
    sources: list[Source] = []

    def src(what: str, where: str) -> None:
        sources.append(Source(what, where))

    hybrid, w = _value(tree, AR + "hybrid_engine")
    if hybrid is not False:
        raise InputError(f"{label}: `{AR}hybrid_engine` = {hybrid!r} ({w}): {COLOCATED_WHY}",
                         hint="verl runs separate pools with its one-step-off-policy or fully-async trainers: "
                              "actor_rollout_ref.hybrid_engine=False, trainer.nnodes/n_gpus_per_node and "
                              "rollout.nnodes/n_gpus_per_node (docs/deployments.md)")
    if module == "verl.trainer.main_ppo":
        raise InputError(f"{label}: `{AR}hybrid_engine` = False, but verl.trainer.main_ppo asserts the hybrid engine "
                         "(ray_trainer.py: \"Currently, only support hybrid engine\")",
                         hint="separate pools run verl.experimental.one_step_off_policy.main_ppo or the fully-async "
                              "trainer")
    name, w = _value(tree, RO + "name")
    if name != "vllm":
        raise InputError(f"{label}: `{RO}name` = {name!r}: --from reads vLLM rollouts only ({w})")
    nodes, w_n = _int(tree, "trainer.nnodes")
    gpn, w_g = _int(tree, "trainer.n_gpus_per_node")
    r_nodes, w_rn = _int(tree, "rollout.nnodes")
    r_gpn, w_rg = _int(tree, "rollout.n_gpus_per_node")
    if r_nodes is None or r_gpn is None:
        raise InputError(f"{label}: hybrid_engine is off but `rollout.nnodes` / `rollout.n_gpus_per_node` are not "
                         "given: the rollout pool's size is unknown (one_step_off_policy/main_ppo.py asserts both > 0)")
    train_world, infer_world = nodes * gpn, r_nodes * r_gpn
    src(f"trainer GPUs = {nodes} x {gpn} = {train_world}", f"{w_n}; {w_g}")
    src(f"inference GPUs = {r_nodes} x {r_gpn} = {infer_world}", f"{w_rn}; {w_rg}")

    strategy, w = _value(tree, AR + "actor.strategy")
    if strategy is None:
        strategy = "megatron" if "megatron" in config_name else "fsdp"
        w = f"--config-name {config_name or '(none)'}: verl's {'megatron' if strategy == 'megatron' else 'FSDP'} trainer"
    src(f"trainer {strategy}", w)
    layout_needed = None
    if strategy == "megatron":
        vals = {}
        for key, short in (("tensor_model_parallel_size", "tp"), ("pipeline_model_parallel_size", "pp"),
                           ("context_parallel_size", "cp"), ("expert_model_parallel_size", "ep"),
                           ("expert_tensor_parallel_size", "etp"), ("virtual_pipeline_model_parallel_size", "vpp")):
            v, w = _int(tree, MG + key)
            vals[short] = v
            if v is not None:
                src(f"{short}={v}", w)
        tp, pp, cp = vals["tp"], vals["pp"], vals["cp"]
        if train_world % (tp * cp * pp):
            raise InputError(f"{label}: trainer GPUs {train_world} not divisible by tp*cp*pp = {tp * cp * pp}")
        dp = train_world // (tp * cp * pp)
        src(f"dp={dp}", f"trainer GPUs {train_world} / (tp*cp*pp = {tp * cp * pp})")
        parts = [f"tp={tp}", f"pp={pp}", f"cp={cp}", f"ep={vals['ep']}"]
        if vals["etp"] is not None:
            parts.append(f"etp={vals['etp']}")
        parts.append(f"dp={dp}")
        if vals["vpp"] not in (None, 1):
            parts.append(f"vpp={vals['vpp']}")
        for key, short in (("num_layers_in_first_pipeline_stage", "first_stage_layers"),
                           ("num_layers_in_last_pipeline_stage", "last_stage_layers")):
            v, w = _int(tree, MG + "override_transformer_config." + key)
            if v is not None:
                parts.append(f"{short}={v}")
                src(f"{short}={v}", w)
        for key, short in (("account_for_embedding_in_pipeline_split", "embedding_in_split"),
                           ("account_for_loss_in_pipeline_split", "loss_in_split")):
            v, w = _value(tree, MG + "override_transformer_config." + key)
            if v is not None:
                if not isinstance(v, bool):
                    raise InputError(f"{w}: must be true or false")
                parts.append(f"{short}={str(v).lower()}")
                src(f"{short}={str(v).lower()}", w)
        train, train_style = ",".join(parts), "megatron"
    elif strategy in ("fsdp", "fsdp2"):
        fsdp_size, w = _value(tree, AR + "actor.fsdp_config.fsdp_size")
        if fsdp_size not in (None, -1):
            raise InputError(f"{w}: HSDP (fsdp_size != -1) is not modelled")
        train, train_style = f"tp=1,dp={train_world}", "dtensor"
        src(f"dp={train_world}", f"verl's {strategy} actor: FSDP over all {train_world} trainer GPUs")
        if train_world > 1:
            layout_needed = (f"{label}: verl's {strategy} actor shards every parameter with FSDP over its "
                             f"{train_world} ranks; `--train-style dtensor` strings model DDP replicas, so the "
                             "trainer side needs a layout file with fsdp2_physical: true (docs/layouts.md, "
                             "\"Generic layout files\"): give it as --train-layout FILE beside --from")
    else:
        raise InputError(f"{label}: `{AR}actor.strategy` = {strategy!r}: --from reads megatron and fsdp/fsdp2 actors")

    itp, w = _int(tree, RO + "tensor_model_parallel_size")
    src(f"infer tp={itp}", w)
    ipp, w = _int(tree, RO + "pipeline_model_parallel_size")
    src(f"infer pp={ipp}", w)
    vdp, w_dp = _int(tree, RO + "data_parallel_size")
    iep, w_ep = _int(tree, RO + "expert_parallel_size")
    replica = itp * vdp * ipp
    if infer_world % replica:
        raise InputError(f"{label}: rollout GPUs {infer_world} not divisible by one replica's tp*dp*pp = "
                         f"{itp}*{vdp}*{ipp} = {replica} (verl's replica.py)")
    idp = infer_world // (itp * ipp)
    src(f"infer dp={idp}", f"rollout GPUs {infer_world} / (tp*pp = {itp * ipp})")
    parts = [f"tp={itp}", f"pp={ipp}", f"dp={idp}"]
    if iep > 1 and iep != vdp * itp:
        raise InputError(f"{w_ep}: vLLM's expert parallel size is its dp x tp = {vdp} x {itp} = {vdp * itp}, "
                         f"but expert_parallel_size = {iep}")
    if vdp > 1:
        if iep > 1:
            parts.append(f"ep={iep}")
        elif infer_world > replica:
            raise InputError(f"{w_dp}: several in-engine data-parallel vLLM engines without expert parallelism "
                             "are not expressible as a parallel string (the groups follow ep)")
        parts.append("dp_mode=in_engine")
        src("dp_mode=in_engine", f"{w_dp}: vLLM data parallel of {vdp} inside each of {infer_world // replica} "
            "engine(s) (verl's vllm_async_server.py)")
    else:
        if iep > 1:
            parts.append(f"ep={iep}")
        parts.append("dp_mode=engines")
        src("dp_mode=engines", f"{w_dp}: one vLLM engine per replica, {idp} engine(s) (verl's replica.py)")
    infer = ",".join(parts)

    model = None
    if not model_given:
        model, w = _value(tree, AR + "model.path")
        if not isinstance(model, str):
            raise InputError(f"{label}: `{AR}model.path` must be given as a string, got {model!r:.60}",
                             hint="or give --model beside --from")
        src(f"model {model}", w)
    return Deployment(FRAMEWORK, str(path), model, train, train_style, infer, "vllm", train_world, infer_world,
                      tuple(sources), ignored, layout_needed)


__all__ = ["COMMIT", "DEFAULTS", "FRAMEWORK", "RULES", "derive", "load"]

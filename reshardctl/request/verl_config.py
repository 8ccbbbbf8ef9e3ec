"""A verl config -> a ``Deployment``: its trainer YAML, or a launch script's Hydra overrides.

Read from volcengine/verl at commit b178a3cd56f58b2d502255daba591e92833930a7 (2026-01-29):

* a launch script (``examples/*/*.sh``, ``verl/experimental/*/shell/*.sh``): the ``python3 -m verl....``
  command (backslash-continued lines joined), its ``--config-name`` and its ``key=value`` overrides
  (``config_tree.apply_overrides``); ``$VAR``, ``${VAR}``, ``${VAR:-default}`` and ``$((integer
  arithmetic))`` are expanded from the script's own assignments, with the environment taken as unset (so
  ``${VAR:-default}`` is the default); a reference that cannot be expanded is refused by name when the key
  matters (and ``$@``, the script's extra arguments, is dropped);
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

import ast
import operator
import re
import shlex
from pathlib import Path
from typing import Any

from reshardctl.bounded_load import LoadError, decode, read_bytes
from reshardctl.errors import InputError
from reshardctl.request.config_tree import MAX_BYTES, ConfigTree, apply_overrides, read_mapping, tree_of
from reshardctl.request.deployment import (
    COLOCATED_WHY, READ, Deployment, Rule, Source, check_keys, ignore, only, positive_int,
)

FRAMEWORK = "verl"
COMMIT = "volcengine/verl b178a3cd"
MAX_SCRIPT_LINES = 20_000

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
        "attention_backend", "gradient_accumulation_fusion")],
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


class Unresolved(str):
    """A value whose shell expansion failed; its text says which reference."""


# ----------------------------------------------------------------------------- shell expansion -------
_ARITH_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
              ast.Div: operator.floordiv, ast.Mod: operator.mod}


class _NoValue(Exception):
    def __init__(self, ref: str):
        super().__init__(ref)
        self.ref = ref


def _arith(expr: str, env: dict[str, str]) -> str:
    text = re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", r"\1", expr)
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError:
        raise _NoValue(f"$(({expr}))") from None

    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.Name):
            raw = env.get(node.id)
            if isinstance(raw, Unresolved) or raw is None or not re.fullmatch(r"-?[0-9]{1,18}", raw):
                raise _NoValue(f"${node.id} (in $(({expr})))")
            return int(raw)
        if isinstance(node, ast.BinOp) and type(node.op) in _ARITH_OPS:
            right = ev(node.right)
            if isinstance(node.op, (ast.FloorDiv, ast.Div, ast.Mod)) and right == 0:
                raise _NoValue(f"$(({expr})) (division by zero)")
            out = _ARITH_OPS[type(node.op)](ev(node.left), right)
            if abs(out) > 1 << 62:
                raise _NoValue(f"$(({expr})) (too large)")
            return out
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        raise _NoValue(f"$(({expr}))")

    return str(ev(tree))


def _closing(text: str, i: int, open_: str, close: str) -> int:
    depth = 0
    while i < len(text):
        if text.startswith(open_, i):
            depth += 1
            i += len(open_)
            continue
        if text.startswith(close, i):
            depth -= 1
            if depth == 0:
                return i
            i += len(close)
            continue
        i += 1
    raise _NoValue(text[:40])


def _known(name: str, env: dict[str, str]) -> str:
    value = env[name]
    if isinstance(value, Unresolved):
        raise _NoValue(f"${{{name}}} (set from {value})")
    return value


def expand(text: str, env: dict[str, str], depth: int = 0) -> str:
    """``text`` with ``$VAR``, ``${VAR}``, ``${VAR:-default}`` and ``$((...))`` expanded from ``env``
    (``_NoValue`` naming the reference otherwise)."""
    if depth > 8:
        raise _NoValue(text[:40])
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c != "$":
            out.append(c)
            i += 1
            continue
        if text.startswith("$((", i):
            end = _closing(text, i + 1, "(", ")")
            out.append(_arith(expand(text[i + 3:end - 1], env, depth + 1), env))
            i = end + 1
        elif text.startswith("${", i):
            end = _closing(text, i + 1, "{", "}")
            inner = text[i + 2:end]
            name, sep, default = inner.partition(":-")
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise _NoValue("${" + inner[:40] + "}")
            if name in env:
                out.append(_known(name, env))
            elif sep:
                out.append(expand(default.strip('"').strip("'"), env, depth + 1))
            else:
                raise _NoValue("${" + name + "}")
            i = end + 1
        else:
            m = re.match(r"\$([A-Za-z_][A-Za-z0-9_]*|@|\*|[0-9])", text[i:])
            if not m:
                out.append(c)
                i += 1
                continue
            if m[1] in ("@", "*") or m[1].isdigit():
                raise _NoValue("$" + m[1])
            if m[1] not in env:
                raise _NoValue("$" + m[1])
            out.append(_known(m[1], env))
            i += m.end()
    return "".join(out)


def _split(text: str) -> list[str]:
    """Shell words of ``text``, each ``$((...))`` kept whole (spaces inside arithmetic are not word breaks)."""
    table: list[str] = []
    out, i = [], 0
    while i < len(text):
        j = text.find("$((", i)
        if j < 0:
            out.append(text[i:])
            break
        try:
            end = _closing(text, j + 1, "(", ")")
        except _NoValue:
            out.append(text[i:])
            break
        out.append(text[i:j] + f"\x00{len(table)}\x00")
        table.append(text[j:end + 1])
        i = end + 1
    words = shlex.split("".join(out), comments=True)
    return [re.sub(r"\x00([0-9]+)\x00", lambda m: table[int(m[1])], w) for w in words]


_SHELL_END = re.compile(r"[0-9]*[<>].*|\||\|\||&|&&|;")
_ASSIGN_RE = re.compile(r"(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)")
_CMD_RE = re.compile(r"\bpython[0-9.]*\s+(?:-u\s+)?-m\s+(verl\.[A-Za-z0-9_.]+)")


def _logical_lines(text: str) -> list[tuple[int, str]]:
    lines, buf, start = [], "", 0
    for n, line in enumerate(text.splitlines(), 1):
        if not buf:
            start = n
        stripped = line.rstrip()
        if stripped.endswith("\\"):
            buf += stripped[:-1] + " "
            continue
        buf += line
        lines.append((start, buf))
        buf = ""
    if buf:
        lines.append((start, buf))
    return lines


def read_script(path: str) -> tuple[ConfigTree, str, str]:
    """(the overrides as a tree, the config name, the module) of the launch script at ``path``."""
    label = Path(path).name
    try:
        text = decode(read_bytes(path, MAX_BYTES))
    except FileNotFoundError:
        raise InputError(f"{label}: no such file") from None
    except (LoadError, OSError) as e:
        raise InputError(f"{label}: cannot read it ({e})") from None
    if text.count("\n") > MAX_SCRIPT_LINES:
        raise InputError(f"{label}: more than {MAX_SCRIPT_LINES:,} lines")
    env: dict[str, str] = {}
    for n, line in _logical_lines(text):
        body = line.strip()
        if not body or body.startswith("#"):
            continue
        m = _CMD_RE.search(body)
        if m:
            return _command(label, n, body[m.end():], m[1], env)
        a = _ASSIGN_RE.fullmatch(body.split(" #")[0].strip())
        if a:
            try:
                words = _split(a[2])
                env[a[1]] = expand(words[0] if words else "", env)
            except _NoValue as e:  # not expandable: a later use of it is refused, naming the cause
                env[a[1]] = Unresolved(e.ref)
            except ValueError:
                env[a[1]] = Unresolved(f"line {n}, which the shell words of cannot be split")
    raise InputError(f"{label}: no `python3 -m verl....` command in the script",
                     hint="--from reads a verl launch script's `python3 -m verl.trainer.main_ppo ... key=value` lines")


def _command(label: str, line: int, rest: str, module: str, env: dict[str, str]) -> tuple[ConfigTree, str, str]:
    try:
        words = _split(rest)
    except ValueError as e:
        raise InputError(f"{label}:{line}: the verl command cannot be split into words ({e})") from None
    config_name, items, i = "", [], 0
    where = f"{label}:{line}"
    while i < len(words):
        w = words[i]
        i += 1
        if w in ("$@", "$*"):
            continue
        if _SHELL_END.fullmatch(w):  # a redirection, a pipe or the command's end: the arguments stop here
            break
        if w.startswith("--config-name") or w.startswith("--config-path"):
            if "=" not in w and i < len(words):
                w = w + "=" + words[i]
                i += 1
            if w.startswith("--config-name"):
                config_name = w.partition("=")[2].strip("'\"")
            continue
        if w.startswith("-"):
            raise InputError(f"{where}: option {w!r} of the verl command is not one --from reads")
        if "=" not in w:  # a variable holding arguments (unquoted: split into words)
            try:
                words[i:i] = expand(w, env).split()
            except _NoValue as e:
                raise InputError(f"{where}: {w[:60]!r} expands to arguments --from cannot know ({e.ref})",
                                 hint="write the overrides on the command line of the script") from None
            continue
        key = w.partition("=")[0]
        try:
            value_text = expand(w, env)
        except _NoValue as e:
            items.append((f"{key}=unresolved", where, Unresolved(f"{e.ref} (not set in the script)")))
            continue
        items.append((value_text, where, None))
    tree = apply_overrides(ConfigTree({}), [(t, w) for t, w, _ in items])
    for text, _w, unresolved in items:  # the values whose expansion failed stay marked as such
        if unresolved is not None:
            key = text.partition("=")[0].lstrip("+~")
            node = tree.data
            parts = key.split(".")
            for p in parts[:-1]:
                node = node[p]
            node[parts[-1]] = unresolved
    return tree, config_name, module


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


__all__ = ["COMMIT", "DEFAULTS", "FRAMEWORK", "RULES", "derive", "expand", "read_script"]

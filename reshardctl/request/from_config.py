"""``--from FILE``: a refit request's model, layouts and styles from the RL framework's own config.

``derive(path)`` tells the framework from the file (a shell script: a verl launch script; a YAML mapping
with ``actor_rollout_ref``: verl; with ``policy``: NeMo RL) and returns its ``Deployment``
(``request/nemo_rl_config.py``, ``request/verl_config.py``). ``apply_from(values, path, given)`` turns it
into the request's fields, with the command line's rules:

* ``--train``, ``--infer``, ``--train-style``, ``--infer-style`` and ``--infer-layout`` beside ``--from``
  are refused: the config decides them (copy the printed strings into the flags, without ``--from``, to
  change them);
* ``--model`` beside ``--from`` replaces the config's model (said in the provenance); without it the
  config's Hugging Face id is mapped to a catalog preset (``HF_PRESETS``), or a local directory holding a
  ``config.json`` is loaded as the model; any other id is refused naming the key;
* ``--train-layout FILE`` beside ``--from`` replaces the derived trainer side (required where the trainer
  shards its parameters with FSDP, which no parallel string expresses);
* every other option (``--site``, ``--layers``, ``--mtp``, ``--bucket-mb``, ``--relay``) is the command
  line's; the config says nothing about them.

``describe`` gives the lines the CLI prints (the derived flags, then one line per value and where it came
from). Reference: docs/deployments.md.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any

from reshardctl.bounded_load import read_bytes
from reshardctl.errors import InputError
from reshardctl.models.catalog import PRESETS
from reshardctl.request import nemo_rl_config, verl_config
from reshardctl.request.config_tree import read_mapping
from reshardctl.request.deployment import Deployment

# Hugging Face ids (as policy.model_name / actor_rollout_ref.model.path give them) -> catalog presets.
# Instruct/base variants share the architecture and every tensor shape of their preset.
HF_PRESETS: dict[str, str] = {
    "meta-llama/Llama-3.1-8B": "llama-3.1-8b",
    "meta-llama/Llama-3.1-8B-Instruct": "llama-3.1-8b",
    "meta-llama/Meta-Llama-3.1-8B": "llama-3.1-8b",
    "meta-llama/Meta-Llama-3.1-8B-Instruct": "llama-3.1-8b",
    "meta-llama/Llama-3.1-70B": "llama-3.1-70b",
    "meta-llama/Llama-3.1-70B-Instruct": "llama-3.1-70b",
    "meta-llama/Meta-Llama-3.1-70B-Instruct": "llama-3.1-70b",
    "Qwen/Qwen3-30B-A3B": "qwen3-30b-a3b",
    "Qwen/Qwen3-30B-A3B-Base": "qwen3-30b-a3b",
    "Qwen/Qwen3-235B-A22B": "qwen3-235b-a22b",
    "deepseek-ai/DeepSeek-V3": "deepseek-v3",
    "deepseek-ai/DeepSeek-V3-Base": "deepseek-v3",
    "deepseek-ai/DeepSeek-V3-0324": "deepseek-v3",
    "deepseek-ai/DeepSeek-R1": "deepseek-v3",
    # presets added by the other engineers of issue 24 (archs1, archs2)
    "Qwen/Qwen2.5-7B": "qwen2.5-7b",
    "Qwen/Qwen2.5-7B-Instruct": "qwen2.5-7b",
    "Qwen/Qwen2.5-72B": "qwen2.5-72b",
    "Qwen/Qwen2.5-72B-Instruct": "qwen2.5-72b",
    "Qwen/Qwen2-57B-A14B": "qwen2-57b-a14b",
    "Qwen/Qwen2-57B-A14B-Instruct": "qwen2-57b-a14b",
    "mistralai/Mixtral-8x7B-v0.1": "mixtral-8x7b",
    "mistralai/Mixtral-8x7B-Instruct-v0.1": "mixtral-8x7b",
    "zai-org/GLM-4.5": "glm-4.5",
    "zai-org/GLM-4.5-Air": "glm-4.5-air",
    "openai/gpt-oss-20b": "gpt-oss-20b",
    "openai/gpt-oss-120b": "gpt-oss-120b",
}
REFUSED_BESIDE = {"train": "--train", "infer": "--infer", "train_style": "--train-style",
                  "infer_style": "--infer-style", "infer_layout": "--infer-layout"}
_SNIFF_BYTES = 4 << 20


def framework_of(path: str) -> str:
    """``nemo_rl`` or ``verl`` (InputError naming the file when it is neither)."""
    p = Path(path)
    if p.suffix in (".sh", ".bash"):
        return "verl"
    if p.suffix not in (".yaml", ".yml"):
        try:
            head = read_bytes(path, _SNIFF_BYTES)[:4096]
        except (OSError, ValueError):
            head = b""
        if head.startswith(b"#!") or b"python3 -m verl." in head or b"python -m verl." in head:
            return "verl"
    data = read_mapping(p, p.name)
    if "actor_rollout_ref" in data:
        return "verl"
    if "policy" in data or "defaults" in data:
        return "nemo_rl"
    raise InputError(f"{p.name}: neither a NeMo RL config (a `policy` key or `defaults`) nor a verl one "
                     f"(`actor_rollout_ref`, or a launch script); top-level keys: {', '.join(list(data)[:8])}")


def derive(path: str, *, model_given: bool = False) -> Deployment:
    if framework_of(path) == "verl":
        return verl_config.derive(path, model_given=model_given)
    return nemo_rl_config.derive(path)


def model_of(dep: Deployment) -> tuple[str, str]:
    """(the request's ``model``, why) of the config's model id."""
    mid = dep.model or ""
    if mid in HF_PRESETS:
        preset = HF_PRESETS[mid]
        if preset not in PRESETS:
            raise InputError(f"{Path(dep.config).name}: model {mid!r} maps to the preset {preset!r}, which this "
                             f"reshardctl does not ship", hint="give --model PRESET|PATH beside --from")
        return preset, f"{mid} -> preset {preset}"
    local = Path(os.path.expanduser(mid))
    if mid and (local / "config.json").is_file():
        return str(local), f"{mid}: a local directory with config.json"
    key = "policy.model_name" if dep.framework == nemo_rl_config.FRAMEWORK else "actor_rollout_ref.model.path"
    shown = repr(mid) if len(mid) <= 80 else repr(mid[:77]) + "..."
    raise InputError(f"{Path(dep.config).name}: `{key}` = {shown}: not a known Hugging Face id "
                     f"({len(HF_PRESETS)} mapped, docs/deployments.md) nor a local directory holding config.json",
                     hint="give --model PRESET|PATH beside --from")


def apply_from(values: dict[str, Any], path: str, given: set[str]) -> tuple[dict[str, Any], list[str]]:
    """The request's fields with ``path``'s deployment applied, and the lines that say where each came
    from. ``values``: the command's option values; ``given``: the names given on the command line."""
    clash = [flag for field, flag in REFUSED_BESIDE.items() if field in given]
    if clash:
        raise InputError(f"--from {path} with {', '.join(clash)}: the config decides "
                         f"{'them' if len(clash) > 1 else 'it'}",
                         hint="leave them out, or copy the derived --train/--infer strings (printed by --from) and "
                              "give them without --from")
    dep = derive(path, model_given="model" in given)
    out = dict(values)
    lines = [f"from {dep.framework} config {path}: trainer {dep.train_world} GPUs, inference {dep.infer_world} GPUs "
             "(separate pools)"]
    if "model" in given:
        lines.append(f"  --model {values['model']}  (the command line's; the config's model is not used)")
    else:
        out["model"], why = model_of(dep)
        lines.append(f"  --model {out['model']}  ({why})")
    if "train_layout" in given:
        lines.append(f"  --train-layout {values['train_layout']}  (the command line's; replaces the derived "
                     f"--train-style {dep.train_style} --train {dep.train!r})")
    elif dep.train_layout_needed:
        raise InputError(dep.train_layout_needed)
    else:
        out["train"], out["train_style"] = dep.train, dep.train_style
        lines.append(f"  --train-style {dep.train_style} --train {shlex.quote(dep.train)}")
    out["infer"], out["infer_style"] = dep.infer, dep.infer_style
    lines.append(f"  --infer-style {dep.infer_style} --infer {shlex.quote(dep.infer)}")
    lines.append("where each value came from:")
    lines += [f"  {s.what.ljust(24)}  {s.where}" for s in dep.sources
              if not ("model" in given and s.what.startswith("model "))]
    lines.append(f"  ({dep.ignored} other keys ignored: they do not change the layout; docs/deployments.md)")
    return out, lines


__all__ = ["HF_PRESETS", "REFUSED_BESIDE", "apply_from", "derive", "framework_of", "model_of"]

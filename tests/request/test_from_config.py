"""--from FILE: real NeMo RL and verl recipes (tests/request/recipes/, copied verbatim with a header
naming the source commit) give the parallel strings checked by hand below; colocated deployments,
unknown keys, wrong types and unknown models are refused with the file and the key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reshardctl.errors import InputError, LayoutError
from reshardctl.layout.build import build_layout
from reshardctl.models import load_model
from reshardctl.models.catalog import PRESETS, preset_config
from reshardctl.request.from_config import HF_PRESETS, apply_from, derive, framework_of
from reshardctl.request.launch_script import expand, read_script

RECIPES = Path(__file__).parent / "recipes"
NEMO = RECIPES / "nemo_rl" / "examples" / "configs" / "recipes" / "llm"
VERL = RECIPES / "verl"
DSV3 = NEMO / "grpo-dapomath17k-dsv3-megatron.yaml"


def _child(tmp_path: Path, parent: Path, text: str, name: str = "child.yaml") -> Path:
    """A user's config inheriting a shipped recipe (NeMo RL's `defaults:` takes absolute paths)."""
    p = tmp_path / name
    p.write_text(f"defaults: {parent}\n{text}")
    return p


def _dsv3_separate(tmp_path: Path) -> Path:
    # the DeepSeek-V3 recipe on separate pools: 32 nodes of 8 for vLLM, the other 32 for Megatron
    return _child(tmp_path, DSV3, "policy:\n  generation:\n    colocated:\n      enabled: false\n      resources:\n"
                                  "        gpus_per_node: 8\n        num_nodes: 32\ncluster:\n  num_nodes: 64\n")


# ------------------------------------------------------------------ NeMo RL --------------------------------
def test_the_dsv3_recipe_is_colocated_and_refused_saying_why():
    # grpo_math_1B.yaml (its parent) has policy.generation.colocated.enabled: true; the recipe keeps it
    with pytest.raises(InputError) as e:
        derive(str(DSV3))
    msg = str(e.value)
    assert msg.startswith("grpo-dapomath17k-dsv3-megatron.yaml: `policy.generation.colocated.enabled` = True "
                          "(set in grpo_math_1B.yaml): colocated deployments are out of scope")
    assert "not a transfer between two pools" in msg and "colocated.enabled: false" in msg


def test_dsv3_on_separate_pools_gives_separate_engines_and_expert_columns_0_64(tmp_path):
    # by hand: megatron tp 8, pp 8, cp 4, ep 32 (recipe), etp 1 (grpo_math_1B), first/last 7/6 (recipe);
    # trainer (64 - 32) x 8 = 256 GPUs -> dp = 256 / (8*4*8) = 1; vLLM tp 32 (recipe), ep 1 <= tp: 256/32 = 8
    # separate engines (vllm_generation.py: in-engine DP only when ep > tp)
    dep = derive(str(_dsv3_separate(tmp_path)))
    assert dep.train == "tp=8,pp=8,cp=4,ep=32,etp=1,dp=1,first_stage_layers=7,last_stage_layers=6"
    assert dep.infer == "tp=32,pp=1,dp=8,dp_mode=engines"
    assert (dep.train_world, dep.infer_world, dep.train_style, dep.infer_style) == (256, 256, "megatron", "vllm")
    where = {s.what: s.where for s in dep.sources}
    assert where["tp=8"] == "grpo-dapomath17k-dsv3-megatron.yaml: policy.megatron_cfg.tensor_model_parallel_size = 8"
    assert where["etp=1"] == "grpo_math_1B.yaml: policy.megatron_cfg.expert_tensor_parallel_size = 1"
    # inference rank 0 holds columns 0:64 of every expert's down_proj (2048 / 32), not 0:8 (2048 / 256)
    model = load_model("deepseek-v3")
    lay = build_layout(model, "infer", dep.infer, "vllm", world_size=dep.infer_world)
    down = lay.placement(model.index("model.layers.3.mlp.experts.0.down_proj.weight"))
    assert down.holding(0) == (((0, 7168), (0, 64)),)
    one_engine = build_layout(model, "infer", "tp=32,dp=8,dp_mode=in_engine", "vllm", world_size=256)
    assert one_engine.placement(model.index("model.layers.3.mlp.experts.0.down_proj.weight")).holding(0) \
        == (((0, 7168), (0, 8)),)  # what the old default read the same deployment as


def test_the_dsv3_model_name_is_not_an_id_and_is_refused_naming_the_key(tmp_path):
    values = {"model": "tiny-llama", "train": None, "infer": None, "train_style": "megatron", "infer_style": "vllm"}
    with pytest.raises(InputError, match=r"`policy.model_name` = 'Follow instructions in .*not a known Hugging "
                                         r"Face id") as e:
        apply_from(values, str(_dsv3_separate(tmp_path)), set())
    assert "--model" in e.value.hint
    out, lines = apply_from(values, str(_dsv3_separate(tmp_path)), {"model"})
    assert out["model"] == "tiny-llama" and out["infer"] == "tp=32,pp=1,dp=8,dp_mode=engines"
    assert any("the command line's; the config's model is not used" in line for line in lines)


def test_qwen3_moe_recipe_non_colocated():
    # grpo-qwen3-30ba3b-4n8g-megatron-zmq-deltaweight-noncolocated -> performance/grpo-qwen3-30ba3b-4n8g
    # -> grpo_math_1B. by hand: cluster 4 nodes x 8, inference resources 2 nodes x 8 -> 16 + 16 GPUs;
    # megatron tp 1, pp 1, ep 8 (performance file), etp 1, cp 1 -> dp 16; vLLM tp 2 -> 8 engines
    dep = derive(str(NEMO / "grpo-qwen3-30ba3b-4n8g-megatron-zmq-deltaweight-noncolocated.yaml"))
    assert (dep.train, dep.infer) == ("tp=1,pp=1,cp=1,ep=8,etp=1,dp=16", "tp=2,pp=1,dp=8,dp_mode=engines")
    assert (dep.train_world, dep.infer_world, dep.model) == (16, 16, "Qwen/Qwen3-30B-A3B")
    assert HF_PRESETS[dep.model] == "qwen3-30b-a3b"


def test_dense_llama_megatron_recipe():
    # performance/grpo-llama3.1-8b-instruct-2n8g-async-1off: cluster 2 x 8, inference 1 node x 8 ->
    # 8 + 8; megatron all 1 -> dp 8; vLLM tp 1 -> 8 engines
    dep = derive(str(NEMO / "performance" / "grpo-llama3.1-8b-instruct-2n8g-async-1off.yaml"))
    assert (dep.train, dep.infer) == ("tp=1,pp=1,cp=1,ep=1,etp=1,dp=8", "tp=1,pp=1,dp=8,dp_mode=engines")
    assert dep.model == "meta-llama/Llama-3.1-8B-Instruct" and dep.train_layout_needed is None


def test_dtensor_recipe_needs_a_trainer_layout_file():
    # grpo-llama3.1-8b-instruct-2n8g-fsdp2tp1-noncolocated: DTensor tp 1 over 8 GPUs = FSDP2 over 8 ranks
    path = str(NEMO / "grpo-llama3.1-8b-instruct-2n8g-fsdp2tp1-noncolocated.yaml")
    dep = derive(path)
    assert (dep.train_style, dep.train, dep.infer) == ("dtensor", "tp=1,dp=8", "tp=1,pp=1,dp=8,dp_mode=engines")
    values = {"model": "tiny-llama", "train_layout": None}
    with pytest.raises(InputError, match=r"shards every parameter with FSDP2 over its dp=8 ranks.*--train-layout"):
        apply_from(values, path, set())
    out, lines = apply_from({**values, "train_layout": "fsdp.yaml"}, path, {"train_layout"})
    assert "train" not in out and out["infer"] == dep.infer and out["model"] == "llama-3.1-8b"


def test_in_engine_dp_exactly_where_nemo_rl_uses_it(tmp_path):
    # vllm_generation.py: vllm_dp_size = ep // tp when ep > tp; ep == tp stays one engine per replica
    base = NEMO / "grpo-qwen3-30ba3b-4n8g-megatron-zmq-deltaweight-noncolocated.yaml"
    in_engine = derive(str(_child(tmp_path, base, "policy:\n  generation:\n    vllm_cfg:\n      expert_parallel_size: 8\n")))
    assert in_engine.infer == "tp=2,pp=1,dp=8,ep=8,dp_mode=in_engine"
    assert any("vLLM data parallel of 4 inside each of 2 engine(s)" in s.where for s in in_engine.sources)
    same = derive(str(_child(tmp_path, base, "policy:\n  generation:\n    vllm_cfg:\n      expert_parallel_size: 2\n",
                             name="c2.yaml")))
    assert same.infer == "tp=2,pp=1,dp=8,ep=2,dp_mode=engines"
    with pytest.raises(InputError, match=r"expert_parallel_size 3 is not a multiple of tensor_parallel_size 2"):
        derive(str(_child(tmp_path, base, "policy:\n  generation:\n    vllm_cfg:\n      expert_parallel_size: 3\n",
                          name="c3.yaml")))


@pytest.mark.parametrize("text, says", [
    ("policy:\n  megatron_cfg:\n    frobnicate: 3\n",
     r"child.yaml: `policy.megatron_cfg.frobnicate` = 3: not a key reshardctl reads for NeMo RL"),
    ("policy:\n  generation:\n    backend: sglang\n",
     r"child.yaml: `policy.generation.backend` = 'sglang': refused, --from reads vLLM generation"),
    ("policy:\n  megatron_cfg:\n    tensor_model_parallel_size: '8'\n",
     r"child.yaml: `policy.megatron_cfg.tensor_model_parallel_size` must be a positive integer, got '8'"),
    ("policy:\n  megatron_cfg:\n    enabled: 'yes'\n",
     r"child.yaml: `policy.megatron_cfg.enabled` must be true or false, got 'yes'"),
    ("policy:\n  megatron_cfg:\n    peft:\n      enabled: true\n",
     r"`policy.megatron_cfg.peft.enabled` = True: refused, LoRA"),
    ("cluster:\n  num_nodes: 2\n",
     r"2 nodes: policy.generation.colocated.resources must give num_nodes in 1..1 .* got num_nodes = 2"),
    ("policy:\n  generation:\n    vllm_cfg:\n      tensor_parallel_size: 3\n",
     r"inference GPUs 16 not divisible by vLLM tp\*pp = 3\*1 = 3"),
])
def test_bad_nemo_rl_values_are_refused_by_name(tmp_path, text, says):
    base = NEMO / "grpo-qwen3-30ba3b-4n8g-megatron-zmq-deltaweight-noncolocated.yaml"
    with pytest.raises(InputError, match=says):
        derive(str(_child(tmp_path, base, text)))


def test_every_refusal_is_listed_at_once(tmp_path):
    base = NEMO / "grpo-qwen3-30ba3b-4n8g-megatron-zmq-deltaweight-noncolocated.yaml"
    with pytest.raises(InputError, match=r"2 key\(s\) refused:\n  - .*`policy.a`.*\n  - .*`policy.b`"):
        derive(str(_child(tmp_path, base, "policy:\n  a: 1\n  b: 2\n")))


# ------------------------------------------------------------------ verl -----------------------------------
def test_verl_hybrid_engine_scripts_are_colocated_and_refused():
    for name in ("run_moonlight16b_math_megatron.sh", "run_qwen3moe-30b_megatron_96gb.sh",
                 "run_deepseek671b_math_megatron_80gb.sh"):
        with pytest.raises(InputError, match=r"`actor_rollout_ref.hybrid_engine` = True .*colocated deployments are "
                                             r"out of scope") as e:
            derive(str(VERL / name))
        assert "hybrid_engine=False" in e.value.hint


def test_verl_one_step_off_megatron_script():
    # dapo_7b_math_megatron_4_12.sh: NNODES=${NNODES:-2}, NGPUS_PER_NODE 8, n_gpus_rollout=2,
    # n_gpus_training=$((8 - 2)) = 6: trainer 2 x 6 = 12, rollout 2 x 2 = 4; train_tp 2, train_pp 2 -> dp 3;
    # gen_tp 2, rollout data_parallel_size 1 (rollout.yaml) -> 2 separate engines
    dep = derive(str(VERL / "dapo_7b_math_megatron_4_12.sh"), model_given=True)
    assert (dep.train, dep.infer) == ("tp=2,pp=2,cp=1,ep=1,dp=3", "tp=2,pp=1,dp=2,dp_mode=engines")
    assert (dep.train_world, dep.infer_world) == (12, 4)
    where = {s.what: s.where for s in dep.sources}
    assert where["tp=2"] == ("dapo_7b_math_megatron_4_12.sh:73: "
                             "actor_rollout_ref.actor.megatron.tensor_model_parallel_size = 2")
    assert where["cp=1"].startswith("default of verl (engine/megatron.yaml)")
    # its model path is under $HOME, which the script does not set: refused by name unless --model is given
    with pytest.raises(InputError, match=r"`actor_rollout_ref.model.path`: cannot expand \$\{MODEL_PATH\} "
                                         r"\(set from \$\{RAY_DATA_HOME\} \(set from \$\{HOME\}\)\)"):
        derive(str(VERL / "dapo_7b_math_megatron_4_12.sh"))


def _moonlight_config(tmp_path: Path) -> Path:
    """Moonlight-16B-A3B's shapes (moonshotai/Moonlight-16B-A3B config.json: DeepseekV3ForCausalLM, 27 layers,
    hidden 2048, 64 routed + 2 shared experts of 1408, first layer dense 11264, MLA kv_lora_rank 512, no q
    LoRA, vocab 163840)."""
    cfg = dict(preset_config("tiny-deepseek"))
    cfg.update({"hidden_size": 2048, "intermediate_size": 11264, "moe_intermediate_size": 1408,
                "num_hidden_layers": 27, "num_attention_heads": 16, "num_key_value_heads": 16,
                "n_routed_experts": 64, "n_shared_experts": 2, "num_experts_per_tok": 6, "n_group": 1,
                "topk_group": 1, "first_k_dense_replace": 1, "kv_lora_rank": 512, "q_lora_rank": None,
                "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 163840,
                "num_nextn_predict_layers": 0})
    cfg.pop("quantization_config")
    d = tmp_path / "Moonlight-16B-A3B"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def test_verl_moonlight_on_separate_pools_is_valid_as_separate_engines(tmp_path):
    # the Moonlight script run by verl's one-step-off-policy trainer (what separate pools take): its own
    # lines, the module and config name of that trainer, and the pools as extra arguments ($@)
    text = (VERL / "run_moonlight16b_math_megatron.sh").read_text()
    text = text.replace("verl.trainer.main_ppo --config-path=config \\\n    --config-name='ppo_megatron_trainer.yaml'",
                        "verl.experimental.one_step_off_policy.main_ppo --config-path=config \\\n"
                        "    --config-name='one_step_off_ppo_megatron_trainer.yaml'")
    text = text.replace(" $@", " actor_rollout_ref.hybrid_engine=False rollout.nnodes=3 rollout.n_gpus_per_node=8")
    script = tmp_path / "moonlight_separate.sh"
    script.write_text(text)
    # by hand: trainer 3 x 8 = 24, megatron tp 4, pp 3, ep 4, etp 1 -> dp 24 / 12 = 2; rollout 3 x 8 = 24,
    # rollout tp 4 -> dp 6 separate engines
    dep = derive(str(script), model_given=True)
    assert (dep.train, dep.infer) == ("tp=4,pp=3,cp=1,ep=4,etp=1,dp=2", "tp=4,pp=1,dp=6,dp_mode=engines")
    model = load_model(str(_moonlight_config(tmp_path)))
    lay = build_layout(model, "infer", dep.infer, "vllm", world_size=24)  # valid: 1408 / 4 = 352
    down = lay.placement(model.index("model.layers.1.mlp.experts.0.down_proj.weight"))
    assert down.holding(0) == (((0, 2048), (0, 352)),)
    with pytest.raises(LayoutError, match=r"24 does not divide moe_intermediate_size=1408"):
        build_layout(model, "infer", "tp=4,dp=6,dp_mode=in_engine", "vllm", world_size=24)


def test_verl_main_ppo_without_the_hybrid_engine_is_refused(tmp_path):
    text = (VERL / "run_moonlight16b_math_megatron.sh").read_text().replace(
        " $@", " actor_rollout_ref.hybrid_engine=False rollout.nnodes=3 rollout.n_gpus_per_node=8")
    (tmp_path / "s.sh").write_text(text)
    with pytest.raises(InputError, match=r"verl.trainer.main_ppo asserts the hybrid engine"):
        derive(str(tmp_path / "s.sh"), model_given=True)


def test_verl_fsdp_script_needs_a_trainer_layout_file():
    # grpo_3b_gsm8k_fsdp2_2_6.sh: trainer 1 x (8 - 2) = 6 GPUs of FSDP2, rollout 1 x 2, tp 2 (rollout.yaml)
    dep = derive(str(VERL / "grpo_3b_gsm8k_fsdp2_2_6.sh"), model_given=True)
    assert (dep.train_style, dep.train, dep.infer) == ("dtensor", "tp=1,dp=6", "tp=2,pp=1,dp=1,dp_mode=engines")
    assert "shards every parameter with FSDP over its 6 ranks" in dep.train_layout_needed


def test_verl_unknown_override_is_refused_by_name(tmp_path):
    s = tmp_path / "x.sh"
    s.write_text("python3 -m verl.experimental.one_step_off_policy.main_ppo \\\n"
                 "    actor_rollout_ref.rollout.frob=1 actor_rollout_ref.actor.megatron.tensor_model_parallel_size=$TP\n")
    with pytest.raises(InputError, match=r"x.sh:1: `actor_rollout_ref.rollout.frob` = 1: not a key reshardctl reads"):
        derive(str(s), model_given=True)


def test_shell_expansion():
    env = {"A": "8", "B": "2", "H": "/h"}
    assert expand("${A}x$B ${C:-\"$H/v\"} $((A - B)) $(((A + B) * 2))", env) == "8x2 /h/v 6 20"
    for text in ("$C", "${C}", "$((A / 0))", "$((C + 1))", "$@", "$(ls)x${"):
        with pytest.raises(Exception):
            expand(text, env)


def test_a_script_without_a_verl_command_is_refused(tmp_path):
    (tmp_path / "s.sh").write_text("echo hello\n")
    with pytest.raises(InputError, match=r"s.sh: no `python3 -m verl....` command"):
        read_script(str(tmp_path / "s.sh"))


# ------------------------------------------------------------------ both -----------------------------------
def test_the_framework_is_told_from_the_file(tmp_path):
    (tmp_path / "v.yaml").write_text("actor_rollout_ref: {}\n")
    (tmp_path / "x.yaml").write_text("foo: 1\n")
    assert (framework_of(str(DSV3)), framework_of(str(VERL / "run_moonlight16b_math_megatron.sh")),
            framework_of(str(tmp_path / "v.yaml"))) == ("nemo_rl", "verl", "verl")
    with pytest.raises(InputError, match=r"x.yaml: neither a NeMo RL config .* nor a verl one"):
        framework_of(str(tmp_path / "x.yaml"))


def test_flags_the_config_decides_are_refused_beside_it():
    with pytest.raises(InputError, match=r"--from .* with --train, --infer-style: the config decides them"):
        apply_from({}, str(DSV3), {"train", "infer_style"})


def test_a_local_model_directory_is_loaded_as_the_model(tmp_path):
    d = _moonlight_config(tmp_path)
    cfg = _child(tmp_path, NEMO / "grpo-qwen3-30ba3b-4n8g-megatron-zmq-deltaweight-noncolocated.yaml",
                 f"policy:\n  model_name: {d}\n")
    out, _ = apply_from({"model": "tiny-llama"}, str(cfg), set())
    assert out["model"] == str(d)


def test_every_mapped_preset_is_in_the_catalog():
    """The ids map to presets of this catalog (the qwen2.5/qwen2-moe/mixtral/glm-4.5/gpt-oss ones arrive with
    the architecture branches of issue 24)."""
    assert sorted(set(HF_PRESETS.values()) - set(PRESETS)) == []


def test_a_verl_yaml_config_reads_like_its_script(tmp_path):
    # the dapo_7b_math_megatron_4_12.sh overrides written as the YAML a user would keep
    cfg = tmp_path / "verl.yaml"
    cfg.write_text("defaults:\n  - ppo_megatron_trainer\n  - _self_\n"
                   "actor_rollout_ref:\n  hybrid_engine: false\n"
                   "  actor:\n    strategy: megatron\n    megatron: {tensor_model_parallel_size: 2, "
                   "pipeline_model_parallel_size: 2}\n"
                   "  rollout: {name: vllm, tensor_model_parallel_size: 2}\n"
                   "  model: {path: Qwen/Qwen2.5-7B-Instruct}\n"
                   "trainer: {nnodes: 2, n_gpus_per_node: 6}\nrollout: {nnodes: 2, n_gpus_per_node: 2}\n")
    dep = derive(str(cfg))
    assert (dep.train, dep.infer, dep.model) == ("tp=2,pp=2,cp=1,ep=1,dp=3", "tp=2,pp=1,dp=2,dp_mode=engines",
                                                 "Qwen/Qwen2.5-7B-Instruct")
    assert {s.what: s.where for s in dep.sources}["tp=2"] == (
        "verl.yaml: actor_rollout_ref.actor.megatron.tensor_model_parallel_size = 2")

"""The Megatron train keys from the CLI and the API: ``mla_down_proj=`` (the MLA down-projection split),
``rank_order=`` / ``use_tp_pp_dp_mapping=`` (Megatron-Bridge's rank order), and the router's expert_bias shown
as a buffer: `layout show`, `plan`, `run` (a real gloo refit) and ``api.plan_refit``."""

from __future__ import annotations

import json

import pytest

from reshardctl import api
from reshardctl.cli import main

MLA = ["--model", "tiny-deepseek", "--layers", "2"]


@pytest.fixture(autouse=True)
def _no_profile_path(monkeypatch):
    monkeypatch.delenv("RESHARDCTL_PROFILE_PATH", raising=False)


def show_json(capsys, *args) -> dict:
    assert main(["layout", "show", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_layout_show_boxes_differ_between_the_two_mla_splits(capsys):
    """The default (TE spec) holds q_a_proj whole on every rank; mla_down_proj=column splits its rows over tp."""
    base = [*MLA, "--side", "train", "--tensor", "*layers.0.self_attn.q_a_proj.weight"]
    rep = show_json(capsys, *base, "--train", "tp=2,dp=2")["sides"]["train"]
    col = show_json(capsys, *base, "--train", "tp=2,dp=2,mla_down_proj=column")["sides"]["train"]
    (row_rep,), (row_col,) = rep["tensors"], col["tensors"]
    assert row_rep["shape"] == [256, 512]
    assert row_rep["holders"] == [{"ranks": [0, 1, 2, 3], "boxes": [[[0, 256], [0, 512]]]}]
    assert row_col["holders"] == [{"ranks": [0, 2], "boxes": [[[0, 128], [0, 512]]]},
                                  {"ranks": [1, 3], "boxes": [[[128, 256], [0, 512]]]}]
    assert "mla_down_proj=column" in col["layout"] and "local spec ColumnParallelLinear" in col["rules"]


def test_layer_spec_and_split_disagreeing_is_exit_2_naming_both(capsys):
    base = ["layout", "show", *MLA, "--side", "train", "--rank", "0"]
    assert main(base + ["--train", "tp=2,dp=2", "--megatron-spec", "local"]) == 2
    err = capsys.readouterr().err
    assert "megatron layer spec 'local' builds MLA linear_q_down_proj / linear_kv_down_proj as ColumnParallelLinear " \
           "(split over tp=2), but the train layout has mla_down_proj=replicated (the default)" in err
    assert "give mla_down_proj=column in the train parallel string" in err and "Traceback" not in err
    assert main(base + ["--train", "tp=2,dp=2,mla_down_proj=column"]) == 2  # --megatron-spec te (default)
    assert "'te' builds MLA" in capsys.readouterr().err
    params = show_json(capsys, *base[2:], "--train", "tp=2,dp=2,mla_down_proj=column",
                       "--megatron-spec", "local")["sides"]["train"]["params"]
    shapes = {p["param"]: p["shape"] for p in params}
    assert shapes["decoder.layers.0.self_attention.linear_q_down_proj.weight"] == [128, 512]


@pytest.mark.parametrize("args,message", [
    (["--model", "tiny-llama", "--train", "tp=2,mla_down_proj=column"],
     "--train: mla_down_proj=column given but model tiny-llama has no MLA (kv_lora_rank=0)"),
    ([*MLA, "--infer", "tp=2,mla_down_proj=column"], "--infer: mla_down_proj is not a vLLM option"),
    ([*MLA, "--infer", "tp=2,use_tp_pp_dp_mapping=true"], "--infer: rank_order is not a vLLM option"),
    ([*MLA, "--train", "tp=2,mla_down_proj=row"], "--train: mla_down_proj='row': expected one of replicated, column"),
    (["--model", "tiny-qwen3-moe", "--train", "tp=1,pp=2,ep=2,etp=1,rank_order=tp-cp-ep-pp-dp,vocab_divisor=128"],
     "etp x ep must equal tp x cp, but etp(1) x ep(2) = 2 and tp(1) x cp(1) = 1"),
])
def test_plan_refuses_the_keys_where_they_do_not_apply(capsys, args, message):
    assert main(["plan", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_layout_show_prints_the_router_bias_as_a_buffer(capsys):
    side = show_json(capsys, *MLA, "--train", "tp=2,dp=2", "--side", "train", "--rank", "0")["sides"]["train"]
    params = side["params"]
    buffers = [p["param"] for p in params if p["buffer"]]
    assert buffers == ["decoder.layers.1.mlp.router.expert_bias"]
    assert main(["layout", "show", *MLA, "--train", "tp=2,dp=2", "--side", "train", "--rank", "0",
                 "--tensor", "*e_score_correction_bias"]) == 0
    out = capsys.readouterr().out
    assert "decoder.layers.1.mlp.router.expert_bias  [16] float32  (buffer)" in out
    assert "router.weight" not in out


def test_layout_show_stages_in_bridge_rank_order(capsys):
    for key in ("use_tp_pp_dp_mapping=true", "rank_order=tp-cp-ep-pp-dp"):
        side = show_json(capsys, "--model", "tiny-llama", "--train", f"tp=2,pp=2,dp=2,{key}", "--side", "train",
                         "--tensor", "model.norm.weight")["sides"]["train"]
        assert side["stages"] == [[0, 1, 4, 5], [2, 3, 6, 7]]
        assert side["tensors"][0]["holders"] == [{"ranks": [2, 3, 6, 7], "boxes": [[[0, 1024]]]}]
    default = show_json(capsys, "--model", "tiny-llama", "--train", "tp=2,pp=2,dp=2", "--side", "train",
                        "--tensor", "model.norm.weight")["sides"]["train"]
    assert default["stages"] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_plan_refit_takes_both_keys():
    plan = api.plan_refit(model="tiny-deepseek", layers=2, train="tp=2,dp=2,mla_down_proj=column",
                          infer="tp=2,dp=2")
    assert plan.train.mla_down_proj == "column"
    i = plan.model.index("model.layers.0.self_attn.kv_a_proj_with_mqa.weight")
    rows, cols = plan.model.tensors[i].shape
    assert plan.train.placement(i).holding(1) == (((rows // 2, rows), (0, cols)),)
    plan = api.plan_refit(model="tiny-llama", train="tp=1,pp=2,dp=2,use_tp_pp_dp_mapping=true", infer="tp=2,dp=2")
    assert plan.train.stage_ranks(1) == (1, 3)


def test_run_refits_with_bridge_rank_order_and_column_mla(tmp_path, capsys):
    """A real gloo refit (4 trainer + 4 inference processes) with Megatron-Bridge's rank order (stage 1 on
    trainer ranks 1 and 3) of an MLA model, both transports: verified, every rank committed."""
    out = tmp_path / "run"
    code = main(["run", *MLA, "--train", "tp=1,pp=2,dp=2,use_tp_pp_dp_mapping=true,mla_down_proj=column",
                 "--infer", "tp=2,dp=2", "--iters", "1", "--out", str(out), "--json"])
    assert code == 0, capsys.readouterr().err
    summary = json.loads(capsys.readouterr().out)
    assert set(summary["transports"]) == {"reshard", "gather_broadcast"}  # the point-to-point plan and the
    for s in summary["transports"].values():                             # per-stage gather and broadcast
        assert s["verified"] and s["failures"] == []
    assert summary["ok"] and "use_tp_pp_dp_mapping=true" in summary["request"]["train"]
    commits = [json.loads(line) for f in sorted((out / "events").glob("rank-*.jsonl"))
               for line in f.read_text().splitlines() if '"commit"' in line]
    assert len({c["rank"] for c in commits}) == 8 and all(c.get("committed") for c in commits)


def test_layout_export_in_bridge_rank_order_loads_back_the_same_placements(capsys, tmp_path):
    """`layout export` writes the Bridge order's ranks; the file loads back to the same holdings per rank and
    the same stages (gather and broadcast per stage need them)."""
    from reshardctl.layout.build import build_layout
    from reshardctl.layout.layout_file import load_layout_file
    from reshardctl.models import load_model

    spec = "tp=2,pp=2,dp=2,ep=2,etp=1,use_tp_pp_dp_mapping=true"
    f = tmp_path / "train.json"
    assert main(["layout", "export", "--model", "tiny-qwen3-moe", "--side", "train", "--train", spec,
                 "--out", str(f)]) == 0, capsys.readouterr().err
    m = load_model("tiny-qwen3-moe")
    direct, loaded = build_layout(m, "train", spec), load_layout_file(f, m, "train")
    assert [loaded.stage_ranks(p) for p in range(2)] == [direct.stage_ranks(p) for p in range(2)]
    assert direct.stage_ranks(1) == (2, 3, 6, 7)
    for i in range(len(m.tensors)):
        assert dict(loaded.placement(i).items()) == dict(direct.placement(i).items()), m.tensors[i].name

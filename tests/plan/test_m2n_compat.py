"""NCCL m2n.reshard compatibility: each documented limit triggers (and only it), grouping by reason."""

from __future__ import annotations

from helpers.plan_fixtures import SplitLayout, toy_model
from reshardctl.layout.build import build_layout
from reshardctl.layout.dtensor import DTensorLayout, Mesh, Partial, Replicate, Rule, Shard, to_template
from reshardctl.layout.placement import Placement, ShardTemplate
from reshardctl.models import load_model
from reshardctl.plan.m2n_compat import check, inferred_mesh_ndim, m2n_compat, summary_line
from reshardctl.topology import Topology


def topo(t, i):
    return Topology(t, i, gpus_per_node=8, nodes_per_domain=1)


def reasons(results):
    return {r.name: r.reasons for r in results}


def test_framework_layouts_compatible():
    m = load_model("tiny-llama")
    tr, inf = build_layout(m, "train", "tp=2,pp=2", "megatron"), build_layout(m, "infer", "tp=2,dp=2", "vllm")
    s = m2n_compat(m, tr, inf, topo(4, 4))
    assert s["incompatible_tensors"] == 0 and s["compatible_tensors"] == len(m.tensors)
    assert s["compatible_bytes"] == m.num_bytes and s["mesh_source"] == ["inferred"]
    assert "39/39 tensors" in summary_line(s)


def test_non_contiguous_ranks():
    m = toy_model([(8, 4), (8, 4)])
    # two stages, ranks permuted: stage 0 on {0, 2}, stage 1 on {1, 3}
    tr = SplitLayout(m, "train", shards=2, stages=2, perm=[0, 2, 1, 3])
    inf = SplitLayout(m, "infer", shards=2)
    res = check(m, tr, inf, topo(4, 2))
    assert all(r.reasons == ("train_not_contiguous",) for r in res)
    ok = check(m, SplitLayout(m, "train", shards=2, stages=2), inf, topo(4, 2))
    assert all(r.ok for r in ok)


def test_tensor_rank():
    m = toy_model([(2, 2, 2, 2), (2, 2, 2)])
    res = reasons(check(m, SplitLayout(m, "train", 2), SplitLayout(m, "infer", 2), topo(2, 2)))
    assert res == {"t0.weight": ("tensor_rank",), "t1.weight": ()}


def test_fan_in_and_fan_out():
    m = toy_model([(40, 4), (16, 4)])
    res = check(m, SplitLayout(m, "train", 20), SplitLayout(m, "infer", 1), topo(20, 1))
    by = {r.name: r for r in res}
    assert by["t0.weight"].reasons == ("fan_in",) and by["t0.weight"].values["fan_in"] == 20
    assert by["t1.weight"].ok and by["t1.weight"].values["fan_in"] == 16  # 16 is allowed
    m2 = toy_model([(70, 2), (64, 2)])
    res2 = check(m2, SplitLayout(m2, "train", 1), SplitLayout(m2, "infer", 70), topo(1, 70))
    by2 = {r.name: r for r in res2}
    assert by2["t0.weight"].reasons == ("fan_out",) and by2["t0.weight"].values["fan_out"] == 70
    assert by2["t1.weight"].ok  # 64 targets (6 of the 70 ranks hold nothing of a 64-row tensor)


def test_inferred_mesh_ndim():
    tpl = ShardTemplate((4, 4), (
        (((0, 2), (0, 2)),), (((0, 2), (2, 4)),), (((2, 4), (0, 2)),), (((2, 4), (2, 4)),),
        (((0, 2), (0, 2)),), (((0, 2), (2, 4)),), (((2, 4), (0, 2)),), (((2, 4), (2, 4)),),
    ))
    assert inferred_mesh_ndim(Placement(tpl, tuple(range(8)))) == 3  # 2 split dims + replicas
    rows = ShardTemplate((4, 4), ((((0, 2), (0, 4)),), (((2, 4), (0, 4)),)) * 2)
    assert inferred_mesh_ndim(Placement(rows, (0, 1, 2, 3))) == 2  # tp x dp
    rep = ShardTemplate((4,), ((((0, 4),),),) * 3)
    assert inferred_mesh_ndim(Placement(rep, (0, 1, 2))) == 1


def test_mesh_from_dtensor_rules_and_explicit():
    m = toy_model([(8, 8), (8,)])
    mesh3 = Mesh.of((2, 2, 2), ("a", "b", "c"))
    mesh1 = Mesh.of((8,), ("dp",))
    rules = [Rule("t0.*", mesh3, (Shard(0), Replicate(), Replicate())), Rule("t1.*", mesh1, (Shard(0),))]
    tr = DTensorLayout(m, "train", 8, rules)
    inf = SplitLayout(m, "infer", 2)
    res = {r.name: r for r in check(m, tr, inf, topo(8, 2))}
    # the mesh of t0 is 3-D even though its placement alone looks 2-D (split dim 0 + replicas)
    assert res["t0.weight"].reasons == ("train_mesh_ndim",)
    assert res["t0.weight"].values["train_mesh_source"] == "mesh"
    assert inferred_mesh_ndim(tr.placement(0)) == 2
    assert res["t1.weight"].ok
    # an explicit placement (no rule) is inferred from the placement: 2 split dims + replicas = 3-D
    expl = {"t0.weight": to_template((8, 8), mesh3, (Shard(0), Shard(1), Replicate()), what="t0")}
    tr2 = DTensorLayout(m, "train", 8, [Rule("t1.*", mesh1, (Shard(0),))], explicit=expl)
    res2 = {r.name: r for r in check(m, tr2, inf, topo(8, 2))}
    assert res2["t0.weight"].reasons == ("train_mesh_ndim",)
    assert res2["t0.weight"].values["train_mesh_source"] == "inferred"


class MeshSplit(SplitLayout):
    """A layout that exposes a mesh per tensor (``mesh_for``), here with a Partial placement."""

    def mesh_for(self, index):
        return Mesh.of((self.world_size,)), (Partial(),)


def test_partial_and_summary_grouping():
    m = toy_model([(4, 4), (6, 2), (2, 2, 2, 2)], dtype="float32")
    res = check(m, SplitLayout(m, "train", 2), MeshSplit(m, "infer", 2), topo(2, 2))
    assert all("infer_partial" in r.reasons for r in res)
    s = m2n_compat(m, SplitLayout(m, "train", 2), MeshSplit(m, "infer", 2), topo(2, 2))
    assert s["compatible_tensors"] == 0 and s["incompatible_tensors"] == 3
    assert s["incompatible_bytes"] == m.num_bytes
    g = s["reasons"]
    assert g["infer_partial"]["tensors"] == 3 and g["infer_partial"]["examples"] == ["t0.weight", "t1.weight", "t2.weight"]
    assert g["tensor_rank"] == {"description": "tensor has more than 3 dims", "tensors": 1, "bytes": 64,
                                "examples": ["t2.weight"], "max": 4}
    assert list(g) == ["infer_partial", "tensor_rank"]  # most tensors first
    line = summary_line(s)
    assert "0/3 tensors" in line and "3 not" in line and "Partial" in line

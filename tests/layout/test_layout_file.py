"""Generic layout files: rules, validation messages, export/load round trip."""

from __future__ import annotations

import json
import os
import textwrap

import pytest

from reshardctl.errors import LayoutError
from reshardctl.layout.dtensor import DTensorLayout, Mesh, Replicate, Rule, Shard, StridedShard, fsdp2_tp
from reshardctl.layout.layout_file import export_layout_file, layout_to_doc, load_layout_file
from reshardctl.layout.placement import Placement, ShardTemplate
from reshardctl.layout.side import SideLayout
from reshardctl.models.spec import ModelDims, ModelSpec, TensorSpec


def tiny_model(layers: int = 2) -> ModelSpec:
    ts = [TensorSpec("model.embed_tokens.weight", (10, 8), "bfloat16", "embedding", "embed")]
    for l in range(layers):
        p = f"model.layers.{l}."
        ts += [
            TensorSpec(p + "input_layernorm.weight", (8,), "bfloat16", "norm", "input_norm", l),
            TensorSpec(p + "self_attn.q_proj.weight", (13, 8), "bfloat16", "attention", "q", l),
            TensorSpec(p + "self_attn.o_proj.weight", (8, 13), "bfloat16", "attention", "o", l),
            TensorSpec(p + "mlp.gate.e_score_correction_bias", (5,), "float32", "router", "router_bias", l),
        ]
    ts += [
        TensorSpec("model.norm.weight", (8,), "bfloat16", "norm", "final_norm"),
        TensorSpec("lm_head.weight", (10, 8), "bfloat16", "head", "lm_head"),
    ]
    dims = ModelDims("llama", 8, layers, 1, 1, 8, 10, 16)
    return ModelSpec("tiny", dims, tuple(ts))


RULES = """
world_size: 8
meshes:
  m: {shape: [2, 4], dim_names: [dp, tp], ranks: [[7, 6, 5, 4], [3, 2, 1, 0]]}
rules:
  - match: "model.layers.*.self_attn.q_proj.weight"
    mesh: m
    placements: ["Replicate()", "Shard(0)"]
    shape: [13, 8]
    dtype: bfloat16
  - match: "re:model\\\\.layers\\\\.\\\\d+\\\\.self_attn\\\\.o_proj\\\\.weight"
    mesh: m
    placements: [{shard: 0}, {shard: -1}]
  - match: "*embed_tokens*"
    mesh: {shape: [8], dim_names: [fsdp]}
    placements: ["_StridedShard(0, 2)"]
  - match: "lm_head.weight"
    mesh: m
    placements: ["_S(0, 4)", "Shard(0)"]
    fsdp2_physical: true
default:
  mesh: {shape: [8], dim_names: [dp]}
  placements: [Replicate()]
"""


def write(tmp_path, text, name="layout.yaml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def test_rules_first_match_and_default(tmp_path):
    model = tiny_model()
    lay = load_layout_file(write(tmp_path, RULES), model, "train")
    assert isinstance(lay, DTensorLayout) and lay.world_size == 8 and lay.num_stages() == 1
    q = lay.placement(model.index("model.layers.1.self_attn.q_proj.weight"))
    # mesh coord (0, 0) is rank 7: tp chunk 0 of 13 rows = rows [0, 4)
    assert q.holding(7) == (((0, 4), (0, 8)),) and q.holding(4) == (((12, 13), (0, 8)),)
    assert q.holding(3) == q.holding(7)  # replicated over dp
    o = lay.placement(model.index("model.layers.0.self_attn.o_proj.weight"))
    assert o.holding(7) == (((0, 4), (0, 4)),)  # Shard(-1) == Shard(1)
    emb = lay.placement(model.index("model.embed_tokens.weight"))
    assert emb.holding(0) == (((0, 1), (0, 8)), ((5, 6), (0, 8)))  # strided: non-contiguous rows
    head = lay.placement(model.index("lm_head.weight"))
    phys = fsdp2_tp((10, 8), tp=4, dp=2, mesh=Mesh.of((2, 4), ("dp", "tp"), [[7, 6, 5, 4], [3, 2, 1, 0]]))
    assert all(head.holding(r) == s.boxes() for r, s in phys.items())
    norm = lay.placement(model.index("model.norm.weight"))
    assert all(norm.holding(r) == (((0, 8),),) for r in range(8))
    # identical (shape, mesh shape, placements) share a template object across tensors
    q0 = lay.placement(model.index("model.layers.0.self_attn.q_proj.weight"))
    assert q0.template is q.template
    assert "dtensor" in lay.describe()


def errors_of(tmp_path, text, model=None, name="layout.yaml") -> str:
    p = write(tmp_path, text, name)
    with pytest.raises(LayoutError) as e:
        load_layout_file(p, model or tiny_model(), "train")
    msg = str(e.value)
    assert all(v.startswith(str(p)) for v in e.value.violations), msg
    return msg


def test_errors_name_file_key_path_and_problem(tmp_path):
    msg = errors_of(tmp_path, """
        world_size: 4
        colour: blue
        rules:
          - match: "*q_proj*"
            mesh: {shape: [2, 2], dim_names: [dp, tp], ranks: [[0, 1], [2, 9]]}
            placements: [Replicate(), Shard(x)]
            extra: 1
          - match: "*o_proj*"
            mesh: nope
            placements: [R, R]
        default:
          mesh: {shape: [4], rank: [0, 1, 2, 3]}
          placements: [R]
    """)
    assert "top level: unknown key 'colour'" in msg
    assert "rules[0]: unknown key 'extra'" in msg
    assert "rules[0].placements[1]: bad placement 'Shard(x)'" in msg
    assert "rules[1].mesh: no mesh named 'nope'" in msg
    assert "default.mesh: unknown key 'rank'" in msg


def test_ranks_beyond_world_size_and_unmatched(tmp_path):
    msg = errors_of(tmp_path, """
        world_size: 4
        rules:
          - match: "*q_proj*"
            mesh: {shape: [2, 3], dim_names: [dp, tp]}
            placements: [Replicate(), Shard(0)]
    """, tiny_model(layers=5))
    assert "rules[0]: mesh ranks [4, 5] >= world_size 4" in msg
    assert "18 tensors match no rule and there is no default: model.embed_tokens.weight" in msg
    assert "and 8 more" in msg


def test_partial_and_shape_checks(tmp_path):
    msg = errors_of(tmp_path, """
        world_size: 2
        rules:
          - match: "*o_proj*"
            mesh: {shape: [2], dim_names: [tp]}
            placements: [Partial(sum)]
          - match: "*q_proj*"
            mesh: {shape: [2], dim_names: [tp]}
            placements: [Shard(2)]
            shape: [12, 8]
        default: {mesh: {shape: [2], dim_names: [dp]}, placements: [Replicate()]}
    """)
    assert (
        "rules[0]: Partial(sum) on mesh dim 'tp' of model.layers.0.self_attn.o_proj.weight: a partial sum "
        "cannot be byte-copied; reduce it to Replicate/Shard before the refit" in msg
    )
    assert "rules[1]: model.layers.0.self_attn.q_proj.weight has shape [13, 8], rule expects [12, 8]" in msg
    assert "Shard(2) on mesh dim 'tp' of model.layers.0.self_attn.q_proj.weight: tensor has 2 dims" in msg


def test_bad_files(tmp_path):
    assert "not valid JSON" in errors_of(tmp_path, "{nope", name="x.json")
    assert "world_size: expected an int between 1 and 1,048,576 (MAX_WORLD), got None" in errors_of(tmp_path, "rules: []\n")
    with pytest.raises(LayoutError, match="cannot read"):
        load_layout_file(tmp_path / "missing.yaml", tiny_model(), "train")


class ScrambledLayout(SideLayout):
    """A hand-written non-DTensor layout: multiple boxes per slot, several slots per rank, 2 stages."""

    def __init__(self, model):
        self.model, self.side, self.world_size = model, "infer", 4
        self._t: dict = {}

    def describe(self):
        return "scrambled"

    def placement(self, i):
        t = self.model.tensors[i]
        rows = t.shape[0]
        h = ((((0, 1),) + tuple((0, n) for n in t.shape[1:]), ((rows - 1, rows),) + tuple((0, n) for n in t.shape[1:])),
             ((((1, rows - 1),) + tuple((0, n) for n in t.shape[1:])),), ())
        tpl = self._t.setdefault(t.shape, ShardTemplate(t.shape, h))
        return Placement(tpl, (i % 4, (i + 1) % 4, (i + 2) % 4))

    def num_stages(self):
        return 2

    def stage_of(self, i):
        return 0 if i < len(self.model.tensors) // 2 else 1

    def stage_ranks(self, s):
        return (0, 1) if s == 0 else (2, 3)


def assert_same(a: SideLayout, b: SideLayout):
    assert a.world_size == b.world_size and a.num_stages() == b.num_stages()
    for s in range(a.num_stages()):
        assert tuple(a.stage_ranks(s)) == tuple(b.stage_ranks(s))
    for i in range(len(a.model.tensors)):
        pa, pb = a.placement(i), b.placement(i)
        assert pa.ranks == pb.ranks and pa.template.shape == pb.template.shape
        assert pa.template.holdings == pb.template.holdings
        assert a.stage_of(i) == b.stage_of(i)


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_export_round_trip(tmp_path, suffix):
    model = tiny_model()
    src = load_layout_file(write(tmp_path, RULES), model, "train")
    out = export_layout_file(src, tmp_path / f"explicit{suffix}")
    back = load_layout_file(out, model, "train")
    assert_same(src, back)
    # templates shared by several tensors are written once and come back as one object
    doc = layout_to_doc(src)
    assert len(doc["templates"]) < len(doc["tensors"])
    q = [model.index(f"model.layers.{l}.self_attn.q_proj.weight") for l in range(2)]
    assert back.placement(q[0]).template is back.placement(q[1]).template
    # exporting the reloaded layout gives the same document
    assert layout_to_doc(back) == doc
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]


def test_export_round_trip_any_side_layout(tmp_path):
    model = tiny_model(3)
    src = ScrambledLayout(model)
    out = export_layout_file(src, tmp_path / "s.json")
    back = load_layout_file(out, model, "infer")
    assert_same(src, back)
    with pytest.raises(LayoutError, match="side: file is for 'infer'"):
        load_layout_file(out, model, "train")


def test_explicit_form_errors(tmp_path):
    model = tiny_model()
    doc = layout_to_doc(load_layout_file(write(tmp_path, RULES), model, "train"))
    doc["tensors"]["model.nope.weight"] = {"template": 0, "ranks": [0]}
    doc["tensors"]["model.norm.weight"] = {"template": 99, "ranks": [0]}
    doc["templates"].append({"shape": [4], "slots": [[[[0, 5]]]]})
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(doc))
    msg = errors_of(tmp_path, p.read_text(), model, name="bad.json")
    assert "tensors: 1 names not in model tiny: model.nope.weight" in msg
    assert "tensors['model.norm.weight']: template 99 is not a valid index" in msg
    assert "templates[" in msg and "outside shape [4]" in msg


def test_rule_stage_and_direct_construction():
    model = tiny_model()
    m0, m1 = Mesh.of((2,), ("tp",), [0, 1]), Mesh.of((2,), ("tp",), [3, 2])
    lay = DTensorLayout(
        model, "train", 4,
        [Rule("model.layers.1.*", m1, (Shard(0),), stage=1), Rule("lm_head.weight", m1, (Replicate(),), stage=1)],
        Rule("*", m0, (StridedShard(0, 1),)),
    )
    assert lay.num_stages() == 2
    assert lay.stage_ranks(0) == (0, 1) and lay.stage_ranks(1) == (2, 3)
    assert lay.stage_of(model.index("lm_head.weight")) == 1 and lay.stage_of(0) == 0


def test_inline_explicit_entry_mixed_with_rules(tmp_path):
    model = tiny_model()
    p = write(tmp_path, """
        world_size: 4
        tensors:
          model.norm.weight: {shape: [8], slots: [[[[0, 8]]], [[[0, 8]]]], ranks: [0, 1]}
        default: {mesh: {shape: [4]}, placements: [R]}
    """)
    lay = load_layout_file(p, model, "train")
    assert lay.placement(model.index("model.norm.weight")).ranks == (0, 1)
    assert lay.placement(0).ranks == (0, 1, 2, 3)


def test_parse_and_layout_problems_of_one_file_reported_together(tmp_path):
    """A bad placement does not hide the layout checks: the mesh larger than the world and a Shard(5)
    on a 1-D tensor are reported in the same message."""
    msg = errors_of(tmp_path, """
        world_size: 4
        rules:
          - match: "*q_proj*"
            mesh: {shape: [2, 2], dim_names: [dp, tp]}
            placements: [Replicate(), Shard(x)]
          - match: "*o_proj*"
            mesh: {shape: [8], dim_names: [tp]}
            placements: [Shard(0)]
          - match: "*layernorm*"
            mesh: {shape: [4], dim_names: [tp]}
            placements: [Shard(5)]
        default: {mesh: {shape: [4], dim_names: [dp]}, placements: [Replicate()]}
    """)
    assert "rules[0].placements[1]: bad placement 'Shard(x)'" in msg
    assert "rules[1]: mesh ranks [4, 5, 6, 7] >= world_size 4" in msg
    assert "Shard(5)" in msg and "model.layers.0.input_layernorm.weight: tensor has 1 dims" in msg
    assert "match no rule" not in msg and "rules[0]: model.layers" not in msg


def test_failed_layout_file_keeps_its_world_size(tmp_path):
    p = write(tmp_path, """
        world_size: 6
        rules: [{match: "*", mesh: {shape: [6]}, placements: [Shard(9)]}]
    """)
    with pytest.raises(LayoutError) as e:
        load_layout_file(p, tiny_model(), "train")
    assert e.value.world_size == 6

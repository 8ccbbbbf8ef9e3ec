"""save_plan / load_plan: one .npz (no pickle), atomic, round trip = same steps on every rank and the
same fingerprint; a file loaded against other inputs (or damaged) is a PlanError naming file and cause."""

from __future__ import annotations

import json
import zipfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers.plan_fixtures import SplitLayout, toy_model
from reshardctl.errors import PlanError
from reshardctl.layout.build import build_layout
from reshardctl.models import load_model
from reshardctl.plan.refit_plan import TRANSPORTS
from reshardctl.plan.planner import build_plan, fingerprint
from reshardctl.plan_files.serialize import FORMAT, load_plan, read_meta, save_plan
from reshardctl.topology import Topology


def assert_same(a, b) -> None:
    assert a.fingerprint == b.fingerprint == fingerprint(b)
    assert (a.transport, a.bucket_bytes, a.relay) == (b.transport, b.bucket_bytes, b.relay)
    assert a.num_transfers == b.num_transfers and len(a.rounds) == len(b.rounds) and a.buckets == b.buckets
    for r in range(a.world):
        assert a.steps_for(r) == b.steps_for(r), f"rank {r}"
    assert list(a.iter_transfers()) == list(b.iter_transfers())


def toy_inputs():
    m = toy_model([(8, 6), (5, 7), (9,), (4, 3, 2), (12, 4)], roles=["ffn", "attention", "norm", "expert", "ffn"])
    train = SplitLayout(m, "train", shards=2, replicas=2, dims=(0, 1), stages=1)
    infer = SplitLayout(m, "infer", shards=3, replicas=2, dims=(1, 0))
    topo = Topology(train.world_size, infer.world_size, gpus_per_node=2, nodes_per_domain=2)
    return m, train, infer, topo


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("relay", [False, True])
def test_round_trip_toy(tmp_path, transport, relay):
    m, train, infer, topo = toy_inputs()
    plan = build_plan(m, train, infer, topo, transport=transport, bucket_bytes=64, relay=relay)
    path = save_plan(plan, tmp_path / "p.npz")
    assert [p.name for p in tmp_path.iterdir()] == ["p.npz"]  # no temp files left
    back = load_plan(path, m, train, infer, topo)
    assert_same(plan, back)
    meta = read_meta(path)
    assert meta["format"] == FORMAT and meta["fingerprint"] == plan.fingerprint
    assert meta["inputs"]["train"] == train.describe() and meta["inputs"]["topology"] == topo.describe()
    # plain numpy arrays only: loadable without pickle
    with np.load(path, allow_pickle=False) as z:
        for k in z.files:
            assert z[k].dtype != object


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_round_trip_framework_layouts(tmp_path, transport):
    m = load_model("tiny-qwen3-moe", layers=2)
    train = build_layout(m, "train", "tp=2,pp=2,ep=2", "megatron")
    infer = build_layout(m, "infer", "tp=2,dp=2,ep=4", "vllm")
    topo = Topology(train.world_size, infer.world_size, gpus_per_node=4, nodes_per_domain=1)
    plan = build_plan(m, train, infer, topo, transport=transport, bucket_bytes=1 << 20, relay=True)
    back = load_plan(save_plan(plan, tmp_path / "x" / "p.npz"), m, train, infer, topo)
    assert_same(plan, back)


def test_mismatch_names_file_and_cause(tmp_path):
    m, train, infer, topo = toy_inputs()
    path = save_plan(build_plan(m, train, infer, topo, bucket_bytes=64), tmp_path / "p.npz")
    other = SplitLayout(m, "infer", shards=3, replicas=2, dims=(0,))
    with pytest.raises(PlanError) as e:
        load_plan(path, m, train, other, topo)
    assert str(path) in str(e.value) and "infer" in str(e.value) and "dims=(0,)" in str(e.value)
    m2 = toy_model([(8, 6), (5, 7), (9,), (4, 3, 2), (12, 5)])
    with pytest.raises(PlanError, match="model_digest"):
        load_plan(path, m2, SplitLayout(m2, "train", 2, 2, (0, 1)), SplitLayout(m2, "infer", 3, 2, (1, 0)), topo)
    topo2 = Topology(train.world_size, infer.world_size, gpus_per_node=4, nodes_per_domain=1)
    with pytest.raises(PlanError, match="topology"):
        load_plan(path, m, train, infer, topo2)


def _rewrite(src, dst, change) -> None:
    with np.load(src, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    change(arrays)
    np.savez(dst, **arrays)


def test_damaged_files(tmp_path):
    m, train, infer, topo = toy_inputs()
    path = save_plan(build_plan(m, train, infer, topo, bucket_bytes=64), tmp_path / "p.npz")

    def flip(a):
        a["tab_src"] = a["tab_src"].copy()
        a["tab_src"][0] += 1

    _rewrite(path, tmp_path / "flip.npz", flip)
    with pytest.raises(PlanError, match="plan content differs"):
        load_plan(tmp_path / "flip.npz", m, train, infer, topo)
    _rewrite(path, tmp_path / "short.npz", lambda a: a.pop("round_entries"))
    with pytest.raises(PlanError, match="short.npz"):
        load_plan(tmp_path / "short.npz", m, train, infer, topo)

    def meta(a):
        d = json.loads(bytes(a["meta"]).decode())
        d["format"] = "other/9"
        a["meta"] = np.frombuffer(json.dumps(d).encode(), np.uint8)

    _rewrite(path, tmp_path / "fmt.npz", meta)
    with pytest.raises(PlanError, match="format"):
        load_plan(tmp_path / "fmt.npz", m, train, infer, topo)
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(PlanError, match="junk.npz"):
        load_plan(tmp_path / "junk.npz", m, train, infer, topo)
    with pytest.raises(PlanError, match="no such plan file"):
        load_plan(tmp_path / "missing.npz", m, train, infer, topo)
    assert zipfile.is_zipfile(path)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    shapes=st.lists(st.lists(st.integers(1, 9), min_size=1, max_size=3).map(tuple), min_size=1, max_size=5),
    ts=st.integers(1, 3), tr=st.integers(1, 2), is_=st.integers(1, 4), ir=st.integers(1, 3),
    transport=st.sampled_from(TRANSPORTS), relay=st.booleans(), bucket=st.integers(8, 400),
    gpn=st.integers(1, 4), npd=st.integers(1, 2),
)
def test_round_trip_property(tmp_path, shapes, ts, tr, is_, ir, transport, relay, bucket, gpn, npd):
    m = toy_model(shapes, roles=["ffn" if i % 2 else "attention" for i in range(len(shapes))])
    train = SplitLayout(m, "train", ts, tr, dims=(0, -1))
    infer = SplitLayout(m, "infer", is_, ir, dims=(-1, 0))
    topo = Topology(train.world_size, infer.world_size, gpus_per_node=gpn, nodes_per_domain=npd)
    plan = build_plan(m, train, infer, topo, transport=transport, bucket_bytes=bucket, relay=relay)
    assert_same(plan, load_plan(save_plan(plan, tmp_path / "h.npz"), m, train, infer, topo))

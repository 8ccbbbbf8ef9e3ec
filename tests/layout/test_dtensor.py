"""DTensor algebra against torch 2.13's own placement code (no process group needed)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reshardctl.errors import LayoutError
from reshardctl.layout.dtensor import (
    Mesh,
    Partial,
    Replicate,
    Shard,
    StridedShard,
    coord_index_sets,
    fsdp2_tp,
    fsdp2_tp_placement,
    local_index_sets,
    to_template,
)
from reshardctl.layout.indexset import IndexSet

pinned = pytest.mark.skipif(
    not torch.__version__.startswith("2.13."), reason="oracle uses torch 2.13 private DTensor placement API"
)

if torch.__version__.startswith("2.13."):
    from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset
    from torch.distributed.tensor.placement_types import Replicate as TReplicate
    from torch.distributed.tensor.placement_types import Shard as TShard
    from torch.distributed.tensor.placement_types import _StridedShard as TStrided
    from torch.distributed.tensor.placement_types import _StridedShardOffsetMode


def _torch_placement(p):
    if isinstance(p, Shard):
        return TShard(p.dim)
    if isinstance(p, StridedShard):
        return TStrided(p.dim, split_factor=p.split_factor)
    return TReplicate()


def oracle_indices(shape, mesh_shape, coord, placements) -> list[np.ndarray]:
    """Per tensor dim, the global index list of ``coord`` using torch's split code, nested left to right."""
    idx = [np.arange(n) for n in shape]
    for m, p in enumerate(placements):
        if isinstance(p, Shard):
            pieces, _ = TShard(0)._split_tensor(
                torch.arange(len(idx[p.dim])), mesh_shape[m], with_padding=False, contiguous=False
            )
            idx[p.dim] = idx[p.dim][pieces[coord[m]].numpy()]
        elif isinstance(p, StridedShard):
            _, offs = TStrided(0, split_factor=p.split_factor).local_shard_size_and_offset(
                len(idx[p.dim]), mesh_shape[m], coord[m], offset_mode=_StridedShardOffsetMode.ALL
            )
            idx[p.dim] = idx[p.dim][np.asarray(offs, dtype=np.int64)]
    return idx


def check_against_torch(shape, mesh: Mesh, placements):
    sets = local_index_sets(shape, mesh, placements)
    tpl = [_torch_placement(p) for p in placements]
    strided = any(isinstance(p, StridedShard) for p in placements)
    for coord in mesh.coords():
        ours = sets[mesh.rank_at(coord)]
        want = oracle_indices(shape, mesh.shape, coord, placements)
        for d in range(len(shape)):
            np.testing.assert_array_equal(ours.dims[d].to_indices(), want[d], err_msg=f"{shape} {placements} {coord} dim {d}")
        lshape, goff = _compute_local_shape_and_global_offset(shape, mesh.shape, list(coord), tpl)
        assert lshape == ours.local_shape()
        if not strided:  # (shape, first offset) describes Shard/Replicate exactly
            for d, (n, o) in enumerate(zip(lshape, goff)):
                s = ours.dims[d]
                if n:
                    assert s.intervals == ((o, o + n),)
                elif any(isinstance(p, (Shard, StridedShard)) and p.dim == d for p in placements):
                    assert o == shape[d]  # torch reports an empty shard at offset = dim size


@st.composite
def dtensor_case(draw, allow_strided=True):
    mesh_nd = draw(st.integers(1, 3))
    mesh_shape = tuple(draw(st.lists(st.integers(1, 4), min_size=mesh_nd, max_size=mesh_nd)))
    nd = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(0, 23), min_size=nd, max_size=nd)))
    kinds = ["R", "S", "SS"] if allow_strided else ["R", "S"]
    placements = []
    for _ in range(mesh_nd):
        k = draw(st.sampled_from(kinds))
        if k == "R":
            placements.append(Replicate())
        elif k == "S":
            placements.append(Shard(draw(st.integers(0, nd - 1))))
        else:
            placements.append(StridedShard(draw(st.integers(0, nd - 1)), draw(st.integers(1, 4))))
    perm = draw(st.permutations(range(int(np.prod(mesh_shape)))))
    mesh = Mesh.of(mesh_shape, [f"m{i}" for i in range(mesh_nd)], np.asarray(perm).reshape(mesh_shape))
    return shape, mesh, tuple(placements)


@pinned
@settings(max_examples=700, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dtensor_case(allow_strided=False))
def test_shard_replicate_matches_torch(case):
    check_against_torch(*case)


@pinned
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dtensor_case(allow_strided=True))
def test_strided_matches_torch_all_offsets(case):
    check_against_torch(*case)


@pinned
@settings(max_examples=300, deadline=None)
@given(st.integers(0, 40), st.integers(1, 5), st.integers(1, 5))
def test_two_mesh_dims_one_tensor_dim_nests(n, a, b):
    mesh = Mesh.of((a, b), ("dp", "tp"))
    check_against_torch((n, 3), mesh, (Shard(0), Shard(0)))
    check_against_torch((3, n), mesh, (Shard(1), Shard(1)))


@pinned
def test_strided_noncontiguous_example():
    # torch's _compute_local_shape_and_global_offset (shape, first offset) says rows [6, 8); under
    # _StridedShard the rank really holds {6, 11} (layout/dtensor.py, fsdp2_tp)
    mesh = Mesh.of((3, 2), ("dp", "tp"))
    pl = (StridedShard(0, 2), Shard(0))
    s = local_index_sets((13,), mesh, pl)[mesh.rank_at((2, 0))]
    assert s.dims[0].to_indices().tolist() == [6, 11]
    lshape, goff = _compute_local_shape_and_global_offset((13,), (3, 2), [2, 0], [_torch_placement(p) for p in pl])
    assert (lshape, goff) == ((2,), (6,))
    check_against_torch((13,), mesh, pl)


def test_fsdp2_physical_example_and_difference():
    phys = fsdp2_tp((7,), tp=2, dp=3)
    rows = {r: s.dims[0].to_indices().tolist() for r, s in phys.items()}
    # mesh (dp=3, tp=2), rank = dp*2 + tp
    assert rows == {0: [0, 1], 1: [4], 2: [2, 3], 3: [5], 4: [], 5: [6]}
    desc = local_index_sets((7,), Mesh.of((3, 2), ("dp", "tp")), (StridedShard(0, 2), Shard(0)))
    assert desc[4].dims[0].to_indices().tolist() == [6] and desc[5].dims[0].size == 0


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 40), st.integers(1, 5), st.integers(1, 5))
def test_fsdp2_physical_equals_strided_description_when_even(k, dp, tp):
    n = k * dp * tp
    mesh = Mesh.of((dp, tp), ("dp", "tp"))
    assert fsdp2_tp((n, 2), tp, dp) == local_index_sets((n, 2), mesh, (StridedShard(0, tp), Shard(0)))


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 30), st.integers(1, 4), st.integers(1, 4))
def test_fsdp2_physical_is_tp_then_fsdp_chunk(n, dp, tp):
    phys = fsdp2_tp((n,), tp, dp)
    rows = np.arange(n)
    for i in range(dp):
        for j in range(tp):
            tp_piece = torch.chunk(torch.from_numpy(rows), tp)  # torch.chunk may return fewer chunks
            local = tp_piece[j].numpy() if j < len(tp_piece) else rows[:0]
            f = torch.chunk(torch.from_numpy(local), dp) if local.size else ()
            want = f[i].numpy() if i < len(f) else rows[:0]
            assert phys[i * tp + j].dims[0].to_indices().tolist() == want.tolist()
    # a partition: every row exactly once
    assert sorted(np.concatenate([s.dims[0].to_indices() for s in phys.values()]).tolist()) == rows.tolist()


def test_fsdp2_rejects_uneven_dim1_and_placement_form():
    with pytest.raises(LayoutError, match="dim 0 only"):
        fsdp2_tp((4, 7), tp=1, dp=2, shard_dim=1)
    mesh = Mesh.of((3, 2), ("dp", "tp"), [[5, 4], [3, 2], [1, 0]])
    pl = fsdp2_tp_placement((7, 4), mesh)
    sets = fsdp2_tp((7, 4), 2, 3, mesh=mesh)
    for r, s in sets.items():
        assert pl.holding(r) == s.boxes()


def test_partial_rejected_with_clear_message():
    mesh = Mesh.of((2, 2), ("dp", "tp"))
    with pytest.raises(LayoutError) as e:
        to_template((8, 8), mesh, (Replicate(), Partial()), what="model.layers.0.mlp.down_proj.weight")
    assert str(e.value) == (
        "Partial(sum) on mesh dim 'tp' of model.layers.0.mlp.down_proj.weight: a partial sum cannot be "
        "byte-copied; reduce it to Replicate/Shard before the refit"
    )


def test_mesh_validation():
    with pytest.raises(LayoutError, match="not unique"):
        Mesh.of((2,), ("tp",), [1, 1])
    with pytest.raises(LayoutError, match="ranks array has shape"):
        Mesh.of((2, 2), ("a", "b"), [0, 1, 2, 3])
    with pytest.raises(LayoutError, match="3 ranks"):
        Mesh((2, 2), ("a", "b"), (0, 1, 2))
    with pytest.raises(LayoutError, match="dim names"):
        Mesh.of((2, 2), ("a",))
    assert hash(Mesh((2,), ["tp"], [1, 0])) == hash(Mesh.of((2,), ("tp",), [1, 0]))
    m = Mesh.of((2, 3), ("dp", "tp"), [[5, 4, 3], [2, 1, 0]])
    assert m.rank_at((1, 0)) == 2 and m.coord_of(2) == (1, 0)


def test_templates_interned_and_ranks_follow_mesh():
    a = Mesh.of((2, 3), ("dp", "tp"))
    b = Mesh.of((2, 3), ("x", "y"), [[5, 4, 3], [2, 1, 0]])
    pa = to_template((10, 4), a, (Shard(0), Shard(0)))
    pb = to_template([10, 4], b, [Shard(0), Shard(0)])
    assert pa.template is pb.template
    assert pb.ranks == (5, 4, 3, 2, 1, 0)
    assert pb.holding(5) == (((0, 2), (0, 4)),) and pb.holding(0) == (((9, 10), (0, 4)),)
    assert to_template((10, 4), a, (Shard(0), Shard(1))).template is not pa.template


def test_nested_docstring_example():
    # torch docstring: global (2,5), mesh (DP=2,TP=2), (Shard(1), Shard(1)) -> columns [0,1],[2],[3],[4]
    sets = coord_index_sets((2, 5), (2, 2), (Shard(1), Shard(1)))
    assert [s.dims[1].intervals for s in sets] == [((0, 2),), ((2, 3),), ((3, 4),), ((4, 5),)]
    assert all(s.dims[0].intervals == ((0, 2),) for s in sets)
    assert IndexSet.full((2, 5)).size == 10

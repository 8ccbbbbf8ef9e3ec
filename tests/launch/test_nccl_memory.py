"""NCCL's own device memory in the memory check (launch/memory_check.py ``nccl_bytes``) with the site's caps
(the ``nccl:`` profile keys): the arithmetic, and a run that fits without it refused with it."""

from __future__ import annotations

import pytest

from reshardctl.errors import InputError, ProfileError
from reshardctl.launch.memory_check import RESERVE, check_gpu_memory, nccl_bytes, rank_bytes
from reshardctl.runtime.baseline import pair_bytes
from reshardctl.site.parse import parse_profile
from reshardctl.site.spec import MIB, NcclSpec

from helpers.runtime_plans import p2p_plan, rows_cols_case
from helpers.runtime_plans import alternating_plan

SMALL = NcclSpec(buffsize_mb=1.0, max_channels=2, p2p_channels_per_peer=3)


def test_point_to_point_buffers_per_connected_direction():
    m, src, dst = rows_cols_case()
    plan = p2p_plan(m, src, dst, per_tensor_rounds=True)
    for r in range(4):
        out, inc = pair_bytes(plan, r)
        got = nccl_bytes([plan], r, SMALL)
        assert got["p2p_directions"] == len(out) + len(inc)
        assert got["p2p"] == (len(out) + len(inc)) * 3 * MIB  # 3 channels per direction of 1 MiB
        assert got["communicators"] == 1  # the data group only: no broadcast groups
        assert got["collectives"] == 1 * 2 * 2 * 2 * MIB  # 2 channels x (send + recv) x (SIMPLE + LL128)
        assert got["total"] == got["p2p"] + got["collectives"]


def test_every_broadcast_sub_communicator_and_the_apis_second_world_communicator_count():
    plan = alternating_plan()  # groups (0, 2, 3) and (1, 2, 3): inference ranks are in both
    assert nccl_bytes([plan], 2, SMALL)["communicators"] == 3
    assert nccl_bytes([plan], 0, SMALL)["communicators"] == 2
    assert nccl_bytes([plan], 2, SMALL, api=True)["communicators"] == 4
    assert nccl_bytes([plan], 2, SMALL)["collectives"] == 3 * 8 * MIB
    defaults = nccl_bytes([plan], 2)  # NCCL's defaults: 4 MiB, 32 channels
    assert defaults["collectives"] == 3 * 32 * 2 * 2 * 4 * MIB  # 1.5 GiB: why the caps are profile keys


def test_a_rank_that_fits_without_nccl_is_refused_with_the_arithmetic():
    m, src, dst = rows_cols_case()
    plan = p2p_plan(m, src, dst, per_tensor_rounds=True)
    plans = {"reshard": plan}
    just_weights = lambda r: int(rank_bytes(plan, r) / (1 - RESERVE)) + 1  # noqa: E731
    with pytest.raises(InputError) as info:
        check_gpu_memory(plans, just_weights, SMALL)
    assert "NCCL" in str(info.value) and "p2p directions" in str(info.value)
    enough = lambda r: int((rank_bytes(plan, r) + nccl_bytes(plans, r, SMALL)["total"]) / (1 - RESERVE)) + 2  # noqa: E731
    check_gpu_memory(plans, enough, SMALL)


BASE = {"nodes": 1, "gpus_per_node": 8, "links": {"nvlink_gbytes_per_s": 450, "nic_gbits_per_s": 400}}


def test_the_nccl_profile_keys_are_read_defaulted_and_checked():
    assert parse_profile(BASE, "p.yaml").nccl == NcclSpec()
    got = parse_profile({**BASE, "nccl": {"buffsize_mb": 2, "max_channels": 8, "p2p_channels_per_peer": 1}}, "p.yaml")
    assert got.nccl == NcclSpec(2.0, 8, 1) and got.nccl.buffsize_bytes == 2 * MIB
    with pytest.raises(ProfileError) as info:
        parse_profile({**BASE, "nccl": {"max_channels": 0, "buffsize_mb": -1, "channels": 4}}, "p.yaml")
    text = str(info.value)
    assert "p.yaml" in text and "nccl.max_channels" in text and "nccl.buffsize_mb" in text and "nccl.channels" in text

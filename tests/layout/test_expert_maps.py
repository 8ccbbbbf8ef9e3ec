"""Expert maps (layout/expert_maps.py), property-based: every physical slot is on exactly one EP rank, at the
local index vLLM's determine_expert_map gives it, and holders() inverts slots_per_rank()."""

from __future__ import annotations

import json

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from reshardctl.layout.expert_maps import build_vllm_expert_map, vllm_expert_ranges


@settings(max_examples=80, deadline=None)
@given(E=st.integers(1, 64), ep=st.integers(1, 16), strategy=st.sampled_from(["linear", "round_robin"]))
def test_linear_and_round_robin_partition_the_experts(E, ep, strategy):
    problems: list[str] = []
    emap = build_vllm_expert_map(num_experts=E, ep=ep, strategy=strategy, redundant=0, map_file=None,
                                 moe_layers=(0,), problems=problems)
    if E < ep:
        assert problems and f"needs num_experts >= {ep}" in problems[0]
        return
    slots = emap.slots_per_rank(0)
    assert sorted(e for s in slots for e in s) == list(range(E))
    base, rem = divmod(E, ep)
    assert [len(s) for s in slots] == [base + (j < rem) for j in range(ep)]  # the first rem ranks one more
    for e in range(E):
        ((j, k),) = emap.holders(0, e)
        if strategy == "round_robin":  # torch.arange(ep_rank, E, ep)
            assert (j, k) == (e % ep, e // ep)
        else:
            a, b = vllm_expert_ranges(E, ep)[j]
            assert a <= e < b and k == e - a


@settings(max_examples=60, deadline=None)
@given(data=st.data(), E=st.integers(2, 32), ep=st.integers(1, 8), per_extra=st.integers(0, 3))
def test_eplb_maps_from_a_file(tmp_path_factory, data, E, ep, per_extra):
    R = ep * per_extra  # E + R must divide by ep: pick E a multiple of ep too
    E = max(ep, E - E % ep)
    P = E + R
    per = P // ep
    blocks = []  # a valid live map: each rank a distinct set of experts, every expert somewhere
    perm = data.draw(st.permutations(list(range(E))))
    for j in range(ep):
        own = list(perm[j * (E // ep):(j + 1) * (E // ep)])
        others = [x for x in range(E) if x not in own]
        assume(len(others) >= per - len(own))  # a rank cannot hold one expert twice
        extra = data.draw(st.lists(st.sampled_from(others), min_size=per - len(own), max_size=per - len(own),
                                   unique=True)) if per > len(own) else []
        blocks.append(own + extra)
    phys = [x for b in blocks for x in b]
    path = tmp_path_factory.mktemp("maps") / "m.json"
    path.write_text(json.dumps(phys))
    problems: list[str] = []
    emap = build_vllm_expert_map(num_experts=E, ep=ep, strategy="linear", redundant=R, map_file=str(path),
                                 moe_layers=(3, 5), problems=problems)
    assert not problems
    for layer in (3, 5):
        assert emap.slots_per_rank(layer) == blocks
        for e in range(E):
            want = tuple((p // per, p % per) for p, x in enumerate(phys) if x == e)
            assert emap.holders(layer, e) == want and emap.local_count(layer, 0) == per

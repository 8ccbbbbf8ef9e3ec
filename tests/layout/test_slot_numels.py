"""``ShardTemplate.slot_numels`` (kept with the template) equals ``slot_numel`` of every slot, and cannot
be written through (every plan of a command reads the same array)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reshardctl.layout.placement import ShardTemplate


@st.composite
def templates(draw):
    ndim = draw(st.integers(0, 3))
    shape = tuple(draw(st.lists(st.integers(1, 9), min_size=ndim, max_size=ndim)))
    slots = []
    for _ in range(draw(st.integers(1, 6))):
        boxes = []
        for _ in range(draw(st.integers(0, 3))):  # a slot may hold nothing, or several boxes
            box = []
            for n in shape:
                a = draw(st.integers(0, n - 1))
                box.append((a, draw(st.integers(a, n))))  # an empty extent too
            boxes.append(tuple(box))
        slots.append(tuple(boxes))
    return ShardTemplate(shape, tuple(slots))


@settings(max_examples=200, deadline=None, derandomize=True)
@given(tpl=templates())
def test_slot_numels_is_slot_numel_of_every_slot(tpl):
    got = tpl.slot_numels()
    assert got.dtype == np.int64 and got.tolist() == [tpl.slot_numel(s) for s in range(tpl.num_slots)]
    assert tpl.slot_numels() is got  # once per template
    with pytest.raises(ValueError):
        got[0] = 1


def test_the_cache_leaves_equality_and_hash_alone():
    a = ShardTemplate((4, 2), ((((0, 2), (0, 2)),), (((2, 4), (0, 2)),)))
    b = ShardTemplate((4, 2), ((((0, 2), (0, 2)),), (((2, 4), (0, 2)),)))
    a.slot_numels()
    assert a == b and hash(a) == hash(b)

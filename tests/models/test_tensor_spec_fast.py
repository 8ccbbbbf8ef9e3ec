"""``tensor_spec`` (the model builder's constructor, through the slots' setters) makes the object
``TensorSpec(...)`` makes: equal, the same hash, the same derived ``numel`` / ``nbytes``, frozen; and every
tensor of every catalog model is what the dataclass constructor gives for its fields."""

from __future__ import annotations

import dataclasses
from math import prod

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reshardctl.models import load_model
from reshardctl.models.catalog import PRESETS
from reshardctl.models.spec import DTYPE_BYTES, KINDS, ROLES, TensorSpec, tensor_spec

_opt_int = st.none() | st.integers(0, 10**6)


@given(name=st.text(max_size=40), shape=st.lists(st.integers(0, 10**5), max_size=4).map(tuple),
       dtype=st.sampled_from(sorted(DTYPE_BYTES)), role=st.sampled_from(ROLES), kind=st.sampled_from(KINDS),
       layer=_opt_int, expert=_opt_int, scale_of=st.none() | st.text(max_size=20))
def test_same_object_as_the_dataclass_constructor(name, shape, dtype, role, kind, layer, expert, scale_of):
    want = TensorSpec(name, shape, dtype, role, kind, layer, expert, scale_of=scale_of)
    got = tensor_spec(name, shape, dtype, role, kind, layer, expert, scale_of, prod(shape))
    assert got == want and hash(got) == hash(want) and repr(got) == repr(want)
    assert (got.numel, got.nbytes) == (want.numel, want.nbytes) == (prod(shape), prod(shape) * DTYPE_BYTES[dtype])
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.name = "other"


@pytest.mark.parametrize("name", PRESETS)
def test_every_catalog_tensor_is_the_constructors(name):
    for t in load_model(name).tensors:
        fields = {f.name: getattr(t, f.name) for f in dataclasses.fields(TensorSpec) if f.init}
        again = TensorSpec(**fields)
        assert t == again and (t.numel, t.nbytes) == (again.numel, again.nbytes)

"""reshardctl/units.py: one unit per series, picked from its largest value, and the strings of one value."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from reshardctl.units import BYTE_UNITS, TIME_UNITS, byte_unit, seconds, size, time_unit

finite = st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False)


@given(st.lists(finite, min_size=1, max_size=20))
def test_the_time_unit_reads_the_largest_value_between_1_and_1000(values):
    name, scale = time_unit(values)
    top = max(values)
    assert (name, scale) in TIME_UNITS
    if top >= 1e-6:
        assert 1 <= top / scale and (top / scale < 1000 or name == "s"), (values, name)
    else:
        assert name == "us"


@given(st.lists(st.integers(min_value=0, max_value=1 << 50), min_size=1, max_size=20))
def test_the_byte_unit_reads_the_largest_value_between_1_and_1024(values):
    name, scale = byte_unit(values)
    top = max(values)
    assert (name, scale) in BYTE_UNITS
    assert top / scale < 1024 or name == "TiB"
    assert top == 0 or top / scale >= 1


def test_missing_and_non_finite_values_are_ignored_or_a_dash():
    assert time_unit([None, math.nan, math.inf, 0.25]) == ("ms", 1e-3)
    assert seconds(None) == seconds(math.nan) == seconds(True) == size(None) == "-"


def test_one_value_strings():
    assert [seconds(x) for x in (3e-4, 0.6787, 1.2)] == ["300 us", "678.70 ms", "1.200 s"]
    assert [size(n) for n in (512, 175000 * 1024, 3 * 2**30 + 2**29)] == ["512 B", "171 MiB", "3.5 GiB"]

"""``step_errors``: a wait's failure said with its step (the failure record's round, step kind and peers,
runtime/refit.py ``failure_record``), another rank's failure kept as the knock-on it is."""

from __future__ import annotations

import pytest

from reshardctl.errors import TransferError
from reshardctl.runtime.bounded_wait import Abandoned
from reshardctl.runtime.step_state import Pending, step_errors

WHAT = "rank 5: round 7 with ranks [1, 9]"


def _pending() -> Pending:
    return Pending("round", 7, [1, 9])


@pytest.mark.parametrize("raised", [RuntimeError("Connection closed by peer"), TransferError("aborted")])
def test_a_failed_communicator_is_a_transfer_error_naming_the_step(raised):
    with pytest.raises(TransferError) as info:
        with step_errors(_pending(), WHAT):
            raise raised
    err = info.value
    assert type(err) is TransferError and err.__cause__ is raised
    assert str(err).startswith(f"{WHAT} failed: ") and str(raised) in str(err)
    assert err.where == {"kind": "round", "index": 7, "peers": [1, 9]}


def test_another_ranks_failure_stays_a_knock_on_with_the_step():
    knock_on = Abandoned("rank 2 failed first")
    with pytest.raises(Abandoned) as info:
        with step_errors(Pending("bucket", 3, [0, 4]), WHAT):
            raise knock_on
    assert info.value is knock_on and str(info.value) == "rank 2 failed first"
    assert info.value.where == {"kind": "bucket", "index": 3, "peers": [0, 4]}


def test_other_errors_and_a_clean_wait_pass_through():
    with pytest.raises(KeyError) as info:
        with step_errors(_pending(), WHAT):
            raise KeyError("x")
    assert not hasattr(info.value, "where")
    with step_errors(_pending(), WHAT):
        pass

"""The leader's prefill chunk follows the plan's token cap at run time:
the simulator prefills at most token_cap prompt tokens per iteration and admits
longer prompts over several iterations; the live executor sets the same chunk."""

from __future__ import annotations

import pytest

from test_execution_units import _FakeKV, _leader
from tiertp.execution.errors import CommandRejected
from tiertp.execution.records import NewRequest


def test_the_chunk_can_change_between_iterations():
    leader = _leader(_FakeKV())
    assert leader.plan_iteration([NewRequest("a", [5] * 60)], []).extend == (("a", 60),)  # whole prompt
    leader.set_chunk(16)
    assert leader.plan_iteration([NewRequest("b", [5] * 60)], []).extend == (("b", 16),)
    leader.set_chunk(None)
    assert leader.plan_iteration([NewRequest("c", [5] * 50)], []).extend == (("c", 50),)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "64"])
def test_a_bad_chunk_is_rejected_and_changes_nothing(bad):
    leader = _leader(_FakeKV(), chunk=10)
    with pytest.raises(CommandRejected, match="prefill chunk"):
        leader.set_chunk(bad)
    assert leader.chunk == 10

"""A switch that cannot complete rolls back (tiertp.switching): the source
keeps its requests and produces exactly the tokens it would have, and the
destination holds nothing of the switch.

Two failures on the same in-flight batch: a destination whose KV pool is too
small (the migration's handshake aborts before any byte moves), then a
destination that lost a rank process (the migration fails in flight: the
source's ranks give up waiting after the coordinator's timeout).
"""

from __future__ import annotations

import os
import signal

import pytest
from instance_generate import continue_generation, generate

from tiertp.execution.instance import TpInstance
from tiertp.execution.records import NewRequest
from tiertp.execution.spec import InstanceSpec
from tiertp.switching import SwitchCoordinator, SwitchRolledBack

pytestmark = pytest.mark.slow

MODEL = "tiny-llama"
PROMPTS = [[1, 2, 3, 4, 5], [100, 200, 300], [42] * 20]
NEW_TOKENS = 8


def _requests() -> list[NewRequest]:
    return [NewRequest(i, p) for i, p in enumerate(PROMPTS)]


def test_failed_switches_roll_back_and_the_source_continues_identically():
    with TpInstance(InstanceSpec(MODEL, tp=1, max_total_tokens=256)) as src, \
            TpInstance(InstanceSpec(MODEL, tp=2, max_total_tokens=16)) as small, \
            SwitchCoordinator(timeout_s=10) as coord:
        src.start()
        small.start()
        reference = generate(src, _requests(), NEW_TOKENS)
        outputs = {i: [] for i in range(len(PROMPTS))}
        for _ in range(2):
            for t in src.iterate(_requests() if not any(outputs.values()) else []):
                outputs[t.rid].append(t.token)
        before = src.export(list(outputs))

        # 1. Out of KV space at the destination: aborted in the handshake.
        with pytest.raises(SwitchRolledBack, match="needs 31 free KV pages") as e:
            coord.switch([(src, list(outputs))], small)
        assert e.value.out_of_space and e.value.lost_sources == ()
        assert not src.paused and not small.paused  # both as they were
        stats = small.stats()
        assert (stats.running, stats.pending, stats.kv_used_slots, stats.reserved_slots) == (0, 0, 0, 0)
        assert src.export(list(outputs)) == before  # nothing changed at the source

        # 2. A destination rank died: the migration fails in flight.
        os.kill(small.pids[1], signal.SIGKILL)
        with pytest.raises(SwitchRolledBack, match=r"TP2 instance on devices \[0, 1\]: InstanceFailed") as e:
            coord.switch([(src, list(outputs))], small)
        assert not e.value.out_of_space and e.value.lost_sources == ()
        assert not src.paused
        assert src.export(list(outputs)) == before

        assert continue_generation(src, outputs, NEW_TOKENS) == reference
        assert src.stats().kv_used_slots == 0

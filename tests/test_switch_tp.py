"""Run-time TP switching (tiertp.switching): a batch switched mid-generation
1 -> 2 -> 4 -> 1 produces exactly the greedy tokens of an unswitched TP1 run,
with every instance's weights views of one shared store.

Instances run tiny-llama (random weights, float32) in rank processes (about
1 GB and 20-40 s to start each on a loaded 2-core machine); at most TP1 +
TP2 + TP4 (7 rank processes) run at once, all closed at the end.
"""

from __future__ import annotations

import pytest
from instance_generate import continue_generation, generate

from tiertp.engine.models import resolve_model
from tiertp.execution.instance import TpInstance
from tiertp.execution.records import NewRequest
from tiertp.execution.spec import InstanceSpec
from tiertp.switching import STORE_SHARING, WEIGHT_BINDER, SwitchCoordinator
from tiertp.weights import create_store

pytestmark = pytest.mark.slow

MODEL = "tiny-llama"
# Three lengths with chunked prefill (8 tokens an iteration): at the first
# switch the 20-token prompt has not started its prefill (it moves as
# metadata), at the second it is half prefilled (it moves with its KV).
PROMPTS = [[1, 2, 3, 4, 5], [100, 200, 300], [42] * 20]
NEW_TOKENS = 12
CHUNK = 8


def _spec(tp: int, store=None) -> InstanceSpec:
    binder = {} if store is None else {"weight_binder": WEIGHT_BINDER, "weight_binder_arg": store.handle}
    return InstanceSpec(MODEL, tp=tp, max_total_tokens=256, prefill_chunk_tokens=CHUNK, **binder)


def _requests() -> list[NewRequest]:
    return [NewRequest(i, p) for i, p in enumerate(PROMPTS)]


def _iterate(inst: TpInstance, outputs: dict, n: int, admit=()) -> None:
    for _ in range(n):
        for t in inst.iterate(list(admit)):
            outputs[t.rid].append(t.token)
        admit = ()


@pytest.fixture(scope="module")
def store():
    with create_store(resolve_model(MODEL), (1, 2, 4), dtype="float32") as s:
        yield s


def test_switching_1_2_4_1_mid_generation_keeps_greedy_output(store):
    with TpInstance(_spec(1, store)) as tp1, TpInstance(_spec(2, store)) as tp2, TpInstance(_spec(4, store)) as tp4, \
            SwitchCoordinator() as coord:
        for inst in (tp1, tp2, tp4):  # every destination is warm before its switch
            inst.start()
        reference = generate(tp1, _requests(), NEW_TOKENS)  # (a) no switch, TP1
        assert len({tuple(o) for o in reference.values()}) == len(PROMPTS), reference
        assert tp1.stats().kv_used_slots == 0

        # Every instance's parameters lie in the one store (storage sharing, not sizes).
        for inst in (tp1, tp2, tp4):
            ranks = inst.call_on_ranks(STORE_SHARING)
            assert [r["store"] for r in ranks] == [store.handle.backing.path] * inst.spec.tp
            assert all(r["outside"] == [] and r["parameters"] > 0 for r in ranks)

        outputs = {i: [] for i in range(len(PROMPTS))}
        _iterate(tp1, outputs, 1, admit=_requests())
        assert [len(o) for o in outputs.values()] == [1, 1, 0]
        first = coord.switch([(tp1, list(outputs))], tp2)
        assert set(first.moved) == {0, 1} and first.metadata_only == (2,)
        assert first.bytes_between > 0 and first.stop_ms > 0
        # On CPU the TP2 ranks copy the KV straight out of the TP1 rank's pool (shared at its first switch).
        assert first.bytes_pulled == first.bytes_between
        assert tp1.paused and not tp2.paused
        assert tp1.stats().kv_used_slots == 0  # the source released everything

        _iterate(tp2, outputs, 2)
        [half] = [s for s in tp2.export([2])]
        assert 0 < half.kv_len < len(PROMPTS[2])  # mid-prefill: moves with its KV
        second = coord.switch([(tp2, list(outputs))], tp4)
        assert set(second.moved) == {0, 1, 2} and second.bytes_pulled == second.bytes_between > 0

        _iterate(tp4, outputs, 3)
        coord.switch([(tp4, list(outputs))], tp1)  # back to TP1 (the first instance, reused)
        assert not tp1.paused

        assert continue_generation(tp1, outputs, NEW_TOKENS) == reference
        for inst in (tp1, tp2, tp4):
            stats = inst.stats()
            assert (stats.running, stats.pending, stats.kv_used_slots, stats.reserved_slots) == (0, 0, 0, 0), stats

"""KV ownership of the TP instance (tiertp.execution): export -> import into a
fresh instance continues with the same tokens, bad imports are refused with
nothing changed, pause/resume, seeded sampling, and a dead rank.

Instances run tiny-llama (random weights, float32) in rank processes; each
start takes 20-40 s on a loaded 2-core machine.
"""

from __future__ import annotations

import dataclasses
import os
import signal

import pytest
from instance_generate import continue_generation, generate

from tiertp.execution.errors import CommandRejected, InstanceFailed, KVOutOfSpace, UnknownRequest
from tiertp.execution.instance import RankCallFailed, TpInstance
from tiertp.execution.kv_io import DescribeKV
from tiertp.execution.records import NewRequest
from tiertp.execution.records import Sampling
from tiertp.execution.spec import InstanceSpec

pytestmark = pytest.mark.slow

MODEL = "tiny-llama"
PROMPTS = [[1, 2, 3, 4, 5], [100, 200, 300], [42] * 20]
NEW_TOKENS = 10


def _requests(prompts=PROMPTS, **sampling) -> list[NewRequest]:
    return [NewRequest(i, p, Sampling(**sampling)) for i, p in enumerate(prompts)]


def test_export_then_import_into_a_fresh_instance_continues_identically():
    spec = InstanceSpec(MODEL, tp=2, prefill_chunk_tokens=8)
    with TpInstance(spec) as src:
        src.start()
        outputs = {i: [] for i in range(len(PROMPTS))}
        admit = _requests()
        for _ in range(3):  # chunks of 8: requests 0 and 1 decode, request 2 is still prefilling
            for t in src.iterate(admit):
                outputs[t.rid].append(t.token)
            admit = []
        states = src.export(list(outputs))
        assert [s.kv_len for s in states] == [len(s.token_ids) - 1 for s in states[:2]] + [16]
        assert all(s.token_ids[s.prompt_len:] == tuple(outputs[s.rid]) for s in states)
        kv = [src.read_kv(list(s.slots)) for s in states]  # per request, per rank
        views = src.call_on_ranks(DescribeKV())  # what tiertp.kv.migrate would get
        assert [v["heads"] for v in views] == [(0, 4), (4, 8)] and all(v["zero_copy"] for v in views)
        expected = continue_generation(src, outputs, NEW_TOKENS)  # the source itself goes on

    with TpInstance(spec) as dst:
        dst.start()
        # A request of its own first, so the imported KV lands in other slots than at the source.
        own = {"own": []}
        for t in dst.iterate([NewRequest("own", [7] * 9)]):
            own["own"].append(t.token)
        slots = dst.reserve_slots([s.kv_len for s in states])
        assert [len(x) for x in slots] == [s.kv_len for s in states]
        assert any(set(new) != set(s.slots) for new, s in zip(slots, states))
        for new, data in zip(slots, kv):
            dst.write_kv(new, data)
        dst.adopt([dataclasses.replace(s, slots=tuple(new)) for s, new in zip(states, slots)])
        assert dst.stats().reserved_slots == 0
        got = continue_generation(dst, {**outputs, **own}, NEW_TOKENS)
        assert {rid: got[rid] for rid in outputs} == expected
        assert dst.stats().kv_used_slots == 0


@pytest.fixture(scope="module")
def small():
    """One TP1 instance with a 64-slot KV pool, shared by the tests below (the last one kills it)."""
    inst = TpInstance(InstanceSpec(MODEL, tp=1, max_total_tokens=64))
    inst.start()
    yield inst
    inst.close()


@pytest.fixture(scope="module")
def reference(small):
    return generate(small, _requests(PROMPTS[:2]), 6)


def test_out_of_space_import_is_refused_and_changes_nothing(small, reference):
    outputs = {0: [], 1: []}
    for t in small.iterate(_requests(PROMPTS[:2])):
        outputs[t.rid].append(t.token)
    before = small.stats()
    with pytest.raises(KVOutOfSpace, match="needs 200 free KV slots"):
        small.reserve_slots([100, 100])
    assert small.stats() == before
    with pytest.raises(CommandRejected, match="not reserved"):  # adopting slots nobody reserved
        small.adopt([dataclasses.replace(small.export([0])[0], rid="stolen")])
    with pytest.raises(UnknownRequest):
        small.release(["nobody"])
    with pytest.raises(RankCallFailed, match="rank 0: ValueError: write_slots: some slots are not reserved"):
        small.write_kv(small.export([0])[0].slots, [None])  # a request's own KV is never overwritten
    assert small.stats() == before
    # A reservation that fits, given back: the pool is as before.
    [slots] = small.reserve_slots([before.kv_free_slots])
    assert small.stats().reserved_slots == before.kv_free_slots
    with pytest.raises(KVOutOfSpace):  # the running batch cannot decode with the pool reserved
        small.iterate()
    small.free_slots(slots)
    assert small.stats() == before
    assert continue_generation(small, outputs, 6) == reference


def test_pause_stops_iterations_until_resume(small, reference):
    outputs = {0: [], 1: []}
    for t in small.iterate(_requests(PROMPTS[:2])):
        outputs[t.rid].append(t.token)
    small.pause()
    with pytest.raises(CommandRejected, match="paused"):
        small.iterate()
    assert [s.kv_len for s in small.export([0, 1])] == [len(p) for p in PROMPTS[:2]]  # still readable
    small.resume()
    assert continue_generation(small, outputs, 6) == reference


def test_seeded_sampling_is_the_same_whatever_the_batch(small):
    seeded = NewRequest("s", PROMPTS[2], Sampling(temperature=1.0, top_p=0.9, seed=123))
    alone = generate(small, [seeded], 8)["s"]
    crowd = generate(small, [*_requests(PROMPTS[:2]), seeded], 8)["s"]
    assert crowd == alone
    other = generate(small, [dataclasses.replace(seeded, sampling=Sampling(temperature=1.0, seed=124))], 8)["s"]
    assert other != alone


def test_a_dead_rank_fails_the_instance_with_a_clear_error(small):
    small.iterate(_requests(PROMPTS[:1]))
    [pid] = small.pids
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(InstanceFailed, match=rf"rank 0 \(pid {pid}\) exited with code -9"):
        small.iterate()
    with pytest.raises(InstanceFailed, match="not running"):
        small.stats()

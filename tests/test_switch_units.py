"""tiertp.switching without SGLang: planning a switch from exported
requests, participant ids, setup checks and the rollback error."""

from __future__ import annotations

import pickle
from types import SimpleNamespace

import pytest
import torch

from tiertp.execution.records import InstanceInfo, KVGeometry, RequestState, Sampling
from tiertp.kv import KVShape
from tiertp.switching import SwitchCoordinator, SwitchRolledBack, SwitchSetupError
from tiertp.switching.coordinator import _chunk_bytes
from tiertp.switching import rank_migrate
from tiertp.switching.layout_ids import NEW_OFFSET, new_id, old_id
from tiertp.switching.planning import plan_switch
from tiertp.switching.weight_binder import handle_for

SHAPE = KVShape(num_layers=2, num_kv_heads=8, head_dim=4, page_size=1, dtype=torch.float32)


def _state(rid, n_tokens: int, kv_len: int, first_slot: int = 1) -> RequestState:
    return RequestState(rid, tuple(range(n_tokens)), min(n_tokens, 3), kv_len,
                        tuple(range(first_slot, first_slot + kv_len)), Sampling())


def test_two_tp1_sources_into_one_tp2_plan_every_head_once_and_skip_waiting_requests():
    states = [[_state(0, 6, 5), _state("waiting", 3, 0)], [_state(7, 4, 3, first_slot=10)]]
    sp = plan_switch(SHAPE, [(0,), (1,)], (0, 1), states)
    assert sp.names == {"m0": 0, "m1": 7} and sp.kv_tokens == 8
    plan = sp.plan
    # TP1 on device 0 holds every head of request 0: heads 0-3 to device 0's new
    # process, 4-7 to device 1's; nothing is "local" (old and new are different processes).
    moves = {(m.src_gpu, m.dst_gpu, m.request_id): (m.heads.start, m.heads.stop) for m in plan.moves}
    assert moves == {(0, new_id(0), "m0"): (0, 4), (0, new_id(1), "m0"): (4, 8),
                     (1, new_id(0), "m1"): (0, 4), (1, new_id(1), "m1"): (4, 8)}
    assert plan.bytes_local() == 0
    assert plan.bytes_to_move() == 8 * SHAPE.page_bytes(8)  # every token's KV once, all heads


def test_participant_ids_keep_a_devices_old_and_new_process_apart():
    assert old_id(3) == 3 and new_id(3) == NEW_OFFSET + 3
    with pytest.raises(ValueError, match="device id -1"):
        old_id(-1)


def test_a_switch_plans_with_the_destinations_kv_shape():
    shape = KVShape(2, 8, 32, 1, torch.float32)
    info = InstanceInfo(tp=2, vocab_size=10, context_len=64, kv_capacity_tokens=256, max_running_requests=8,
                        eos_token_ids=(2,), kv=KVGeometry(shape, kv_heads_per_rank=4, slots=257))
    plan = plan_switch(info.kv.shape, [(0,)], (0, 1), [[_state(0, 4, 3)]]).plan
    assert plan.bytes_to_move() == 3 * shape.page_bytes(8)  # every token's KV once, all heads


def test_staging_chunks_shrink_for_small_migrations():
    small = plan_switch(SHAPE, [(0,)], (0, 1), [[_state(0, 4, 3)]]).plan
    assert _chunk_bytes(small) == 64 << 10
    assert _chunk_bytes(plan_switch(SHAPE, [(0,)], (0,), [[]]).plan) == 64 << 10


def _fake(tp: int, devices, model="tiny-llama", started=True):
    geo = KVGeometry(KVShape(2, 8, 32, 1, torch.float32), 8 // tp, 257)
    info = InstanceInfo(tp, 10, 64, 256, 8, (2,), geo) if started else None
    return SimpleNamespace(spec=SimpleNamespace(tp=tp, devices=tuple(devices), model=model), info=info, closed=False,
                           paused=False)


@pytest.mark.parametrize("sources, dest, match", [
    ([], "d", "at least one source"),
    ([("a", [])], "a", "also a source"),
    ([("a", []), ("b", [])], "d", "share devices"),
    ([("c", [])], "d", "same model"),
    ([("cold", [])], "d", "not running"),
])
def test_impossible_switches_are_refused_before_anything_is_touched(sources, dest, match):
    fakes = {"a": _fake(1, [0]), "b": _fake(1, [0]), "c": _fake(1, [1], model="smollm2-135m"),
             "cold": _fake(1, [1], started=False), "d": _fake(2, [0, 1])}
    with pytest.raises(SwitchSetupError, match=match):
        SwitchCoordinator().switch([(fakes[s], r) for s, r in sources], fakes[dest])
    assert not any(f.paused for f in fakes.values())


def test_rolled_back_error_says_why_and_survives_pickling():
    e = SwitchRolledBack("participant(s) [1000]: GPU 1000: migration needs 31 free KV pages, pool has 16", (1,))
    assert e.out_of_space and e.lost_sources == (1,)
    assert "source(s) [1] died" in str(e)
    again = pickle.loads(pickle.dumps(e))
    assert str(again) == str(e) and again.out_of_space


def test_weight_store_handle_per_device():
    assert handle_for("one", 3) == "one"
    assert handle_for({0: "h0", 1: "h1"}, 1) == "h1"
    with pytest.raises(ValueError, match="no weight store for device 2"):
        handle_for({0: "h0"}, 2)


def test_destination_ranks_agree_on_slots_by_digest():
    digest = rank_migrate.pages_digest
    a = {"m0": [5, 6, 7], "m1": [9]}
    assert digest(a) == digest({"m1": [9], "m0": [5, 6, 7]})  # order of requests does not matter
    assert digest(a) != digest({"m0": [5, 6, 8], "m1": [9]})
    assert digest(a) != digest({"m0": [5, 6], "m1": [7, 9]})


def test_rollback_frees_what_the_rank_reserved_for_that_switch_and_still_holds():
    freed = []
    reserved = torch.zeros(16, dtype=torch.bool)
    reserved[[3, 4, 5, 9]] = True  # slot 6 was already freed (say, by the rank's own failed migration)
    handle = SimpleNamespace(kv=SimpleNamespace(reserved=reserved, free_reserved=freed.extend))
    rank_migrate._reserved["switch-x"] = [3, 4, 5, 6]
    rank_migrate.free_reserved(handle, "switch-x")
    assert freed == [3, 4, 5] and "switch-x" not in rank_migrate._reserved
    rank_migrate.free_reserved(handle, "switch-x")  # twice, or a switch this rank took no slots for: nothing
    assert freed == [3, 4, 5]

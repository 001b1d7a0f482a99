"""A prefill -> decode hand-off overlapped with the prefill instance's next
iterations (tiertp.switching.SwitchCoordinator.hand_off, the default).

The handed-off requests are *parked* on the source (out of its batch, their
KV slots untouched) and the source resumes as soon as its ranks are done
with the migration, while the destination still copies the KV out of the
source's pool; the source releases them once the destination adopted them,
or unparks them (they continue there) if the hand-off fails.

Without SGLang: the leader's park/unpark checks, the step runner and the
execution process's loop leaving parked requests alone.

With SGLang: two TP1 tiny-llama instances (device 0 prefills, device 1
decodes: two rank processes in all), shared by the tests of this file. The
destination's copy is held back (a test `RankCall`, `GatedRun`) until
the source has run a few iterations of other requests, prefilling a new
one into fresh slots while the parked requests' KV is still to be read:
every request's greedy output must equal a run without any hand-off.
"""

from __future__ import annotations

import math
import os
import pickle
import time
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from instance_generate import continue_generation, generate

import tiertp.kv.executor as kv_executor
from tiertp.execution.errors import CommandRejected, DuplicateRequest
from tiertp.execution.instance import TpInstance
from tiertp.execution.leader import Leader
from tiertp.execution.rank_call import RankCall
from tiertp.execution.records import NewRequest, Sampling
from tiertp.execution.spec import InstanceSpec
from tiertp.switching import SwitchCoordinator, SwitchRolledBack
from tiertp.switching.rank_migrate import MigrationCall
from tiertp.tp_group import TpGroup
from tiertp.worker import instance_ops
from tiertp.worker import protocol as P
from tiertp.worker.executor import ExecutionLoop
from tiertp.worker.instance_runner import InstanceStepRunner
from tiertp.worker.step_runner import StepInput, StepOutput, SwitchableStepRunner

pytestmark = pytest.mark.slow

MODEL = "tiny-llama"
HANDED = {"h0": [1, 2, 3, 4, 5], "h1": [100, 200, 300]}  # prefilled on the source, then handed off
STAYS = {"stays": [9, 8, 7, 6]}  # decodes on the source all along
NEW = {"new": [42] * 12}  # prefilled on the source while the handed-off KV moves
NEW_TOKENS = 8
ITERATIONS_DURING = 3


def _requests(prompts: dict) -> list[NewRequest]:
    return [NewRequest(rid, p) for rid, p in prompts.items()]


# --- without SGLang ---------------------------------------------------------
class _FakeKV:
    """What the leader reads of a rank's KV (tests/test_execution_units.py's, plus parking)."""

    row_len = 100

    def __init__(self):
        self.running, self.pending, self.kv, self.parked = [], [], {}, set()

    def free_slots(self):
        return 1000

    def free_rows(self):
        return 10

    def kv_len(self, rid):
        return self.kv.get(rid, 0)

    def holds_row(self, rid):
        return rid in self.kv

    def slots_of(self, rid):
        return list(range(1, self.kv_len(rid) + 1))


def test_the_leader_parks_known_requests_once_and_unparks_them_with_their_tokens():
    kv = _FakeKV()
    leader = Leader(kv, vocab_size=1000, eos_token_ids=(2,), prefill_chunk_tokens=None)
    admit = [NewRequest("a", [5, 6, 7]), NewRequest("b", [8])]
    leader.book_admitted(leader.plan_iteration(admit, []), admit)
    kv.running, kv.kv = ["a", "b"], {"a": 3, "b": 1}
    leader.book["a"].token_ids.append(11)  # "a" sampled its first token

    [state] = leader.plan_park(["a"])
    assert (state.token_ids, state.kv_len, state.slots) == ((5, 6, 7, 11), 3, (1, 2, 3))
    kv.running.remove("a")
    kv.parked.add("a")  # what the ranks did
    with pytest.raises(CommandRejected, match="already parked"):
        leader.plan_park(["a"])
    with pytest.raises(CommandRejected, match="'b' is not parked"):
        leader.plan_unpark(["b"])
    assert leader.plan_iteration([], []).decode_tokens == (8,)  # the parked request is not stepped
    assert leader.plan_unpark(["a"]) == (("a", (5, 6, 7, 11)),)  # the ranks extend its unfed newest token


class _FakeInstance:
    """Records what it is asked; refuses to admit a request it holds, as the leader does."""

    def __init__(self):
        self.calls, self.held = [], set()

    def iterate(self, admit, release):
        for r in admit:
            if r.rid in self.held - set(release):
                raise DuplicateRequest(f"admit: request {r.rid!r} is already held by this instance")
        self.calls.append(("iterate", [r.rid for r in admit], list(release)))
        self.held = (self.held - set(release)) | {r.rid for r in admit}
        return []

    def park(self, rids):
        self.calls.append(("park", rids))
        return [f"state-{rid}" for rid in rids]

    def unpark(self, rids):
        self.calls.append(("unpark", rids))

    def release(self, rids):
        self.calls.append(("release", rids))
        self.held -= set(rids)

    def set_prefill_chunk(self, tokens):
        return None

    def pause(self):
        pass

    def resume(self):
        pass


def _step_input(rid, tokens=(1, 2)):
    return StepInput(rid, list(tokens), 0, Sampling())


def test_the_step_runner_leaves_parked_requests_out_of_its_steps():
    runner = InstanceStepRunner(MODEL, TpGroup(0, 1), max_total_tokens=64)
    runner.instance = inst = _FakeInstance()
    runner.step([_step_input(1), _step_input(2), _step_input(3)])
    assert runner.park([1, 2]) == ["state-1", "state-2"]
    runner.step([_step_input(3)])  # 1 and 2 are parked: leaving them out is fine
    with pytest.raises(DuplicateRequest, match="already held"):  # a parked request is not stepped
        runner.step([_step_input(1), _step_input(3)])
    runner.unpark([1])
    with pytest.raises(RuntimeError, match="left out of a step"):
        runner.step([_step_input(3)])  # 1 decodes again: it must be stepped
    runner.release([2])  # e.g. cancelled while parked: its KV is freed with the next step
    runner.step([_step_input(1), _step_input(3)])
    assert inst.calls[-1] == ("iterate", [], [2])


class _FakeSocket:
    def __init__(self):
        self.sent = []

    def send(self, frame):
        self.sent.append(P.decode(frame))


class _FakeRunner(SwitchableStepRunner):
    """A step runner holding an instance (so switch ops apply), recording what it is asked."""

    def __init__(self):
        self.instance = _FakeInstance()
        self.stepped, self.released, self.parked = [], [], set()

    def start(self):
        raise AssertionError("not started in these tests")

    def close(self):
        pass

    def set_prefill_chunk(self, tokens):
        return True

    def step(self, batch):
        self.stepped.append([r.rid for r in batch])
        return [StepOutput(r.rid, 7, False) for r in batch]

    def release(self, rids):
        self.released += rids
        self.parked -= set(rids)

    def park(self, rids):
        self.parked |= set(rids)
        return self.instance.park(rids)

    def unpark(self, rids):
        self.parked -= set(rids)

    def moved_away(self, rids):
        self.parked -= set(rids)

    def pause(self):
        pass

    def resume(self):
        pass

    def adopt(self, states):
        raise AssertionError("nothing is adopted in these tests")


def _op(loop, op):
    """`op` sent as the agent sends it; its answer's value."""
    answer = loop.ops.handle({"op_id": 1, "op": pickle.dumps(op)})
    assert answer["ok"], answer["error"]
    return pickle.loads(answer["value"])


def test_the_execution_loop_does_not_step_parked_requests_and_can_still_cancel_them():
    sock, runner = _FakeSocket(), _FakeRunner()
    loop = ExecutionLoop(sock, runner, batch_cap=8, token_cap=0, kv_capacity_tokens=100)
    for rid in (1, 2, 3):
        loop._handle({"type": "add", "rid": rid, "input_ids": [5] * 10, "max_tokens": 10, "temperature": 0.0,
                      "top_p": 1.0, "seed": None, "stop_token_ids": [], "cls": "feasible",
                      "deadline": math.inf})
    loop.requests.admit()
    loop._iterate()
    assert _op(loop, instance_ops.Park([1, 2, 99])) == ["state-1", "state-2"]  # 99 is not running here: skipped
    assert list(loop.requests.running) == [3] and list(loop.requests.parked) == [1, 2]
    assert sock.sent[-1] == {"type": "load", "running": 1, "waiting": 0, "kv_used_tokens": 33}  # parked KV counts
    loop._iterate()
    assert runner.stepped[-1] == [3]
    # Their KV still takes room: a new request that would need it waits.
    loop._handle({"type": "add", "rid": 4, "input_ids": [5] * 60, "max_tokens": 10, "temperature": 0.0,
                  "top_p": 1.0, "seed": None, "stop_token_ids": [], "cls": "feasible",
                  "deadline": math.inf})
    assert loop.requests.admit() == []
    loop._handle({"type": "cancel", "rid": 2})
    assert runner.released == [2] and list(loop.requests.parked) == [1]
    _op(loop, instance_ops.Unpark([1, 2]))  # 2 was cancelled meanwhile: only 1 comes back
    assert list(loop.requests.running) == [3, 1] and not loop.requests.parked and runner.parked == set()
    _op(loop, instance_ops.Park([1]))
    _op(loop, instance_ops.Release([1]))  # moved away
    assert list(loop.requests.running) == [3] and not loop.requests.parked


# --- with SGLang --------------------------------------------------------------
@dataclass(frozen=True)
class GatedRun(RankCall):
    """tiertp.switching.rank_migrate's MigrationCall, except that this rank's
    in-process copies (a destination pulling the KV out of the source's
    pool) first wait for the file `gate`; with `fail` the rank then reports
    an error instead of its slots, as rank_migrate.run does (a destination
    that fails after its copy: the coordinator frees its slots and rolls back)."""

    call: MigrationCall
    gate: str
    fail: bool

    def run(self, handle):
        copy = kv_executor.copy_in_process

        def copy_after_the_gate(*args, **kwargs):
            deadline = time.monotonic() + 120
            while not os.path.exists(self.gate):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the test never opened {self.gate}")
                time.sleep(0.01)
            return copy(*args, **kwargs)

        kv_executor.copy_in_process = copy_after_the_gate
        try:
            result = self.call.run(handle)
        finally:
            kv_executor.copy_in_process = copy
        if self.fail:  # as rank_migrate.run reports a failure; its slots stay reserved for the coordinator to free
            return {"id": result["id"], "error": "RuntimeError: test: the destination fails after its copy"}
        return result


class _GatedCoordinator(SwitchCoordinator):
    """Runs the destination's part through `GatedRun`."""

    def __init__(self, gate, fail: bool = False):
        super().__init__(timeout_s=30)
        self.gate, self.fail = str(gate), fail

    def _rank_call(self, call):
        if call.role == "new":
            return GatedRun(call, self.gate, self.fail)
        return super()._rank_call(call)


@pytest.fixture(scope="module")
def instances():
    with TpInstance(InstanceSpec(MODEL, tp=1, devices=(0,), max_total_tokens=256)) as prefill, \
            TpInstance(InstanceSpec(MODEL, tp=1, devices=(1,), max_total_tokens=256)) as decode:
        prefill.start()
        decode.start()
        yield prefill, decode


@pytest.fixture(scope="module")
def reference(instances):
    prefill, _ = instances
    return generate(prefill, _requests({**HANDED, **STAYS, **NEW}), NEW_TOKENS)


def _first_tokens(prefill: TpInstance) -> dict:
    outputs = {rid: [] for rid in [*HANDED, *STAYS]}
    for t in prefill.iterate(_requests({**HANDED, **STAYS})):
        outputs[t.rid].append(t.token)
    assert all(len(o) == 1 for o in outputs.values())
    return outputs


def _iterate_source_then_open(prefill: TpInstance, outputs: dict, gate) -> Callable[[], None]:
    """What runs once the source resumed: iterations of its other requests
    (admitting NEW in the first), then the destination may copy."""

    def run():
        assert not prefill.paused
        parked = prefill.export(list(HANDED))  # still held: parked, not released
        slots = [slot for s in parked for slot in s.slots]
        kv_before = prefill.read_kv(slots)
        for i in range(ITERATIONS_DURING):
            tokens = prefill.iterate(_requests(NEW) if i == 0 else [])
            assert sorted(t.rid for t in tokens) == ["new", "stays"]  # the parked ones produce nothing
            for t in tokens:
                outputs.setdefault(t.rid, []).append(t.token)
        # The destination has not copied yet: the parked requests' KV must be exactly as it was.
        assert prefill.export(list(HANDED)) == parked
        assert all(torch.equal(a, b) for a, b in zip(prefill.read_kv(slots), kv_before, strict=True))
        open(gate, "w").close()

    return run


def _assert_idle(*instances_):
    for inst in instances_:
        stats = inst.stats()
        assert (stats.running, stats.pending, stats.kv_used_slots, stats.reserved_slots) == (0, 0, 0, 0)


def test_the_source_keeps_iterating_while_the_handed_off_kv_moves(instances, reference, tmp_path):
    prefill, decode = instances
    gate = tmp_path / "gate"
    outputs = _first_tokens(prefill)
    with _GatedCoordinator(gate) as coord:
        result = coord.hand_off(prefill, list(HANDED), decode,
                                on_source_resumed=_iterate_source_then_open(prefill, outputs, gate))
    assert set(result.moved) == set(HANDED) and result.metadata_only == ()
    assert result.bytes_pulled > 0  # the destination copied out of the source's pool after the source resumed
    assert result.source_stop_ms == result.parts_ms["source_stop"]
    assert not prefill.paused and not decode.paused
    assert len(outputs["new"]) == ITERATIONS_DURING and len(outputs["stays"]) == 1 + ITERATIONS_DURING

    handed = continue_generation(decode, {rid: outputs[rid] for rid in HANDED}, NEW_TOKENS)
    stayed = continue_generation(prefill, {rid: outputs[rid] for rid in [*STAYS, *NEW]}, NEW_TOKENS)
    assert {**handed, **stayed} == reference
    _assert_idle(prefill, decode)


def test_a_hand_off_failing_after_the_copy_leaves_the_requests_decoding_on_the_source(instances, reference,
                                                                                          tmp_path):
    prefill, decode = instances
    gate = tmp_path / "gate"
    outputs = _first_tokens(prefill)
    with _GatedCoordinator(gate, fail=True) as coord, \
            pytest.raises(SwitchRolledBack, match="test: the destination fails after its copy") as e:
        coord.hand_off(prefill, list(HANDED), decode,
                       on_source_resumed=_iterate_source_then_open(prefill, outputs, gate))
    assert e.value.lost_sources == ()
    assert not prefill.paused and not decode.paused
    _assert_idle(decode)  # the slots it had filled are free again
    # Unparked: the next iteration gives each handed-off request the token it was due.
    assert continue_generation(prefill, outputs, NEW_TOKENS) == reference
    _assert_idle(prefill)


def test_a_hand_off_the_destination_has_no_room_for_rolls_back_and_the_source_continues(instances, reference):
    prefill, decode = instances
    for _ in decode.iterate([NewRequest("big", [3] * 250)]):
        pass  # 251 of its 256 slots: no room for the hand-off's 8 tokens
    outputs = _first_tokens(prefill)
    with SwitchCoordinator(timeout_s=30) as coord, pytest.raises(SwitchRolledBack, match="free KV pages") as e:
        coord.hand_off(prefill, list(HANDED), decode)
    assert e.value.out_of_space
    assert not prefill.paused and not decode.paused
    decode.release(["big"])
    _assert_idle(decode)
    assert continue_generation(prefill, outputs, NEW_TOKENS) == {rid: reference[rid] for rid in outputs}
    _assert_idle(prefill)

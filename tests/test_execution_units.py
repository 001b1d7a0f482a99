"""Parts of tiertp.execution that need no model: sampling, records, spec,
head split, and the leader's iteration planning (over a stand-in for a
rank's KV)."""

from __future__ import annotations

import pytest
import torch

from tiertp.execution.errors import DuplicateRequest, KVOutOfSpace, UnknownRequest
from tiertp.execution.kv_view import kv_heads_of_rank
from tiertp.execution.leader import Leader
from tiertp.execution.records import NewRequest, RequestState, Sampling
from tiertp.execution.sampling import Sampler
from tiertp.execution.spec import InstanceSpec


def test_greedy_rows_take_the_argmax_and_seeded_rows_repeat_wherever_they_sit():
    torch.manual_seed(0)
    logits = torch.randn(3, 50)
    greedy, seeded = Sampling(), Sampling(temperature=1.0, seed=5)
    s = Sampler()
    out = s.sample(logits, [(greedy, 0), (seeded, 3), (greedy, 7)])
    assert out[0] == int(logits[0].argmax()) and out[2] == int(logits[2].argmax())
    # The same request, same step, in another row of another batch: the same draw.
    assert Sampler().sample(logits[1:2], [(seeded, 3)]) == [out[1]]
    draws = {Sampler().sample(logits[1:2], [(seeded, step)])[0] for step in range(20)}
    assert len(draws) > 1  # the step index moves the draw on


def test_tiny_top_p_keeps_only_the_most_likely_token():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.9]])
    assert Sampler().sample(logits, [(Sampling(temperature=1.0, top_p=1e-6, seed=1), 0)]) == [1]


@pytest.mark.parametrize("bad", [{"temperature": -1.0}, {"top_p": 0.0}, {"top_p": 1.5}])
def test_bad_sampling_is_rejected(bad):
    with pytest.raises(ValueError):
        Sampling(**bad)


def test_request_state_checks_its_invariants():
    ok = RequestState("r", (1, 2, 3, 4), prompt_len=3, kv_len=3, slots=(5, 6, 7), sampling=Sampling())
    assert ok.generated == 1
    with pytest.raises(ValueError, match="kv_len 4"):
        RequestState("r", (1, 2, 3, 4), 3, 4, (5, 6, 7, 8), Sampling())  # the newest token has no KV yet
    with pytest.raises(ValueError, match="2 slots for kv_len 3"):
        RequestState("r", (1, 2, 3, 4), 3, 3, (5, 6), Sampling())


@pytest.mark.parametrize("kw, message", [({"tp": 0}, "TP level"), ({"tp": 2, "devices": (0, 0)}, "distinct"),
                                         ({"max_total_tokens": 8}, "max_total_tokens"),
                                         ({"prefill_chunk_tokens": 0}, "prefill_chunk_tokens"),
                                         ({"weight_binder": "tiertp.switching.weight_binder:bind_store"}, "must be a function"),
                                         ({"device": "tpu"}, "unknown device")])
def test_bad_instance_specs_are_rejected(kw, message):
    with pytest.raises(ValueError, match=message):
        InstanceSpec("tiny-llama", **kw)


def test_kv_heads_split_like_sglang_including_tp3():
    assert [(h.start, h.stop) for h in (kv_heads_of_rank(3, 3, r) for r in range(3))] == [(0, 1), (1, 2), (2, 3)]
    assert [(h.start, h.stop) for h in (kv_heads_of_rank(8, 4, r) for r in range(4))] == [(0, 2), (2, 4), (4, 6),
                                                                                          (6, 8)]
    with pytest.raises(ValueError):
        kv_heads_of_rank(8, 3, 0)


class _FakeKV:
    """What the leader reads of a rank's KV, without SGLang."""

    row_len = 100

    def __init__(self, free_slots=1000, free_rows=10):
        self._free_slots, self._free_rows = free_slots, free_rows
        self.running, self.pending, self.kv = [], [], {}

    def free_slots(self):
        return self._free_slots

    def free_rows(self):
        return self._free_rows

    def kv_len(self, rid):
        return self.kv.get(rid, 0)

    def holds_row(self, rid):
        return rid in self.kv


def _leader(kv, chunk=None):
    return Leader(kv, vocab_size=1000, eos_token_ids=(2,), prefill_chunk_tokens=chunk)


def test_an_iteration_decodes_the_running_batch_and_prefills_within_the_chunk_budget():
    kv = _FakeKV()
    leader = _leader(kv, chunk=10)
    plan = leader.plan_iteration([NewRequest("a", [5] * 6), NewRequest("b", [5] * 7), NewRequest("c", [5])], [])
    assert plan.extend == (("a", 6), ("b", 4))  # c waits behind b: first come, first served
    assert plan.decode_tokens == ()
    with pytest.raises(DuplicateRequest):
        leader.plan_iteration([NewRequest("z", [1]), NewRequest("z", [1])], [])
    with pytest.raises(UnknownRequest):
        leader.plan_iteration([], ["nobody"])


def test_a_running_batch_that_cannot_decode_is_rejected_and_prefill_waits_for_space():
    kv = _FakeKV(free_slots=3)
    leader = _leader(kv)
    leader.book_admitted(leader.plan_iteration([NewRequest(r, [9, 9]) for r in "xyz"], []),
                         [NewRequest(r, [9, 9]) for r in "xyz"])
    kv.running, kv.kv = ["x", "y"], {"x": 2, "y": 2}
    plan = leader.plan_iteration([NewRequest("n", [4] * 5)], [])
    assert plan.decode_tokens == (9, 9) and plan.extend == (("n", 1),)  # one slot left after the decode
    kv._free_slots = 1
    with pytest.raises(KVOutOfSpace, match="decoding 2 running requests"):
        leader.plan_iteration([], [])
    assert leader.plan_iteration([], ["x"]).decode_tokens == (9,)  # releasing one frees its slots first

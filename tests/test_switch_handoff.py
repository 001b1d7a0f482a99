"""Prefill -> decode hand-off (tiertp.switching.SwitchCoordinator.hand_off):
requests prefilled at TP2 on devices 0-1 decode at TP1 on device 2, and the
reverse (TP1 prefill on device 2 -> TP2 decode on devices 0-1), with exactly
the greedy tokens of a plain TP1 run. The decode instance is already running
a request of its own, which is not disturbed. The first hand-off is
overlapped (the default: the TP2 prefill instance parks the requests on
both its ranks), the second not (tests/test_switch_overlap.py has more).

Two instances (3 rank processes, about 1 GB each), tiny-llama in float32.
"""

from __future__ import annotations

from instance_generate import continue_generation, generate

from tiertp.execution.instance import TpInstance
from tiertp.execution.records import NewRequest
from tiertp.execution.spec import InstanceSpec
from tiertp.switching import SwitchCoordinator

MODEL = "tiny-llama"
PROMPTS = [[1, 2, 3, 4, 5], [100, 200, 300], [42] * 20]
OWN_PROMPT = [9, 8, 7, 6]
NEW_TOKENS = 8


def _requests(tag: str) -> list[NewRequest]:
    return [NewRequest(f"{tag}{i}", p) for i, p in enumerate(PROMPTS)]


def _prefill_then_hand_off(coord, prefill: TpInstance, decode: TpInstance, tag: str, overlap: bool) -> dict:
    """Prefill the batch on `prefill` (first token there), hand it off, decode
    it on `decode` beside a request of its own; every request's tokens.
    `overlap`: the prefill instance resumes once its ranks are done with the
    migration (its requests parked meanwhile), or only after releasing them."""
    own = {f"{tag}own": []}
    for t in decode.iterate([NewRequest(f"{tag}own", OWN_PROMPT)]):
        own[t.rid].append(t.token)
    outputs = {r.rid: [] for r in _requests(tag)}
    for t in prefill.iterate(_requests(tag)):
        outputs[t.rid].append(t.token)
    assert all(len(o) == 1 for o in outputs.values())
    result = coord.hand_off(prefill, list(outputs), decode, overlap=overlap)
    assert set(result.moved) == set(outputs) and result.metadata_only == ()
    assert result.kv_tokens == sum(len(p) for p in PROMPTS) and result.bytes_between > 0
    assert not prefill.paused and not decode.paused  # both keep serving
    assert result.source_stop_ms is not None
    assert prefill.stats().kv_used_slots == 0
    return continue_generation(decode, {**outputs, **own}, NEW_TOKENS)


def test_prefill_and_decode_at_different_tp_levels_on_different_devices():
    with TpInstance(InstanceSpec(MODEL, tp=2, devices=(0, 1), max_total_tokens=256)) as tp2, \
            TpInstance(InstanceSpec(MODEL, tp=1, devices=(2,), max_total_tokens=256)) as tp1, \
            SwitchCoordinator() as coord:
        tp2.start()
        tp1.start()
        reference = generate(tp1, [*_requests("ref"), NewRequest("refown", OWN_PROMPT)], NEW_TOKENS)
        want = {rid.removeprefix("ref"): toks for rid, toks in reference.items()}

        forward = _prefill_then_hand_off(coord, tp2, tp1, "a", overlap=True)  # TP2 prefill (0-1) -> TP1 decode (2)
        assert {rid.removeprefix("a"): toks for rid, toks in forward.items()} == want
        reverse = _prefill_then_hand_off(coord, tp1, tp2, "b", overlap=False)  # TP1 prefill (2) -> TP2 decode (0-1)
        assert {rid.removeprefix("b"): toks for rid, toks in reverse.items()} == want
        for inst in (tp1, tp2):
            assert inst.stats().kv_used_slots == 0

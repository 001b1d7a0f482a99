"""SmolLM2-135M (9 heads, 3 KV heads) switched TP1 -> TP3 -> TP1 mid-generation
gives the greedy tokens of an unswitched TP1 run. TP3 is not a layout
tiertp.kv plans (power-of-two levels), so these switches take the
coordinator's relay path.

Two instances (4 rank processes) of the real checkpoint, float32.
"""

from __future__ import annotations

import pytest
from instance_generate import continue_generation, generate

from tiertp.engine.models import resolve_model
from tiertp.execution.instance import TpInstance
from tiertp.execution.records import NewRequest
from tiertp.execution.spec import InstanceSpec
from tiertp.switching import SwitchCoordinator

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m"
TEXTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village by the sea,"]
NEW_TOKENS = 10


def test_smollm2_tp1_tp3_tp1_switches_keep_greedy_output():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(resolve_model(MODEL))
    requests = [NewRequest(i, tok.encode(t)) for i, t in enumerate(TEXTS)]
    with TpInstance(InstanceSpec(MODEL, tp=1, max_total_tokens=256)) as tp1, \
            TpInstance(InstanceSpec(MODEL, tp=3, max_total_tokens=256)) as tp3, SwitchCoordinator() as coord:
        tp1.start()
        tp3.start()
        reference = generate(tp1, requests, NEW_TOKENS)
        outputs = {r.rid: [] for r in requests}
        for admit in (requests, []):
            for t in tp1.iterate(admit):
                outputs[t.rid].append(t.token)
        there = coord.switch([(tp1, list(outputs))], tp3)
        assert there.path == "relay" and set(there.moved) == set(outputs)
        for _ in range(3):
            for t in tp3.iterate():
                outputs[t.rid].append(t.token)
        back = coord.switch([(tp3, list(outputs))], tp1)
        assert back.path == "relay"
        assert continue_generation(tp1, outputs, NEW_TOKENS) == reference
        assert tp3.stats().kv_used_slots == 0 and tp1.stats().kv_used_slots == 0

"""Real SGLang engines on CPU (each start is 15-25 s on a 2-core machine).

Engines run under tiertp.engine.isolated, never in the pytest process.
"""

from __future__ import annotations

import pytest

from sglang_generate import ISOLATED_ENV, generate_text

from tiertp.engine.isolated import run_isolated

pytestmark = pytest.mark.slow

_TIMEOUT_S = 300


def _generate(model: str, tp: int, prompts: list[str], **kw) -> list[str]:
    payload = {"model": model, "tp": tp, "device": "cpu", "prompts": prompts, **kw}
    return run_isolated(generate_text, payload, timeout_s=_TIMEOUT_S, env=ISOLATED_ENV)


def test_smollm2_tp1_answers_paris():
    [answer] = _generate("smollm2-135m", 1, ["What is the capital of France?"])
    assert "Paris" in answer


def test_tiny_llama_runs_at_tp2():
    texts = _generate("tiny-llama", 2, ["Hello", "The capital of France is"], max_new_tokens=8, chat=False)
    assert len(texts) == 2
    assert all(t.strip() for t in texts), texts

"""SGLang's ModelRunner on store views equals SGLang's normal load (CPU, float32).

Each case runs tiertp.weights.verify in an isolated process: the weight
store is created once; one process per TP rank builds SGLang's ModelRunner
loading from the store (every parameter a view, block-aware split
installed), prefills a batch of prompts and decodes greedily, then swaps in
the same model loaded by SGLang's normal loader and runs the same again.
Greedy tokens must be identical and logits equal within float32 tolerance,
at TP 1/2/4 for the tiny Llama (8 heads, store built for {1,2,4}) and TP 1/3
for SmolLM2-135M (9 heads, 3 KV heads, store {1,3}).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tiertp.engine.isolated import run_isolated
from tiertp.weights.verify import compare_level

pytestmark = pytest.mark.slow

_TIMEOUT_S = 600
PROMPTS = [[1, 504, 3458, 282, 4649, 314], [1, 1404, 2], [9856, 28, 253, 1215, 30, 2115, 11, 923, 17, 4]]


@pytest.mark.parametrize("model,levels,tp", [
    ("tiny-llama", [1, 2, 4], 1),
    ("tiny-llama", [1, 2, 4], 2),
    ("tiny-llama", [1, 2, 4], 4),
    ("smollm2-135m", [1, 3], 1),
    ("smollm2-135m", [1, 3], 3),
])
def test_store_views_match_sglang_normal_load(model, levels, tp):
    job = {"model": model, "tp": tp, "levels": levels, "prompts": PROMPTS, "decode_steps": 4,
           "max_total_tokens": 512, "dtype": "float32"}
    r = run_isolated(compare_level, job, timeout_s=_TIMEOUT_S)
    assert r["store_tokens"] == r["reference_tokens"]
    assert len(r["store_tokens"]) == len(PROMPTS) and all(len(t) == 5 for t in r["store_tokens"])
    assert r["max_abs_logit_diff"] <= 1e-5 * max(1.0, r["max_abs_logit"]), r
    assert len(r["ranks"]) == tp
    for rank in r["ranks"]:
        # Every parameter was replaced by a view inside the one store.
        assert rank["parameters"] == rank["model_parameters"] > 0
        assert rank["parameters_outside_store"] == []
        assert rank["reference_parameters_in_store"] == 0  # the reference really is the normal load
        assert rank["store_bytes"] == r["store_bytes"]
    # The ranks' views together cover the sharded weights once (replicated ones once per rank).
    assert sum(rank["view_bytes"] for rank in r["ranks"]) >= r["store_bytes"] * 0.9


def refuse_unknown_model(_: dict) -> str:
    """Runs isolated: bind_sglang_model must refuse a model that is not SGLang's Llama."""
    from tiertp.engine import sglang_compat

    sglang_compat.apply("cpu", 1)
    import torch

    from tiertp.weights import UnsupportedModel, bind_sglang_model

    try:
        bind_sglang_model(torch.nn.Linear(2, 2), None, 1, 0)
    except UnsupportedModel as e:
        return str(e)
    return "accepted"


def test_unknown_architecture_is_refused():
    tests_dir = str(Path(__file__).resolve().parent)
    message = run_isolated(refuse_unknown_model, {}, timeout_s=_TIMEOUT_S,
                           env={"PYTHONPATH": tests_dir})
    assert "torch.nn.modules.linear.Linear is not supported" in message
    assert "LlamaForCausalLM" in message

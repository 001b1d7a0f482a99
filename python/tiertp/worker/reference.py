"""Greedy generation run directly on SGLang, token ids in and out.

What the worker's output is compared with: the same model and prompt through
one plain `Engine.generate` call (SGLang's own continuous batching, no
tiertp scheduling). Run it under tiertp.engine.isolated.run_isolated
(`run_isolated(generate_ids, ...)`), never in a test process.
"""

from __future__ import annotations

from tiertp.engine.launch import EngineSpec, start_engine


def generate_ids(payload: dict) -> list[list[int]]:
    """Output token ids per prompt. Payload: model, input_ids ([[int]]), max_tokens,
    stop_token_ids ([int], optional), max_total_tokens (optional)."""
    spec = EngineSpec(model=payload["model"], tp=1, device="cpu", max_total_tokens=payload.get("max_total_tokens"))
    engine = start_engine(spec)
    try:
        params = {"temperature": 0.0, "max_new_tokens": int(payload["max_tokens"]),
                  "stop_token_ids": list(payload.get("stop_token_ids") or [])}
        outs = engine.generate(input_ids=[list(p) for p in payload["input_ids"]], sampling_params=params)
        return [list(o["output_ids"]) for o in outs]
    finally:
        engine.shutdown()


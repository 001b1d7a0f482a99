"""Greedy generation through a plain SGLang `Engine`: what tests compare tiertp with.

The same model through one `Engine.generate` call (SGLang's own continuous
batching, no tiertp scheduling). Run these under
tiertp.engine.isolated.run_isolated with this folder on the child's path
(`ISOLATED_ENV`), never in a test process: the engine starts processes of
its own.
"""

from __future__ import annotations

from pathlib import Path

from tiertp.engine.launch import EngineSpec, start_engine

# What run_isolated's child needs to import this module.
ISOLATED_ENV = {"PYTHONPATH": str(Path(__file__).resolve().parent)}


def generate_text(payload: dict) -> list[str]:
    """Greedy completions of payload["prompts"] (chat-formatted if payload["chat"]).

    Payload: model, tp, device (default cpu), prompts, max_new_tokens (16), chat (True).
    """
    spec = EngineSpec(model=payload["model"], tp=int(payload.get("tp", 1)), device=payload.get("device", "cpu"))
    engine = start_engine(spec)
    try:
        prompts = list(payload["prompts"])
        if payload.get("chat", True):
            tok = engine.tokenizer_manager.tokenizer
            prompts = [
                tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
                for p in prompts
            ]
        params = {"temperature": 0.0, "max_new_tokens": int(payload.get("max_new_tokens", 16))}
        return [o["text"] for o in engine.generate(prompts, params)]
    finally:
        engine.shutdown()


def generate_ids(payload: dict) -> list[list[int]]:
    """Output token ids per prompt, at TP1 on the CPU. Payload: model, input_ids
    ([[int]]), max_tokens, stop_token_ids ([int], optional), max_total_tokens (optional)."""
    spec = EngineSpec(model=payload["model"], tp=1, device="cpu", max_total_tokens=payload.get("max_total_tokens"))
    engine = start_engine(spec)
    try:
        params = {"temperature": 0.0, "max_new_tokens": int(payload["max_tokens"]),
                  "stop_token_ids": list(payload.get("stop_token_ids") or [])}
        outs = engine.generate(input_ids=[list(p) for p in payload["input_ids"]], sampling_params=params)
        return [list(o["output_ids"]) for o in outs]
    finally:
        engine.shutdown()

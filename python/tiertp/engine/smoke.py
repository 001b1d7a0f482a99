"""Greedy generation through a real SGLang engine: a check that an engine works.

`generate` is meant to run under tiertp.engine.isolated.run_isolated
(`run_isolated(generate, ...)`), which keeps engine processes out
of the caller's process.
"""

from __future__ import annotations

from tiertp.engine.launch import EngineSpec, start_engine


def generate(payload: dict) -> list[str]:
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
        outputs = engine.generate(prompts, params)
        return [o["text"] for o in outputs]
    finally:
        engine.shutdown()

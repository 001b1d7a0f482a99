"""`EngineStepRunner`: the fallback StepRunner on SGLang's `Engine`, one token at a time.

Each iteration is one `Engine.generate` call over the batch with
`max_new_tokens=1` and each request's prompt plus the tokens generated so
far. SGLang's radix cache matches everything but the newest token, so an
iteration extends one token per request instead of re-running the prompt.
It cannot migrate KV or switch TP; it stays as a reference and fallback
(`TIERTP_STEP_RUNNER=engine`, or the execution process's ``--runner engine``).
"""

from __future__ import annotations

from tiertp.engine.launch import EngineSpec, start_engine
from tiertp.tp_group import TpGroup
from tiertp.worker.step_runner import ModelLimits, StepInput, StepOutput, StepRunner


class EngineStepRunner(StepRunner):
    def __init__(self, model: str, group: TpGroup, max_total_tokens: int, extra_engine_args: dict | None = None):
        self.model = model
        self.group = group
        self.max_total_tokens = max_total_tokens
        self.extra = dict(extra_engine_args or {})
        self._engine = None

    def start(self) -> ModelLimits:
        spec = EngineSpec(model=self.model, tp=self.group.tp, device="cpu",
                          max_total_tokens=self.max_total_tokens, extra=self.extra)
        self._engine = start_engine(spec)
        tm = self._engine.tokenizer_manager
        return ModelLimits(
            vocab_size=int(tm.model_config.vocab_size),
            max_request_tokens=min(int(tm.context_len), self.max_total_tokens),
            kv_capacity_tokens=self.max_total_tokens,
        )

    def step(self, batch: list[StepInput]) -> list[StepOutput]:
        params = []
        for r in batch:
            s = r.sampling
            p = {"max_new_tokens": 1, "temperature": s.temperature, "top_p": s.top_p,
                 "stop_token_ids": list(s.stop_token_ids)}
            if s.seed is not None:
                # A fixed seed per step would repeat the same draw every step.
                p["sampling_seed"] = (s.seed + r.generated) % 2**63
            params.append(p)
        outs = self._engine.generate(input_ids=[r.token_ids for r in batch], sampling_params=params)
        if isinstance(outs, dict):
            outs = [outs]
        result = []
        for r, o in zip(batch, outs, strict=True):
            ids = o.get("output_ids") or []
            if len(ids) != 1:
                raise RuntimeError(f"request {r.rid}: SGLang returned {len(ids)} tokens for a 1-token step")
            reason = (o.get("meta_info") or {}).get("finish_reason") or {}
            result.append(StepOutput(r.rid, int(ids[0]), stopped=reason.get("type") == "stop"))
        return result

    def close(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None:
            engine.shutdown()

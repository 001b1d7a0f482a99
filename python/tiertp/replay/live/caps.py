"""Length caps: the same cut of a trace's prompt and output lengths for the
live replay and the simulator (a slow CPU server cannot serve the Azure
traces' ~1k-token prompts at any useful rate). The caps are part of the
workload, so they are recorded in every report that used them."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from tiertp.traces import Trace


@dataclass(frozen=True)
class LengthCaps:
    """Upper bounds on prompt and output tokens per request (None: no cap)."""

    max_prompt_tokens: int | None = None
    max_output_tokens: int | None = None

    def __post_init__(self):
        for name in ("max_prompt_tokens", "max_output_tokens"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {v}")

    def apply(self, trace: Trace) -> Trace:
        """`trace` with every length clipped to its cap (arrivals and tiers kept)."""
        prompt, output = trace.prompt_tokens, trace.output_tokens
        if self.max_prompt_tokens is not None:
            prompt = np.minimum(prompt, self.max_prompt_tokens)
        if self.max_output_tokens is not None:
            output = np.minimum(output, self.max_output_tokens)
        return replace(trace, prompt_tokens=prompt, output_tokens=output)

    def describe(self, trace: Trace) -> dict:
        """The caps and how many requests of `trace` (uncapped) each one cut."""
        out = {"max_prompt_tokens": self.max_prompt_tokens, "max_output_tokens": self.max_output_tokens}
        if self.max_prompt_tokens is not None:
            out["prompts_capped"] = int((trace.prompt_tokens > self.max_prompt_tokens).sum())
        if self.max_output_tokens is not None:
            out["outputs_capped"] = int((trace.output_tokens > self.max_output_tokens).sum())
        return out

"""Per-request sampling: greedy, or temperature + top-p with an optional seed.

Why tiertp samples itself instead of SGLang's sampler: a seeded request must
draw the same tokens whatever batch it shares, whatever TP level it runs at
and across a KV migration. SGLang's seeded sampling ties the draw to its own
batch state; here every draw uses a generator seeded from (request seed,
index of the token in the output), both of which travel with the request.
Only the leader samples; followers receive the chosen tokens with the next
command, so the ranks can never disagree.
"""

from __future__ import annotations

import os

import torch

from tiertp.execution.records import Sampling

_SEED_MIX = 0x9E3779B97F4A7C15  # golden-ratio constant: spreads (seed, step) pairs apart


def step_seed(seed: int, step: int) -> int:
    """The generator seed for output token `step` of a request seeded `seed`."""
    return (seed * _SEED_MIX + step) % (2**63 - 1)


class Sampler:
    """Picks one token per logits row. Unseeded draws use this sampler's own
    generator (seeded from the OS), so they differ between runs, as asked."""

    def __init__(self):
        self._unseeded = torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)

    def sample(self, logits: torch.Tensor, rows: list[tuple[Sampling, int]]) -> list[int]:
        """`logits` [n, vocab]; `rows[i]` = (sampling of row i, index of the token being drawn)."""
        if logits.shape[0] != len(rows):
            raise ValueError(f"{logits.shape[0]} logits rows for {len(rows)} requests")
        out = logits.argmax(dim=-1).tolist()
        for i, (s, step) in enumerate(rows):
            if not s.greedy:
                out[i] = self._draw(logits[i].float(), s, step)
        return [int(t) for t in out]

    def _draw(self, logits: torch.Tensor, s: Sampling, step: int) -> int:
        probs = torch.softmax(logits / s.temperature, dim=-1)
        if s.top_p < 1.0:
            sorted_p, order = probs.sort(descending=True)
            # Keep the smallest prefix whose mass reaches top_p (the first token always).
            drop = sorted_p.cumsum(0) - sorted_p >= s.top_p
            sorted_p[drop] = 0.0
            probs = torch.zeros_like(probs).scatter_(0, order, sorted_p)
        gen = self._unseeded if s.seed is None else torch.Generator().manual_seed(step_seed(s.seed, step))
        return int(torch.multinomial(probs, 1, generator=gen).item())

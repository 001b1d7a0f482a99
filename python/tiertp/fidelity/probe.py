"""The probes a fidelity run sends before its loads.

- The unloaded probe: a few requests sent one at a time (nothing else in
  the system), measured live and simulated alone. It separates the engine
  model's error (profile vs the serving engine, per iteration) from the
  scheduling and queueing the loaded runs add. It sends prompts of two
  lengths, the load's median and a quarter of it (`second_probe_tokens`):
  two lengths tell a TTFT excess that grows with the prompt (a slower
  prefill) from one that does not (the serving path's own latency to a
  first token; calibration.py). The second is shorter, not longer: a long
  prompt may be one the tiers' TTFT does not admit, and the gateway sheds
  it.
- The loaded probe: waves of requests sent together (2, 4, 8, ... at once),
  each wave awaited before the next. Their per-token times show what a
  decode step costs as served when several requests run: the profile times
  the forward pass alone, the serving stack adds work per running request
  (calibration.py fits it).
"""

from __future__ import annotations

import asyncio
import statistics
from dataclasses import dataclass

import aiohttp
import numpy as np

from tiertp.replay.live.client import request_body, send_one
from tiertp.replay.live.limits import Limits
from tiertp.replay.live.records import RequestRecord
from tiertp.replay.sim_run import SimContext, run_once
from tiertp.replay.workload import Load
from tiertp.traces import make_trace


async def _send_sequentially(session_info, keys, prompts, specs, limits: Limits) -> list[RequestRecord]:
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    records = []
    async with aiohttp.ClientSession() as http:
        for i, (tier, p, o) in enumerate(specs):
            r = RequestRecord(i, tier, p, o, loop.time() - t0)
            body = request_body(session_info.model, prompts.ids(1_000_000 + i, p), o)
            await send_one(http, session_info.completions_url, keys[tier], body, r, limits,
                           lambda: loop.time() - t0)
            records.append(r)
    return records


@dataclass
class LoadedProbe:
    """The loaded probe's requests as sent and measured; `concurrency[i]` is
    the size of the wave request i was sent in."""

    prompt_tokens: int
    output_tokens: int
    records: list[RequestRecord]
    concurrency: list[int]


async def _send_waves(session_info, keys, prompts, tiers: list[str], prompt_tokens: int, output_tokens: int,
                      waves: list[int], limits: Limits) -> tuple[list[RequestRecord], list[int]]:
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    records, sizes = [], []
    async with aiohttp.ClientSession() as http:
        for size in waves:
            wave = []
            for _ in range(size):
                i = len(records)
                r = RequestRecord(i, tiers[i % len(tiers)], prompt_tokens, output_tokens, loop.time() - t0)
                body = request_body(session_info.model, prompts.ids(2_000_000 + i, prompt_tokens), output_tokens)
                wave.append(send_one(http, session_info.completions_url, keys[r.tier], body, r, limits,
                                     lambda: loop.time() - t0))
                records.append(r)
                sizes.append(size)
            await asyncio.gather(*wave)
    return records, sizes


# The unloaded probe's second prompt length, as a fraction of the first.
SECOND_PROBE_FRACTION = 0.25


def second_probe_tokens(prompt_tokens: int) -> int | None:
    """The unloaded probe's second prompt length beside `prompt_tokens`
    (module doc), or None where that prompt is too short to have one."""
    second = int(prompt_tokens * SECOND_PROBE_FRACTION)
    return second if second >= 1 else None


def loaded_probe(session, prompt_tokens: int, output_tokens: int, concurrencies: list[int], repeats: int,
                 limits: Limits) -> LoadedProbe:
    """`repeats` waves of each size in `concurrencies`, smallest first, the
    requests of a wave spread over the tiers in turn."""
    waves = [c for c in sorted(set(concurrencies)) for _ in range(repeats)]
    records, sizes = asyncio.run(_send_waves(session.info, session.keys, session.prompts, list(session.tier_names),
                                             prompt_tokens, output_tokens, waves, limits))
    return LoadedProbe(prompt_tokens, output_tokens, records, sizes)


def probe(session, ctx: SimContext, policy: str, prompt_tokens: int, output_tokens: int, per_tier: int,
          limits: Limits, second_prompt_tokens: int | None = None) -> dict:
    """`per_tier` requests of each tier, one at a time, of the given lengths:
    per tier the median measured TTFT/TPOT and the simulator's for the same
    request alone. With `second_prompt_tokens`, as many again of that prompt
    length, reported under "second_length" in the same form."""
    names = session.tier_names
    lengths = [prompt_tokens] + ([second_prompt_tokens] if second_prompt_tokens else [])
    specs = [(t, p, output_tokens) for p in lengths for _ in range(per_tier) for t in names]
    records = asyncio.run(_send_sequentially(session.info, session.keys, session.prompts, specs, limits))
    out = {"prompt_tokens": prompt_tokens, "output_tokens": output_tokens, "requests_per_tier": per_tier,
           "policy": policy, "tiers": _per_tier(ctx, policy, names, records, prompt_tokens, output_tokens)}
    if second_prompt_tokens:
        out["second_length"] = {"prompt_tokens": second_prompt_tokens,
                                "tiers": _per_tier(ctx, policy, names, records, second_prompt_tokens, output_tokens)}
    return out


def _per_tier(ctx: SimContext, policy: str, names: list[str], records: list[RequestRecord], prompt_tokens: int,
              output_tokens: int) -> dict:
    """Per tier, the probe's requests of this prompt length: measured
    medians, the simulator's figures for one such request alone, ratios."""
    out = {}
    for k, name in enumerate(names):
        trace = make_trace("probe", [0.0], [prompt_tokens], [output_tokens], tier=[k], tier_names=names)
        sim = run_once(ctx, Load(None, trace, 1.0), policy, {})
        mine = [r for r in records if r.tier == name and r.prompt_tokens == prompt_tokens]
        done = [r for r in mine if r.status == "completed"]
        failed = [r.failure.message for r in mine if r.failure is not None]
        measured = {m: statistics.median(getattr(r, m) for r in done) if done else None for m in ("ttft_ms", "tpot_ms")}
        out[name] = {
            "predicted": {"ttft_ms": float(sim.ttft_ms[0]), "tpot_ms": float(sim.tpot_ms[0])},
            "measured": measured,
            "ratio": {m: (measured[m] / float(getattr(sim, m)[0]) if measured[m] and np.isfinite(getattr(sim, m)[0])
                          and getattr(sim, m)[0] > 0 else None) for m in ("ttft_ms", "tpot_ms")},
            "failed": failed,
        }
    return out


def probe_blocks(result: dict) -> list[tuple[int, dict]]:
    """(prompt length, per-tier figures) for each prompt length the unloaded
    probe sent."""
    second = result.get("second_length")
    return [(result.get("prompt_tokens"), result["tiers"])] + (
        [(second["prompt_tokens"], second["tiers"])] if second else [])


def probe_table(result: dict) -> str:
    lines = [f"unloaded probe ({result['requests_per_tier']} request(s) per tier and prompt length, one at a time, "
             f"{result['output_tokens']} output tokens), predicted/measured:"]
    for prompt_tokens, tiers in probe_blocks(result):
        for name, t in tiers.items():
            cells = []
            for m in ("ttft_ms", "tpot_ms"):
                p, v, ratio = t["predicted"][m], t["measured"][m], t["ratio"][m]
                cells.append(f"{m[:4].upper()} {p:.0f}/{'-' if v is None else f'{v:.0f}'} ms"
                             + ("" if ratio is None else f" (x{ratio:.2f})"))
            lines.append(f"  {name}, {prompt_tokens} prompt tokens: " + ", ".join(cells)
                         + (f"; {len(t['failed'])} failed" if t["failed"] else ""))
    return "\n".join(lines)

"""The probes a fidelity run sends before its loads.

- The unloaded probe: a few requests sent one at a time (nothing else in
  the system), measured live and simulated as sent: the same requests at
  the same times, so that both planners see the same arrivals and lay the
  devices out alike. (Simulated one by one from an empty history, a lone
  request may be planned onto a TP2 group where the live plan kept TP1: a
  940-token prompt predicted at TP2's 329 ms ran live in 542 ms, about
  TP1's 463, and the fit took the TP levels' difference for a slower
  engine.) It separates the engine model's error (profile vs the serving
  engine, per iteration) from the scheduling and queueing the loaded runs
  add. Each tier gets prompts of
  two lengths, its own median prompt in the load and a quarter of it
  (`tier_prompt_medians`, `second_probe_tokens`): two lengths tell a TTFT
  excess that grows with the prompt (a slower prefill) from one that does
  not (the serving path's own latency to a first token; calibration.py).
  Each tier's own median, not the load's: a tier whose prompts are several
  times the load's median meets costs the median never does (in
  docs/fidelity.md's run 18, agent's 950-token prompts passed the plan's
  chunk size and took a second, then costly, iteration; the probe had
  sent 174 tokens). The second length is shorter, not longer: a long
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
import math
import statistics
from dataclasses import dataclass

import aiohttp
import numpy as np

from tiertp.replay.live.client import request_body, send_one
from tiertp.replay.live.limits import Limits
from tiertp.replay.live.records import RequestRecord
from tiertp.replay.sim_run import SimContext, run_once
from tiertp.replay.workload import Load
from tiertp.traces import Trace, make_trace


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


def tier_prompt_medians(trace: Trace) -> dict[str, int]:
    """Each tier's median prompt length in `trace`; the whole trace's for a
    tier with no request in it."""
    overall = int(np.median(trace.prompt_tokens))
    out = {}
    for k, name in enumerate(trace.tier_names):
        mine = trace.prompt_tokens[trace.tier == k]
        out[name] = int(np.median(mine)) if mine.size else overall
    return out


def probe(session, ctx: SimContext, policy: str, prompt_tokens: dict[str, int], output_tokens: int, per_tier: int,
          limits: Limits) -> dict:
    """`per_tier` requests of each tier, one at a time, of that tier's
    prompt length in `prompt_tokens`, then as many of its
    `second_probe_tokens`: per tier and length the median measured
    TTFT/TPOT and the simulator's for the same requests replayed as sent
    (the second lengths under "second_length", in the same form)."""
    names = list(session.tier_names)
    second = {t: second_probe_tokens(prompt_tokens[t]) for t in names}
    second = {t: p for t, p in second.items() if p}
    specs = [(t, prompt_tokens[t], output_tokens) for _ in range(per_tier) for t in names]
    specs += [(t, second[t], output_tokens) for _ in range(per_tier) for t in names if t in second]
    records = asyncio.run(_send_sequentially(session.info, session.keys, session.prompts, specs, limits))
    predicted = _simulate_as_sent(ctx, policy, names, records)
    out = {"output_tokens": output_tokens, "requests_per_tier": per_tier, "policy": policy,
           "tiers": _per_tier(records, predicted, prompt_tokens)}
    if second:
        out["second_length"] = {"tiers": _per_tier(records, predicted, second)}
    return out


_FIGURES = ("ttft_ms", "tpot_ms")


def _simulate_as_sent(ctx: SimContext, policy: str, names: list[str], records: list[RequestRecord]) -> dict:
    """The simulator's TTFT and TPOT of each probe request (in `records`'
    order), the probe replayed at its live send times."""
    sent = [r.sent_s if math.isfinite(r.sent_s) else r.scheduled_s for r in records]
    trace = make_trace("probe", sent, [r.prompt_tokens for r in records], [r.max_tokens for r in records],
                       tier=[names.index(r.tier) for r in records], tier_names=names, rebase=True)
    sim = run_once(ctx, Load(None, trace, 1.0), policy, {})
    # make_trace sorts by arrival (stably); back to the records' order.
    order = np.argsort(np.asarray(sent), kind="stable")
    out = {}
    for m in _FIGURES:
        values = np.empty(len(records))
        values[order] = getattr(sim, m)
        out[m] = values
    return out


def _per_tier(records: list[RequestRecord], predicted: dict, prompt_tokens: dict[str, int]) -> dict:
    """Per tier of `prompt_tokens`, the probe's requests of that tier's
    prompt length: measured and simulated medians, and their ratios."""
    out = {}
    for name, p in prompt_tokens.items():
        mine = [i for i, r in enumerate(records) if r.tier == name and r.prompt_tokens == p]
        done = [records[i] for i in mine if records[i].status == "completed"]
        failed = [records[i].failure.message for i in mine if records[i].failure is not None]
        measured = {m: statistics.median(getattr(r, m) for r in done) if done else None for m in _FIGURES}
        sim = {}
        for m in _FIGURES:
            finite = [float(predicted[m][i]) for i in mine if np.isfinite(predicted[m][i])]
            sim[m] = float(np.median(finite)) if finite else math.nan
        out[name] = {
            "prompt_tokens": p,
            "predicted": sim,
            "measured": measured,
            "ratio": {m: measured[m] / sim[m] if measured[m] and np.isfinite(sim[m]) and sim[m] > 0 else None
                      for m in _FIGURES},
            "failed": failed,
        }
    return out


def probe_blocks(result: dict) -> list[dict]:
    """The per-tier figures of each prompt length the unloaded probe sent
    (each tier's own length, then its second)."""
    second = result.get("second_length")
    return [result["tiers"]] + ([second["tiers"]] if second else [])


def probe_table(result: dict) -> str:
    lines = [f"unloaded probe ({result['requests_per_tier']} request(s) per tier and prompt length, one at a time, "
             f"{result['output_tokens']} output tokens), predicted/measured:"]
    for tiers in probe_blocks(result):
        for name, t in tiers.items():
            cells = []
            for m in _FIGURES:
                p, v, ratio = t["predicted"][m], t["measured"][m], t["ratio"][m]
                cells.append(f"{m[:4].upper()} {p:.0f}/{'-' if v is None else f'{v:.0f}'} ms"
                             + ("" if ratio is None else f" (x{ratio:.2f})"))
            lines.append(f"  {name}, {t['prompt_tokens']} prompt tokens: " + ", ".join(cells)
                         + (f"; {len(t['failed'])} failed" if t["failed"] else ""))
    return "\n".join(lines)

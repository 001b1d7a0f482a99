"""Writes the Azure-format traces (with their optional tier column) of the
live TP-switch fidelity runs (docs/fidelity.md, "Live TP switches"), 32
output tokens per request. Fixed seeds: rerunning rewrites the same files.

- ``tp-switch.csv``: 70 s of short prompts (mean 150 tokens) at 1 req/s for
  chat, then, from 60 s to 180 s, prompts of ~950 tokens at 0.35 req/s for
  agent. On a 2-core CPU host with `small-llama` the first phase is served
  best by TP1 groups, the second only by one TP2 group (TP1 cannot prefill
  950 tokens within the 600 ms TTFT of tiers-tp-switch.toml), so both the
  simulator and the gateway switch TP.
- ``tp-switch-handoff.csv``: chat, agent, then chat again (0-50 s, 40-150 s,
  140-200 s; same rates and lengths). With tiers-tp-switch-handoff.toml
  chat's TPOT is below any iteration that carries a prefill chunk, so only
  a TP1 prefill group handing off to a TP1 decode group serves it (every
  chat request is handed off), and agent's TTFT lets only a TP2 group
  prefill its prompts: the layout splits, merges and splits again. Each
  phase outlasts the control loop's demand memory (30 s), so a tier gone
  quiet gives its GPUs up before the next phase ends.

    python bench/fidelity/make_tp_switch_traces.py bench/fidelity
"""

from __future__ import annotations

import datetime
import random
import sys
from pathlib import Path

START = datetime.datetime(2024, 1, 1)
HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens,tier\n"

CHAT = dict(tier="chat", rate=1.0, mean=150.0, sd=40.0)
AGENT = dict(tier="agent", rate=0.35, mean=950.0, sd=50.0)

# file name -> (seed, phases as (kind, start_s, end_s))
TRACES = {
    "tp-switch.csv": (2, [(CHAT, 0.0, 70.0), (AGENT, 60.0, 180.0)]),
    "tp-switch-handoff.csv": (3, [(CHAT, 0.0, 50.0), (AGENT, 40.0, 150.0), (CHAT, 140.0, 200.0)]),
}


def _stamp(seconds: float) -> str:
    return (START + datetime.timedelta(seconds=seconds)).strftime("%Y-%m-%d %H:%M:%S.%f")


def phase(rng: random.Random, tier: str, start_s: float, end_s: float, rate: float, mean: float, sd: float) -> list:
    """Poisson arrivals in [start_s, end_s); prompt lengths ~ N(mean, sd) clipped to [16, 1024]."""
    rows, t = [], start_s
    while True:
        t += rng.expovariate(rate)
        if t >= end_s:
            return rows
        rows.append((t, max(16, min(1024, int(rng.gauss(mean, sd)))), 32, tier))


def write(out: Path, name: str) -> None:
    seed, phases = TRACES[name]
    rng = random.Random(seed)
    rows = [row for kind, start, end in phases for row in phase(rng, start_s=start, end_s=end, **kind)]
    rows.sort(key=lambda r: r[0])
    (out / name).write_text(HEADER + "".join(f"{_stamp(s)},{p},{o},{t}\n" for s, p, o, t in rows))
    print(f"wrote {len(rows)} requests to {out / name}")


def main(out: Path) -> None:
    for name in TRACES:
        write(out, name)


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent))

"""Writes the Azure-format trace (with its optional tier column) of the
live TP-switch fidelity run (docs/fidelity.md, "Live TP switches"): 70 s
of short prompts (mean 150 tokens) at 1 req/s for chat, then, from 60 s to
180 s, prompts of ~950 tokens at 0.35 req/s for agent; 32 output tokens
each. On a 2-core CPU
host with `small-llama` the first phase is served best by TP1 groups, the
second only by one TP2 group (TP1 cannot prefill 950 tokens within the
600 ms TTFT of tiers-tp-switch.toml), so both the simulator and the
gateway switch TP. Fixed seed: rerunning rewrites the same file.

    python bench/fidelity/make_tp_switch_traces.py bench/fidelity
"""

from __future__ import annotations

import datetime
import random
import sys
from pathlib import Path

START = datetime.datetime(2024, 1, 1)
HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens,tier\n"


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


def main(out: Path) -> None:
    rng = random.Random(2)
    rows = phase(rng, "chat", 0.0, 70.0, 1.0, 150.0, 40.0) + phase(rng, "agent", 60.0, 180.0, 0.35, 950.0, 50.0)
    rows.sort(key=lambda r: r[0])
    (out / "tp-switch.csv").write_text(HEADER + "".join(f"{_stamp(s)},{p},{o},{t}\n" for s, p, o, t in rows))
    print(f"wrote {len(rows)} requests to {out / 'tp-switch.csv'}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent))

"""report.json and report.csv of a replay sweep."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

from tiertp.replay.metrics import FAIR_MIN_GOODPUT_FRACTION, FAIR_MIN_REQUEST_SHARE, PERCENTILES
from tiertp.replay.policies import label
from tiertp.replay.sweep import LoadResult

CSV_COLUMNS = (
    ["policy", "rps", "offered_rps", "settings", "policy_goodput_rps", "policy_attainment",
     "tier", "requests", "completed", "rejected", "met", "attainment", "goodput_rps"]
    + [f"{m}_p{p}_ms" for m in ("ttft", "tpot") for p in PERCENTILES]
    + ["switches", "migrated_requests", "policy_fair"]
)
# Marks an unfair total in goodput_table (see metrics.fair).
UNFAIR = "*"


def _clean(value):
    """JSON without NaN/Infinity (null instead)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def report_dict(config: dict, results: list[LoadResult]) -> dict:
    """The whole report: the configuration, then per load and policy the
    best run's figures, whether its goodput is fair across tiers
    (metrics.fair), its timeline and every variant tried."""
    loads = []
    for r in results:
        loads.append({
            "rps": r.load.rps,
            "offered_rps": r.load.offered_rps,
            "window_s": r.load.window_s,
            "requests": len(r.load.trace),
            "policies": {p: {**e.best.summary(), "fair": e.best.metrics.fair, "tried": e.tried}
                         for p, e in r.policies.items()},
        })
    return _clean({**config, "loads": loads})


def write_json(path: Path, config: dict, results: list[LoadResult]) -> None:
    path.write_text(json.dumps(report_dict(config, results), indent=1, allow_nan=False) + "\n")


def csv_rows(results: list[LoadResult]) -> list[dict]:
    """One row per policy x load x tier."""
    rows = []
    for r in results:
        for policy, entry in r.policies.items():
            m = entry.best.metrics
            for t in m.tiers:
                row = {
                    "policy": policy, "rps": r.load.rps, "offered_rps": round(m.offered_rps, 4),
                    "settings": label(entry.best.settings), "policy_goodput_rps": round(m.goodput_rps, 4),
                    "policy_attainment": round(m.attainment, 4), "tier": t.tier, "requests": t.requests,
                    "completed": t.completed, "rejected": t.rejected, "met": t.met,
                    "attainment": None if t.attainment is None else round(t.attainment, 4),
                    "goodput_rps": round(t.goodput_rps, 4),
                    "switches": entry.best.switches, "migrated_requests": entry.best.migrated_requests,
                    "policy_fair": m.fair,
                }
                for name, values in (("ttft", t.ttft_ms), ("tpot", t.tpot_ms)):
                    for p in PERCENTILES:
                        v = values[f"p{p}"]
                        row[f"{name}_p{p}_ms"] = None if v is None else round(v, 3)
                rows.append(row)
    return rows


def write_csv(path: Path, results: list[LoadResult]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        writer.writerows(csv_rows(results))


def goodput_table(results: list[LoadResult]) -> str:
    """A plain-text table, a column per load: per policy a row with its
    total goodput req/s (winning setting; UNFAIR marks a total that starves
    a tier, see metrics.fair) and under it one row per tier with that
    tier's goodput."""
    policies = list(dict.fromkeys(p for r in results for p in r.policies))
    tiers = list(dict.fromkeys(t.tier for r in results for e in r.policies.values() for t in e.best.metrics.tiers))
    head = ["policy"] + [f"{r.load.offered_rps:.1f} rps" for r in results]
    lines = [head]
    unfair = False
    for p in policies:
        total = [p]
        per_tier = {t: [f"  {t}"] for t in tiers}
        for r in results:
            e = r.policies.get(p)
            m = None if e is None else e.best.metrics
            if m is None:
                total.append("-")
            else:
                unfair |= not m.fair
                total.append(f"{m.goodput_rps:.2f}{'' if m.fair else UNFAIR} ({label(e.best.settings)})")
            by_tier = {} if m is None else {t.tier: t.goodput_rps for t in m.tiers}
            for t, cells in per_tier.items():
                cells.append(f"{by_tier[t]:.2f}" if t in by_tier else "-")
        lines += [total, *per_tier.values()]
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    text = "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in lines)
    if unfair:
        text += (f"\n{UNFAIR} unfair: a tier with >= {FAIR_MIN_REQUEST_SHARE:.0%} of the requests got "
                 f"< {FAIR_MIN_GOODPUT_FRACTION:g}x its proportional share of the goodput")
    return text

"""Predicted (simulator) vs measured (live) figures of one load, per tier
and overall, with relative errors; and their text table."""

from __future__ import annotations

from tiertp.replay.metrics import PERCENTILES, RunMetrics

ALL_TIERS = "all"
# The compared figures, the one list: (name, how to read it from a TierMetrics/RunMetrics).
FIGURES = (
    ["goodput_rps", "attainment"]
    + [f"ttft_p{p}_ms" for p in PERCENTILES]
    + [f"tpot_p{p}_ms" for p in PERCENTILES]
)


def rel_err(predicted: float | None, measured: float | None) -> float | None:
    """(predicted - measured) / measured; None when either is missing or measured is 0."""
    if predicted is None or measured is None or measured == 0:
        return None
    return (predicted - measured) / measured


def _figures(m) -> dict[str, float | None]:
    """FIGURES of a TierMetrics (or of a RunMetrics: no latency percentiles there)."""
    out = {"goodput_rps": m.goodput_rps, "attainment": m.attainment}
    for metric in ("ttft", "tpot"):
        values = getattr(m, f"{metric}_ms", None)
        for p in PERCENTILES:
            out[f"{metric}_p{p}_ms"] = values[f"p{p}"] if values else None
    return out


def compare(predicted: RunMetrics, measured: RunMetrics) -> list[dict]:
    """One row per tier (in tier order) and one for all tiers:
    {tier, requests, <figure>: {predicted, measured, rel_err}}."""
    rows = []
    pairs = [(ALL_TIERS, predicted, measured, measured.requests)]
    pairs += [(pt.tier, pt, mt, mt.requests) for pt, mt in zip(predicted.tiers, measured.tiers, strict=True)]
    for tier, p, m, n in pairs:
        fp, fm = _figures(p), _figures(m)
        rows.append({"tier": tier, "requests": n,
                     **{f: {"predicted": fp[f], "measured": fm[f], "rel_err": rel_err(fp[f], fm[f])}
                        for f in FIGURES}})
    return rows


def _cell(entry: dict, digits: int) -> str:
    p, m, e = entry["predicted"], entry["measured"], entry["rel_err"]
    if p is None and m is None:
        return "-"
    fmt = f"{{:.{digits}f}}"
    text = f"{'-' if p is None else fmt.format(p)}/{'-' if m is None else fmt.format(m)}"
    return text + ("" if e is None else f" ({e:+.0%})")


def table(rows: list[dict]) -> str:
    """Text table: one line per tier, cells `predicted/measured (rel err)`."""
    head = ["tier", "n"] + FIGURES
    lines = [head]
    for r in rows:
        lines.append([r["tier"], str(r["requests"])]
                     + [_cell(r[f], 2 if f in ("goodput_rps", "attainment") else 0) for f in FIGURES])
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in lines)

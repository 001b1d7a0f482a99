"""PNG plots of a replay sweep (matplotlib, Agg backend: no display needed):
goodput vs offered load, the cluster configuration over time, latency CDFs."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.patches import Patch, Rectangle  # noqa: E402
from matplotlib.ticker import NullFormatter  # noqa: E402

from tiertp.replay.metrics import TierSlo  # noqa: E402
from tiertp.replay.policies import label  # noqa: E402
from tiertp.replay.sim_run import RunOutcome  # noqa: E402
from tiertp.replay.sweep import LoadResult  # noqa: E402

ROLE_HATCH = {"prefill": "///", "decode": "...", "colocated": ""}
DPI = 120


def _policy_style(policies: list[str]) -> dict[str, dict]:
    cmap = plt.get_cmap("tab10")
    return {p: {"color": cmap(i % 10), "linestyle": "-" if p.startswith("tiertp") or p == "oracle" else "--",
                "marker": "os^vD<>ph*"[i % 10]} for i, p in enumerate(policies)}


def plot_goodput(path: Path, results: list[LoadResult], title: str) -> None:
    """Goodput and SLO attainment vs offered load, one line per policy."""
    policies = list(dict.fromkeys(p for r in results for p in r.policies))
    style = _policy_style(policies)
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    offered = [r.load.offered_rps for r in results]
    for p in policies:
        xs = [r.load.offered_rps for r in results if p in r.policies]
        ax.plot(xs, [r.policies[p].best.metrics.goodput_rps for r in results if p in r.policies], label=p, **style[p])
        ax2.plot(xs, [100 * r.policies[p].best.metrics.attainment for r in results if p in r.policies], label=p, **style[p])
    ax.plot(offered, offered, color="0.6", linewidth=1, linestyle=":", label="offered")
    ax.set(xlabel="offered load (req/s)", ylabel="goodput (req/s within both SLOs)", title="goodput")
    ax2.set(xlabel="offered load (req/s)", ylabel="requests within SLO (%)", title="SLO attainment", ylim=(0, 102))
    for a in (ax, ax2):
        a.grid(alpha=0.3)
    ax2.legend(fontsize=8, loc="lower left")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def _segments(timeline: list[dict], end_s: float) -> list[tuple[float, float, dict]]:
    """(start, end, group) spans: a group kept across plan changes is one span."""
    spans, open_at = [], {}
    for entry in timeline:
        t = float(entry["time_s"])
        keys = {(g["tier"], g["role"], g["tp"], g["first_gpu"]): g for g in entry["groups"]}
        for k in list(open_at):
            if k not in keys:
                t0, g0 = open_at.pop(k)
                spans.append((t0, t, g0))
        for k, g in keys.items():
            open_at.setdefault(k, (t, g))
    for k, (t0, g) in open_at.items():
        spans.append((t0, end_s, g))
    return spans


def plot_timeline(path: Path, run: RunOutcome, arrival_s: np.ndarray, tier: np.ndarray, slos: list[TierSlo],
                  gpus: int, title: str) -> None:
    """Offered load per tier (top) and GPU x time configuration (bottom):
    color = tier, hatch = role, label = TP level."""
    end = max(run.sim_end_s if np.isfinite(run.sim_end_s) else 0.0, float(arrival_s[-1]) if len(arrival_s) else 1.0)
    names = [s.name for s in slos]
    cmap = plt.get_cmap("tab10")
    color = {n: cmap(i % 10) for i, n in enumerate(names)}
    fig, (top, ax) = plt.subplots(2, 1, figsize=(13, 6.5), sharex=True, gridspec_kw={"height_ratios": [1, 2.2]})
    bin_s = max(end / 120, 1.0)
    bins = np.arange(0, end + bin_s, bin_s)
    for i, n in enumerate(names):
        counts, _ = np.histogram(arrival_s[tier == i], bins)
        if counts.any():
            top.step(bins[:-1], counts / bin_s, where="post", color=color[n], label=n)
    top.set(ylabel="arrivals (req/s)")
    top.legend(fontsize=8, loc="upper right")
    top.grid(alpha=0.3)
    spans = _segments(run.timeline, end)
    others = sorted({g["tier"] for _, _, g in spans} - set(names))
    for i, n in enumerate(others):  # groups not bound to one tier (e.g. "*": shared by all)
        color[n] = str(0.75 - 0.15 * (i % 3))
    for t0, t1, g in spans:
        rect = Rectangle((t0, g["first_gpu"]), t1 - t0, g["tp"], facecolor=color[g["tier"]],
                         edgecolor="black", linewidth=0.4, hatch=ROLE_HATCH.get(g["role"], "xx"), alpha=0.85)
        ax.add_patch(rect)
        if (t1 - t0) > end / 25:
            ax.text((t0 + t1) / 2, g["first_gpu"] + g["tp"] / 2, f"TP{g['tp']}", ha="center", va="center", fontsize=7)
    ax.set(xlim=(0, end), ylim=(gpus, 0), xlabel="simulated time (s)", ylabel="GPU")
    step = max(1, gpus // 16)
    ax.set_yticks([g + 0.5 for g in range(0, gpus, step)], [str(g) for g in range(0, gpus, step)])
    legend = [Patch(facecolor=color[n], label=n) for n in names]
    legend += [Patch(facecolor=color[n], label="any tier" if n == "*" else n) for n in others]
    legend += [Patch(facecolor="white", edgecolor="black", hatch=h, label=r) for r, h in ROLE_HATCH.items()]
    ax.legend(handles=legend, fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.suptitle(f"{title}\n{run.policy} ({label(run.settings)}): {run.switches} switches, "
                 f"{run.migrated_requests} migrated requests", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def plot_cdfs(path: Path, result: LoadResult, slos: list[TierSlo], title: str) -> None:
    """TTFT and TPOT CDFs per tier (rows), one line per policy, SLO dashed."""
    tiers = [(i, s) for i, s in enumerate(slos) if (result.load.trace.tier == i).any()]
    policies = list(result.policies)
    style = _policy_style(policies)
    fig, axes = plt.subplots(len(tiers), 2, figsize=(12, 3.6 * len(tiers)), squeeze=False)
    for row, (i, slo) in enumerate(tiers):
        mine = result.load.trace.tier == i
        multi = mine & (result.load.trace.output_tokens > 1)
        for col, (metric, mask, bound) in enumerate((("ttft_ms", mine, slo.ttft_ms), ("tpot_ms", multi, slo.tpot_ms))):
            ax = axes[row][col]
            for p in policies:
                run = result.policies[p].best
                values = np.sort(getattr(run, metric)[mask])
                n = int(mask.sum())
                finite = values[np.isfinite(values)]
                if finite.size:
                    # rejected requests never reach the top: the CDF is over all requests
                    ax.step(finite, np.arange(1, finite.size + 1) / n, where="post", label=p,
                            color=style[p]["color"], linestyle=style[p]["linestyle"])
            if bound is not None:
                ax.axvline(bound, color="black", linestyle=":", linewidth=1, label="SLO")
            ax.set(xscale="log", ylim=(0, 1.01), xlabel=f"{metric[:4].upper()} (ms)", ylabel="fraction of requests",
                   title=f"{slo.name}: {metric[:4].upper()}")
            ax.xaxis.set_minor_formatter(NullFormatter())
            ax.grid(alpha=0.3)
    axes[0][1].legend(fontsize=7, loc="lower right")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)

"""`tiertp replay` end to end: workload -> load levels -> sweep -> report
files and plots. The CLI (tiertp.commands.replay) only parses arguments into
a ReplayConfig."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tiertp._scheduler import DEFAULT_GPUS_PER_NODE, DEFAULT_WINDOW_S
from tiertp.replay import plots
from tiertp.replay.metrics import TierSlo
from tiertp.replay.policies import KNOB_VALUES, SWEPT, parse_policies, sim_policies
from tiertp.replay.report import goodput_table, write_csv, write_json
from tiertp.replay.sim_run import SimContext
from tiertp.replay.sweep import LoadResult, plan_runs, run_sweep
from tiertp.replay.workload import TierRule, build_workload, cut_load

GOODPUT_DEFINITION = (
    "requests completed within both the TTFT and TPOT SLO of their tier (background tiers: completed), "
    "per second of the offered-load window; rejected requests count as missed"
)
# The policy whose configuration timeline is plotted (when replayed).
TIMELINE_POLICY = "tiertp"


@dataclass
class ReplayConfig:
    """Everything one `tiertp replay` does. `rps` None replays the trace at
    its recorded rate; `duration_s` None replays all of it; `plot_rps` picks
    the load of the timeline and CDF plots (None: the middle load)."""

    traces: list[str]
    tiers_path: Path
    profile: object
    gpus: int
    out: Path
    tier_rule: TierRule = field(default_factory=TierRule)
    policies: str = "all"
    rps: list[float] | None = None
    duration_s: float | None = None
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE
    window_s: float = DEFAULT_WINDOW_S
    switch_ms: float | None = None
    kv_gbps: float | None = None
    seed: int = 0
    plot_rps: float | None = None
    plots: bool = True
    progress: bool = True


@dataclass
class ReplayReport:
    """What a replay produced: the per-load results and the files written."""

    results: list[LoadResult]
    files: list[Path]
    table: str


def _tqdm_progress(total: int, enabled: bool):
    from tqdm import tqdm

    bar = tqdm(total=total, unit="run", disable=not enabled, dynamic_ncols=True,
               bar_format="{desc} {percentage:3.0f}%|{bar}| {n:.1f}/{total} runs [{elapsed}<{remaining}]")

    shown = [""]

    def on_progress(done: float, desc: str) -> None:
        if desc != shown[0]:
            shown[0] = desc
            bar.set_description_str(desc, refresh=False)
        bar.update(done - bar.n)

    return bar, on_progress


def replay(cfg: ReplayConfig, simulate: Callable[..., dict] | None = None,
           valid_policies: list[str] | None = None) -> ReplayReport:
    """Run the sweep `cfg` describes and write report.json, report.csv,
    goodput.txt (the printed table) and the PNG plots into cfg.out.
    `simulate` defaults to the Rust simulator (tiertp._scheduler.simulate)
    and `valid_policies` to its SIM_POLICIES."""
    from tiertp import _scheduler

    if simulate is None:
        valid_policies = sim_policies()
        simulate = _scheduler.simulate
    policies = parse_policies(cfg.policies, valid_policies or list(SWEPT))
    if cfg.gpus < 1:
        raise ValueError(f"--gpus must be >= 1, got {cfg.gpus}")
    tiers = _scheduler.TierSet.load(str(cfg.tiers_path))
    workload = build_workload(cfg.traces, cfg.tier_rule, list(tiers.names), seed=cfg.seed)
    loads = [cut_load(workload, r, cfg.duration_s) for r in (cfg.rps or [None])]
    ctx = SimContext(simulate, cfg.profile, tiers, cfg.gpus, cfg.gpus_per_node, cfg.window_s,
                     cfg.switch_ms, cfg.kv_gbps, cfg.seed)
    bar, on_progress = _tqdm_progress(len(loads) * len(plan_runs(policies, ctx)), cfg.progress)
    try:
        results = run_sweep(ctx, loads, policies, on_progress)
    finally:
        bar.close()

    cfg.out.mkdir(parents=True, exist_ok=True)
    slos = TierSlo.from_tierset(tiers)
    config = {
        "command": "tiertp replay",
        "traces": cfg.traces,
        "tier_rule": {"tier_map": cfg.tier_rule.tier_map, "fractions": cfg.tier_rule.fractions},
        "tiers_file": str(cfg.tiers_path),
        "tiers": [{k: v for k, v in t.items() if k != "api_keys"} for t in tiers.to_list()],
        "profile": cfg.profile.name,
        "gpus": cfg.gpus, "gpus_per_node": cfg.gpus_per_node,
        "window_s": cfg.window_s, "switch_ms": cfg.switch_ms, "kv_gbps": cfg.kv_gbps, "seed": cfg.seed,
        "duration_s": cfg.duration_s, "rps": cfg.rps, "policies": policies,
        "settings_grid": {"swept": {p: list(k) for p, k in SWEPT.items() if p in policies},
                          "values": {k: list(v) for k, v in KNOB_VALUES.items()},
                          "choice": "per load, the variant with the highest goodput (hindsight)"},
        "goodput": GOODPUT_DEFINITION,
        "workload": workload.summary(),
    }
    files = [cfg.out / "report.json", cfg.out / "report.csv", cfg.out / "goodput.txt"]
    write_json(files[0], config, results)
    write_csv(files[1], results)
    table = goodput_table(results)
    files[2].write_text(table + "\n")
    if cfg.plots:
        files += write_plots(cfg, results, slos, workload.source)
    return ReplayReport(results, files, table)


def pick_plot_load(results: list[LoadResult], plot_rps: float | None) -> LoadResult:
    if plot_rps is None:
        return results[len(results) // 2]
    for r in results:
        if r.load.rps is not None and abs(r.load.rps - plot_rps) < 1e-9:
            return r
    raise ValueError(f"--plot-rps {plot_rps:g} is not one of the replayed loads {[r.load.rps for r in results]}")


def write_plots(cfg: ReplayConfig, results: list[LoadResult], slos: list[TierSlo], source: str) -> list[Path]:
    """goodput.png, timeline-<policy>-<rps>rps.png, cdf-<rps>rps.png."""
    head = f"{source} on {cfg.gpus} GPUs, {cfg.profile.name}"
    files = [cfg.out / "goodput.png"]
    plots.plot_goodput(files[0], results, head)
    chosen = pick_plot_load(results, cfg.plot_rps)
    tag = f"{chosen.load.offered_rps:.1f}rps"
    at = f"{head}, {chosen.load.offered_rps:.1f} req/s offered"
    policy = TIMELINE_POLICY if TIMELINE_POLICY in chosen.policies else next(iter(chosen.policies))
    files.append(cfg.out / f"timeline-{policy}-{tag}.png")
    plots.plot_timeline(files[-1], chosen.policies[policy].best, chosen.load.trace.arrival_s,
                        chosen.load.trace.tier, slos, cfg.gpus, at)
    files.append(cfg.out / f"cdf-{tag}.png")
    plots.plot_cdfs(files[-1], chosen, slos, at)
    return files

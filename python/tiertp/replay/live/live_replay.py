"""`tiertp replay --live URL` end to end: the workload and load levels of
the simulated replay (same readers, tier rule, scaling and window), length
caps, one live run per load, and the simulated replay's report files
(report.json, report.csv, PNGs) plus requests-<rps>rps.csv per load."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from tiertp.replay.simulated_replay import GOODPUT_DEFINITION, ReplayConfig, ReplayReport, write_plots
from tiertp.replay.live.caps import LengthCaps
from tiertp.replay.live.limits import Limits
from tiertp.replay.live.outcome import LIVE, LiveOutcome, live_outcome, write_requests_csv
from tiertp.replay.live.prompts import PromptMaker, resolve_tokenizer_dir
from tiertp.replay.live.run import replay_load
from tiertp.replay.live.server import ServerInfo, discover, tier_api_keys
from tiertp.replay.metrics import TierSlo
from tiertp.replay.report import goodput_table, write_csv, write_json
from tiertp.replay.sweep import LoadResult, PolicyAtLoad
from tiertp.replay.workload import Load, TierRule, build_workload, cut_load

log = logging.getLogger(__name__)

LIVE_GOODPUT_NOTE = ("live: measured at the client (TTFT from sending to the first streamed token, TPOT = "
                     "(last - first token) / (tokens - 1)); failed requests count as missed")


@dataclass
class LiveReplayConfig:
    """Everything one `tiertp replay --live` does (see ReplayConfig for the
    workload fields, which mean the same here)."""

    url: str
    traces: list[str]
    tiers_path: Path
    out: Path
    tier_rule: TierRule = field(default_factory=TierRule)
    rps: list[float] | None = None
    duration_s: float | None = None
    seed: int = 0
    caps: LengthCaps = field(default_factory=LengthCaps)
    limits: Limits = field(default_factory=Limits)
    tokenizer: str | None = None  # default: the served model's name (an embedded model)
    served_model: str | None = None
    api_keys: dict[str, str] | None = None
    plot_rps: float | None = None
    plots: bool = True
    progress: bool = True


def capped_loads(cfg, tier_names: list[str]) -> tuple[object, list[tuple[Load, dict]]]:
    """The workload and, per load level, the capped Load with its caps'
    description: exactly what the live run sends and the simulator replays."""
    workload = build_workload(cfg.traces, cfg.tier_rule, tier_names, seed=cfg.seed)
    out = []
    for r in cfg.rps or [None]:
        load = cut_load(workload, r, cfg.duration_s)
        out.append((Load(load.rps, cfg.caps.apply(load.trace), load.window_s), cfg.caps.describe(load.trace)))
    return workload, out


class LiveSession:
    """A server to replay against: its info, the tier keys and the prompt maker."""

    def __init__(self, url: str, tiers_path: Path, tier_names: list[str], tokenizer: str | None = None,
                 served_model: str | None = None, api_keys: dict[str, str] | None = None, seed: int = 0):
        self.info: ServerInfo = discover(url, served_model)
        self.keys = tier_api_keys(tiers_path, tier_names, api_keys)
        self.tier_names = tier_names
        self.prompts = PromptMaker.from_tokenizer_dir(resolve_tokenizer_dir(tokenizer or self.info.model), seed)

    def run(self, load: Load, slos: list[TierSlo], limits: Limits, extra: dict | None = None,
            progress: bool = True) -> LiveOutcome:
        from tqdm import tqdm

        # The client measures the server on a possibly shared host: the load
        # average around the run says whether other work competed with it.
        before = os.getloadavg()[0]
        with tqdm(total=len(load.trace), unit="req", disable=not progress, dynamic_ncols=True,
                  desc=f"live {load.offered_rps:.2f} rps") as bar:
            run = replay_load(self.info, load, self.tier_names, self.keys, self.prompts, limits,
                              on_done=lambda n: bar.update(n - bar.n))
        host = {"host_load_avg_1m": {"before": before, "after": os.getloadavg()[0]}, "host_cpus": os.cpu_count()}
        return live_outcome(run, load, slos, {**host, **(extra or {})})


def live_replay(cfg: LiveReplayConfig) -> ReplayReport:
    """Replay every load of `cfg` against the server and write the report.
    Stops after a load that was interrupted (Ctrl-C); its report is still
    written (`live.interrupted` true)."""
    from tiertp import _scheduler

    tiers = _scheduler.TierSet.load(str(cfg.tiers_path))
    slos = TierSlo.from_tierset(tiers)
    session = LiveSession(cfg.url, cfg.tiers_path, list(tiers.names), cfg.tokenizer, cfg.served_model,
                          cfg.api_keys, cfg.seed)
    workload, loads = capped_loads(cfg, list(tiers.names))
    cfg.out.mkdir(parents=True, exist_ok=True)
    results: list[LoadResult] = []
    files: list[Path] = []
    for load, caps in loads:
        outcome = session.run(load, slos, cfg.limits, {"length_caps": caps}, cfg.progress)
        results.append(LoadResult(load, {LIVE: PolicyAtLoad(outcome, {"default": outcome.metrics.goodput_rps})}))
        files.append(cfg.out / f"requests-{load.offered_rps:.1f}rps.csv")
        write_requests_csv(files[-1], outcome.records)
        if outcome.live["interrupted"]:
            log.warning("interrupted: the loads after %.2f req/s are not replayed", load.offered_rps)
            break
    config = live_config(cfg, session.info, tiers, workload)
    files = [cfg.out / "report.json", cfg.out / "report.csv", *files]
    write_json(files[0], config, results)
    write_csv(files[1], results)
    if cfg.plots:
        files += write_live_plots(cfg, session.info, results, slos, workload.source)
    return ReplayReport(results, files, goodput_table(results))


def live_config(cfg, info: ServerInfo, tiers, workload) -> dict:
    """The report's configuration block for a live replay."""
    return {
        "command": "tiertp replay --live",
        "url": info.base,
        "model": info.model,
        "traces": cfg.traces,
        "tier_rule": {"tier_map": cfg.tier_rule.tier_map, "fractions": cfg.tier_rule.fractions},
        "tiers_file": str(cfg.tiers_path),
        "tiers": [{k: v for k, v in t.items() if k != "api_keys"} for t in tiers.to_list()],
        "gpus": info.gpus,
        "duration_s": cfg.duration_s, "rps": cfg.rps, "seed": cfg.seed, "policies": [LIVE],
        "length_caps": {"max_prompt_tokens": cfg.caps.max_prompt_tokens,
                        "max_output_tokens": cfg.caps.max_output_tokens},
        "client_limits_s": vars(cfg.limits),
        "goodput": f"{GOODPUT_DEFINITION}; {LIVE_GOODPUT_NOTE}",
        "workload": workload.summary(),
    }


def write_live_plots(cfg, info: ServerInfo, results: list[LoadResult], slos: list[TierSlo], source: str,
                     head: str | None = None) -> list[Path]:
    """The simulated replay's plots (tiertp.replay.simulated_replay.write_plots) for
    live results; `head` names what was served (default: model and URL)."""
    plot_cfg = ReplayConfig(traces=cfg.traces, tiers_path=cfg.tiers_path,
                            profile=SimpleNamespace(name=head or f"live {info.model} at {info.base}"),
                            gpus=info.gpus or 1, out=cfg.out, plot_rps=cfg.plot_rps)
    return write_plots(plot_cfg, results, slos, source)

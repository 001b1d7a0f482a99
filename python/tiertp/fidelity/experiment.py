"""`tiertp fidelity` end to end: profile the engine, simulate the trace with
that profile on the live cluster's shape, replay the same trace live, and
compare.

What keeps the comparison apples to apples:
- the same requests: one Load per level (same traces, tier rule, seed, rate
  scaling, window and length caps; tiertp.replay.live.live_replay.capped_loads)
  goes to the simulator and to the live client;
- the same SLOs: one tier file, given to `tiertp serve` and the simulator;
- the same cluster: GPUs = the server's devices, all on one node (one agent);
  TP levels = the ones the server is started with (--tp-levels: profiled,
  served, and the simulator's profile cut to exactly them, sim_profile.py);
  KV slots per device = the live worker's; the control window = the gateway's;
- the same engine: the profile is measured by `tiertp profile` on this
  machine before the server starts (or given with --profile), then
  calibrated by the probes to the engine as served (calibration.py); a
  started server is restarted to plan with the calibrated profile.
What still differs is reported with the numbers (docs/fidelity.md).
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from tiertp._scheduler import DEFAULT_WINDOW_S
from tiertp.fidelity.calibration import (CALIBRATED, CALIBRATION_RULE, calibration_scale, fit_decode_overhead,
                                         loaded_probe_table, ttft_offset_ms)
from tiertp.fidelity import provenance
from tiertp.fidelity.compare import compare, table
from tiertp.fidelity.defaults import PROBE_CONCURRENCY, TIERS_CPU_TWO_TIER
from tiertp.fidelity.moves import agent_moves, moves_delta, moves_text, summarize
from tiertp.fidelity.probe import loaded_probe, probe, probe_table, tier_prompt_medians
from tiertp.fidelity.serve_process import ServeProcess
from tiertp.fidelity.sim_profile import CellScale, check_profile_levels, sim_profile_doc, write_sim_profile
from tiertp.ports import free_port
from tiertp.replay.live.caps import LengthCaps
from tiertp.replay.live.limits import Limits
from tiertp.replay.live.live_replay import LIVE_GOODPUT_NOTE, LiveSession, capped_loads
from tiertp.replay.live.outcome import LIVE, write_requests_csv
from tiertp.replay.live.records import COMPLETED
from tiertp.replay.metrics import TierSlo
from tiertp.replay.policies import label
from tiertp.replay.report import _clean, write_csv, write_json
from tiertp.replay.sim_run import SimContext, run_once
from tiertp.replay.simulated_replay import GOODPUT_DEFINITION, write_plots
from tiertp.replay.simulated_replay import ReplayConfig as _PlotConfig
from tiertp.replay.sweep import LoadResult, PolicyAtLoad
from tiertp.replay.workload import TierRule
from tiertp.worker.config import AgentConfig
from tiertp.worker.seal import ControlKey

log = logging.getLogger(__name__)



@dataclass
class FidelityConfig:
    traces: list[str]
    rps: list[float]
    duration_s: float
    out: Path
    tiers_path: Path = TIERS_CPU_TWO_TIER
    tier_rule: TierRule = field(default_factory=TierRule)
    seed: int = 0
    caps: LengthCaps = field(default_factory=LengthCaps)
    limits: Limits = field(default_factory=Limits)
    model: str = "smollm2-135m"
    devices: int = 2
    tp_levels: tuple[int, ...] | None = None  # profiled, served and simulated; None: the worker's default (TP 1)
    profile: Path | None = None  # None: measure it with `tiertp profile`
    profile_quick: bool = False
    url: str | None = None  # None: start `tiertp serve`
    serve_cpus: list[int] | None = None  # cores the started server may use (None: all)
    tokenizer: str | None = None  # prompts' tokenizer; default: `model` (started server) or the served name
    sim_policies: list[str] = field(default_factory=lambda: ["tiertp"])
    # The control window both sides plan with: a started server is given it
    # (`tiertp serve --window`); the default is the gateway's, which a server
    # given with --url runs unless it was started otherwise.
    window_s: float = DEFAULT_WINDOW_S
    iteration_overhead_ms: float = 0.0
    cooldown_s: float = 5.0
    probe_per_tier: int = 2  # unloaded probe requests per tier (0: none)
    # The loaded probe's wave sizes (empty: none), each sent probe_repeats times.
    probe_concurrency: tuple[int, ...] = PROBE_CONCURRENCY
    probe_repeats: int = 2
    # Calibrate the profile by the probes (calibration.py): the calibrated
    # prediction, and a started server restarted to plan with it.
    calibrate: bool = True
    plots: bool = True
    progress: bool = True
    command_line: list[str] = field(default_factory=list)

    def levels(self) -> list[int]:
        """The TP levels of this run, sorted."""
        return sorted(set(self.tp_levels or AgentConfig().tp_levels))


@dataclass
class FidelityReport:
    doc: dict
    text: str
    files: list[Path]


def profile_command(model: str, out: Path, quick: bool, progress: bool, tp_levels: list[int]) -> list[str]:
    """The `tiertp profile` command line that measures `tp_levels`."""
    levels = ",".join(str(t) for t in tp_levels)
    cmd = [sys.executable, "-m", "tiertp.cli", "profile", "--model", model, "--tp", levels, "--out", str(out)]
    cmd += ["--quick"] if quick else []
    cmd += [] if progress else ["--no-progress"]
    return cmd


def measure_profile(model: str, out: Path, quick: bool, progress: bool, tp_levels: list[int]) -> Path:
    """Run `tiertp profile` for the TP levels the live workers serve."""
    cmd = profile_command(model, out, quick, progress, tp_levels)
    log.info("profiling the engine: %s", " ".join(cmd))
    subprocess.run(cmd, check=True)
    return out


def run_fidelity(cfg: FidelityConfig) -> FidelityReport:
    """Profile (unless given), serve (unless --url), probe, then simulate and
    replay every load; write fidelity.json and the replay report. A server
    that dies ends the run early: what was measured is still written, with
    `aborted` saying why."""
    from tiertp import _scheduler

    cfg.out.mkdir(parents=True, exist_ok=True)
    tiers = _scheduler.TierSet.load(str(cfg.tiers_path))
    slos = TierSlo.from_tierset(tiers)
    workload, loads = capped_loads(cfg, list(tiers.names))
    unknown = [p for p in cfg.sim_policies if p not in _scheduler.SIM_POLICIES]
    if unknown or not cfg.sim_policies:
        raise ValueError(f"unknown simulator policy {unknown}; valid: {', '.join(_scheduler.SIM_POLICIES)}")
    levels = cfg.levels()
    if cfg.url is None:
        AgentConfig(devices=cfg.devices, tp_levels=tuple(levels))  # ValueError names a bad level
    if cfg.profile is not None:
        check_profile_levels(cfg.profile, levels)
    measured_profile = cfg.profile or measure_profile(cfg.model, cfg.out / "profile-measured.json",
                                                      cfg.profile_quick, cfg.progress, levels)
    agent = AgentConfig()
    sim_profile_path = cfg.out / "profile-sim.json"
    profile = write_sim_profile(measured_profile, sim_profile_path, agent.max_total_tokens,
                                levels, cfg.iteration_overhead_ms)
    serve = None
    run = _Run()
    try:
        if cfg.url is None:
            serve = _start_serve(cfg, levels, sim_profile_path, "serve-logs")
        session = _connect(cfg, run, serve, list(tiers.names))
        gpus = session.info.gpus or cfg.devices
        if max(levels) > gpus:
            raise ValueError(f"--tp-levels {','.join(map(str, levels))}: the server has {gpus} device(s)")
        ctx = SimContext(_scheduler.simulate, profile, tiers, gpus, gpus_per_node=gpus, window_s=cfg.window_s,
                         seed=cfg.seed)
        if cfg.probe_per_tier:
            first = loads[0][0].trace
            p, o = int(np.median(first.prompt_tokens)), int(np.median(first.output_tokens))
            run.unloaded = probe(session, ctx, cfg.sim_policies[0], tier_prompt_medians(first), o,
                                 cfg.probe_per_tier, cfg.limits)
            run.say(probe_table(run.unloaded))
            scale = calibration_scale(run.unloaded) if cfg.calibrate else None
            if scale is not None:
                extra_ms = _fit_overhead(cfg, run, session, ctx, measured_profile, levels, agent.max_total_tokens,
                                         scale, p, o)
                calibrated_path = cfg.out / "profile-sim-calibrated.json"
                offset_ms = ttft_offset_ms(run.unloaded)
                run.calibration = {"scale": asdict(scale), "ttft_offset_ms": offset_ms,
                                   "decode_ms_per_extra_request": extra_ms,
                                   "rule": CALIBRATION_RULE, "profile": str(calibrated_path),
                                   "server_plans_with": "measured profile"}
                calibrated = write_sim_profile(measured_profile, calibrated_path, agent.max_total_tokens, levels,
                                               cfg.iteration_overhead_ms, scale, extra_ms)
                run.calibrated_ctx = replace(ctx, profile=calibrated, ttft_offset_ms=offset_ms)
                run.say(f"calibrated profile: prefill cells x{scale.prefill:.2f}, decode cells x{scale.decode:.2f}, "
                        f"each TTFT +{offset_ms:.0f} ms, a decode step +{extra_ms:.2f} ms per "
                        f"running request beyond the first ({CALIBRATION_RULE})")
                if serve is not None:
                    # The gateway plans with the profile: restarted on the
                    # calibrated one, both sides plan with the same numbers.
                    serve.stop()
                    serve = _start_serve(cfg, levels, calibrated_path, "serve-logs-calibrated")
                    session = _connect(cfg, run, serve, list(tiers.names))
                    run.calibration["server_plans_with"] = "calibrated profile (restarted)"
                    run.say("tiertp serve restarted to plan with the calibrated profile")
        for i, (load, caps) in enumerate(loads):
            if i and cfg.cooldown_s:
                time.sleep(cfg.cooldown_s)  # the gateway's arrival memory of the last load fades a little
            _one_load(cfg, run, ctx, session, load, caps, slos)
            if serve is not None and not serve.alive():
                run.aborted = f"tiertp serve exited (code {serve.popen.returncode}); see {serve.output_path}"
                log.error("%s; the remaining loads are not replayed", run.aborted)
            if run.aborted or run.per_load[-1]["live"]["interrupted"]:
                break
    finally:
        if serve is not None:
            serve.stop()

    config = _config_doc(cfg, session, gpus, agent, levels, measured_profile, tiers, workload)
    config["policies"] = list(run.results[0].policies) if run.results else config["policies"]
    doc = _clean({**config, "aborted": run.aborted, "unloaded_probe": run.unloaded, "loaded_probe": run.loaded,
                  "calibration": run.calibration,
                  "loads": run.per_load})
    files = [cfg.out / "fidelity.json", cfg.out / "report.json", cfg.out / "report.csv", *run.files]
    files[0].write_text(json.dumps(doc, indent=1, allow_nan=False) + "\n")
    write_json(files[1], config, run.results)
    write_csv(files[2], run.results)
    if cfg.plots and run.results:
        plot_cfg = _PlotConfig(traces=cfg.traces, tiers_path=cfg.tiers_path, profile=profile, gpus=gpus, out=cfg.out)
        files += write_plots(plot_cfg, run.results, slos, workload.source)
    return FidelityReport(doc, "\n\n".join(run.texts), files)


def _start_serve(cfg: FidelityConfig, levels: list[int], profile: Path, logs: str) -> ServeProcess:
    return ServeProcess(cfg.model, cfg.devices, cfg.tiers_path, cfg.out / logs, cpus=cfg.serve_cpus, profile=profile,
                        window_s=cfg.window_s, tp_levels=levels, worker_port=free_port())


def _connect(cfg: FidelityConfig, run: _Run, serve: ServeProcess | None, tier_names: list[str]) -> LiveSession:
    """The session against the started server (once it is up; its agent is
    then asked for its moves) or against --url."""
    run.agent = (serve.agent_endpoint, serve.agent_key) if serve is not None and serve.agent_endpoint else None
    return LiveSession(serve.wait_url() if serve else cfg.url, cfg.tiers_path, tier_names, seed=cfg.seed,
                       tokenizer=cfg.tokenizer or (cfg.model if serve else None))


def _fit_overhead(cfg: FidelityConfig, run: _Run, session: LiveSession, ctx: SimContext, measured_profile: Path,
                  levels: list[int], kv_capacity_tokens: int, scale: CellScale, prompt_tokens: int,
                  output_tokens: int) -> float:
    """The loaded probe and the decode step's cost per extra request it
    implies (calibration.py); 0 without the probe or a completed wave."""
    if not cfg.probe_concurrency or not cfg.probe_repeats:
        return 0.0
    from tiertp import _scheduler

    loaded = loaded_probe(session, prompt_tokens, output_tokens, list(cfg.probe_concurrency), cfg.probe_repeats,
                          cfg.limits)
    base = json.loads(Path(measured_profile).read_text())

    def ctx_with(extra_ms: float) -> SimContext:
        # The server planned the probe with `ctx.profile`; only the engine's
        # times are the candidate's.
        doc = sim_profile_doc(base, kv_capacity_tokens, levels, cfg.iteration_overhead_ms, scale, extra_ms)
        return replace(ctx, engine_profile=_scheduler.Profile.from_json(json.dumps(doc), "calibration candidate"))

    step_ms = ctx_with(0.0).engine_profile.decode_ms(min(levels), 1.0, prompt_tokens + output_tokens / 2)
    fit = fit_decode_overhead(loaded, list(session.tier_names), ctx_with, cfg.sim_policies[0], step_ms)
    failed = sum(1 for r in loaded.records if r.status != COMPLETED)
    run.loaded = {"prompt_tokens": prompt_tokens, "output_tokens": output_tokens,
                  "concurrency": list(cfg.probe_concurrency), "repeats": cfg.probe_repeats, "failed": failed,
                  **(fit.to_doc() if fit else {"decode_ms_per_extra_request": None})}
    if fit is None:
        run.say(f"loaded probe: no request completed ({failed} failed); no per-request decode cost fitted")
        return 0.0
    run.say(loaded_probe_table(fit) + (f"; {failed} request(s) failed" if failed else ""))
    return fit.decode_ms_per_extra_request


@dataclass
class _Run:
    """What a fidelity run has gathered so far."""

    results: list[LoadResult] = field(default_factory=list)
    per_load: list[dict] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)
    unloaded: dict | None = None
    loaded: dict | None = None
    calibration: dict | None = None
    calibrated_ctx: SimContext | None = None
    aborted: str | None = None
    agent: tuple[str, ControlKey] | None = None  # the started server's agent and its key (asked for its moves)

    def say(self, text: str) -> None:
        self.texts.append(text)
        print(text, flush=True)


def _one_load(cfg: FidelityConfig, run: _Run, ctx: SimContext, session: LiveSession, load, caps: dict,
              slos: list[TierSlo]) -> None:
    """Simulate, then replay live, one load; compare and record."""
    sims = {p: run_once(ctx, load, p, {}) for p in cfg.sim_policies}
    if run.calibrated_ctx is not None:
        primary = cfg.sim_policies[0]
        sims[primary + CALIBRATED] = run_once(run.calibrated_ctx, load, primary, {})
    before = agent_moves(*run.agent) if run.agent else None
    live = session.run(load, slos, cfg.limits, {"length_caps": caps}, cfg.progress)
    agent = moves_delta(before, agent_moves(*run.agent)) if run.agent else None
    moves = summarize(sims, live.timeline, agent, load.window_s)
    run.files.append(cfg.out / f"requests-{load.offered_rps:.1f}rps.csv")
    write_requests_csv(run.files[-1], live.records)
    policies = {p: PolicyAtLoad(o, {label(o.settings): o.metrics.goodput_rps}) for p, o in sims.items()}
    policies[LIVE] = PolicyAtLoad(live, {"default": live.metrics.goodput_rps})
    run.results.append(LoadResult(load, policies))
    comparisons = {p: compare(o.metrics, live.metrics) for p, o in sims.items()}
    run.per_load.append({"rps": load.rps, "offered_rps": load.offered_rps, "window_s": load.window_s,
                         "requests": len(load.trace), "length_caps": caps, "comparison": comparisons,
                         "live": live.live, "moves": moves})
    head = (f"{load.offered_rps:.2f} req/s offered, {len(load.trace)} requests over {load.window_s:g} s: "
            f"{live.live['completed']} completed, {live.live['failed']} failed live{_host_load(live.live)}")
    for p in sims:
        run.say(f"{head}\nsimulated {p} vs measured (predicted/measured (relative error)):\n{table(comparisons[p])}")
    run.say(moves_text(moves, cfg.sim_policies[0]))


def _host_load(live: dict) -> str:
    """The host's load around the live run: the measured side includes whatever
    else ran on these cores (the server and client alone account for about 2)."""
    host = live.get("host_load_avg_1m")
    if not host:
        return ""
    return f" (host load {host['before']:.1f} -> {host['after']:.1f} on {live.get('host_cpus')} cores)"


def _config_doc(cfg: FidelityConfig, session: LiveSession, gpus: int, agent: AgentConfig, levels: list[int],
                measured_profile: Path, tiers, workload) -> dict:
    """The configuration block of fidelity.json and report.json."""
    return {
        "command": "tiertp fidelity",
        "command_line": cfg.command_line,
        "provenance": provenance.describe(),
        "url": session.info.base, "model": session.info.model, "devices": gpus,
        "served_by": "tiertp serve started by this run" if cfg.url is None else "a running server (--url)",
        "serve_cpus": cfg.serve_cpus,
        "tp_levels": levels,
        "traces": cfg.traces,
        "tier_rule": {"tier_map": cfg.tier_rule.tier_map, "fractions": cfg.tier_rule.fractions},
        "tiers_file": str(cfg.tiers_path),
        "tiers": [{k: v for k, v in t.items() if k != "api_keys"} for t in tiers.to_list()],
        "duration_s": cfg.duration_s, "rps": cfg.rps, "seed": cfg.seed,
        "length_caps": {"max_prompt_tokens": cfg.caps.max_prompt_tokens,
                        "max_output_tokens": cfg.caps.max_output_tokens},
        "client_limits_s": vars(cfg.limits),
        "profile_measured": str(measured_profile),
        "profile_sim": str(cfg.out / "profile-sim.json"),
        "simulator": {"policies": cfg.sim_policies, "gpus": gpus, "gpus_per_node": gpus, "window_s": cfg.window_s,
                      "kv_capacity_tokens_per_device": agent.max_total_tokens, "tp_levels": levels,
                      "iteration_overhead_ms": cfg.iteration_overhead_ms},
        "policies": [*cfg.sim_policies, LIVE],
        "goodput": f"{GOODPUT_DEFINITION}; {LIVE_GOODPUT_NOTE}",
        "relative_error": "(predicted - measured) / measured",
        "workload": workload.summary(),
    }

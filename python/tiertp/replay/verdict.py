"""The acceptance checks of finished replay reports, load by load: what
bench/README.md judges tiertp by, on the paper's presets and on the
robustness grid alike (`tiertp replay --verdict DIR ...`; runs nothing).

At each load of a report:
- tiertp serves every tier (`fair`, the fairness rule of the metrics) and
  reaches RATIO_MIN x the best other policy that also does: the baselines
  and ablations at their best settings, the oracle left out (it is the
  ceiling, not a competitor);
- tiertp's goodput is at least FALL_MIN x its best at a lower load;
- the oracle is at or above every policy that serves every tier;
- at the lowest load, every baseline is within LOWEST_LOAD_MIN x the best
  policy serving every tier (a baseline that fails there is mis-configured,
  not beaten).
A load where no other policy serves every tier asks tiertp only to serve
every tier or to be best.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tiertp.replay.policies import label
from tiertp.replay.report import UNFAIR
from tiertp.replay.report_files import find_reports, load_report, text_table
from tiertp.replay.sweep import ORACLE

OURS = "tiertp"
RATIO_MIN = 0.97
FALL_MIN = 0.95
LOWEST_LOAD_MIN = 0.8
# The ablations are tiertp's own policies with a part taken out
# (tiertp-static-tp, ...); every other policy but the oracle is a baseline.
ABLATION_PREFIX = OURS + "-"
# Slack for goodputs equal up to float rounding.
EPS = 1e-9
# The settings label of a policy run at its own settings.
DEFAULT_LABEL = label({})


def is_baseline(policy: str) -> bool:
    return policy not in (OURS, ORACLE) and not policy.startswith(ABLATION_PREFIX)


def _named(policy: str, entry: dict) -> str:
    won = entry.get("settings_label", DEFAULT_LABEL)
    return policy if won == DEFAULT_LABEL else f"{policy} ({won})"


@dataclass(frozen=True)
class LoadVerdict:
    """One load of one report, judged."""

    rps: float
    ours: float
    ours_fair: bool
    # The best other policy that serves every tier, and its goodput; None
    # where no other policy does.
    rival: str | None
    rival_rps: float
    # tiertp's best at a lower load (0 at the lowest).
    best_below: float
    # The ceiling's goodput; None where the report has no oracle run.
    oracle_rps: float | None = None
    # Policies serving every tier above the oracle.
    above_oracle: list[str] = field(default_factory=list)
    # At the lowest load: baselines below LOWEST_LOAD_MIN x the best policy.
    weak_baselines: list[str] = field(default_factory=list)

    @property
    def ratio(self) -> float | None:
        return self.ours / self.rival_rps if self.rival and self.rival_rps > 0 else None

    @property
    def misses(self) -> list[str]:
        """Each check of tiertp this load fails, in words."""
        out = []
        if not self.ours_fair and self.rival:
            out.append("tiertp leaves a tier unserved")
        if self.ratio is not None and self.ratio < RATIO_MIN - EPS:
            out.append(f"{self.ratio:.3f}x {self.rival}")
        if self.ours < FALL_MIN * self.best_below - EPS:
            out.append(f"falls to {self.ours / self.best_below:.3f}x its best at a lower load")
        return out

    @property
    def other_misses(self) -> list[str]:
        """Each check of the oracle and the baselines this load fails."""
        out = []
        if self.above_oracle:
            out.append(f"above the oracle: {', '.join(self.above_oracle)}")
        if self.weak_baselines:
            out.append(f"baselines under {LOWEST_LOAD_MIN}x the best: {', '.join(self.weak_baselines)}")
        return out


def judge(report: dict) -> list[LoadVerdict]:
    """Every load of a `tiertp replay` report.json (as a dict), in load order."""
    verdicts, best_below = [], 0.0
    loads = sorted(report["loads"], key=lambda load: load["rps"])
    for i, load in enumerate(loads):
        policies = load["policies"]
        if OURS not in policies:
            raise ValueError(f"the report has no {OURS!r} run at {load['rps']:g} req/s (replay with --policies all)")
        ours = policies[OURS]
        fair = {p: e for p, e in policies.items() if e["fair"]}
        rivals = {p: e for p, e in fair.items() if p not in (OURS, ORACLE)}
        rival = max(rivals, key=lambda p: rivals[p]["goodput_rps"], default=None)
        oracle = policies.get(ORACLE)
        above = [] if oracle is None else [
            _named(p, e) for p, e in fair.items()
            if p != ORACLE and e["goodput_rps"] > oracle["goodput_rps"] + EPS]
        best = max(e["goodput_rps"] for e in (fair or policies).values())
        weak = [] if i else [_named(p, e) for p, e in policies.items()
                             if is_baseline(p) and e["goodput_rps"] < LOWEST_LOAD_MIN * best - EPS]
        verdicts.append(LoadVerdict(
            rps=load["rps"], ours=ours["goodput_rps"], ours_fair=ours["fair"],
            rival=_named(rival, rivals[rival]) if rival else None,
            rival_rps=rivals[rival]["goodput_rps"] if rival else 0.0,
            best_below=best_below, oracle_rps=None if oracle is None else oracle["goodput_rps"],
            above_oracle=above, weak_baselines=weak))
        best_below = max(best_below, ours["goodput_rps"])
    return verdicts


def _loads(n: int) -> str:
    return f"{n} load" + ("" if n == 1 else "s")


def verdict_text(paths: list[Path]) -> str:
    """A table of every load of every report under `paths`, then the loads
    where tiertp misses a check, tiertp's total goodput over them all, and
    the loads where the oracle or a baseline misses one of theirs."""
    rows = [("setting", "req/s", "tiertp", "best other serving every tier", "ratio", "oracle", "tiertp misses")]
    ours, others, total, count = [], [], 0.0, 0
    for path in find_reports(paths):
        name = path.parent.name
        for v in judge(load_report(path)):
            count += 1
            total += v.ours
            if v.misses:
                ours.append(f"{name} @{v.rps:g}: {'; '.join(v.misses)}")
            if v.other_misses:
                others.append(f"{name} @{v.rps:g}: {'; '.join(v.other_misses)}")
            rows.append((name, f"{v.rps:g}", f"{v.ours:.2f}{'' if v.ours_fair else UNFAIR}",
                         f"{v.rival} {v.rival_rps:.2f}" if v.rival else "none",
                         f"{v.ratio:.3f}" if v.ratio is not None else "-",
                         f"{v.oracle_rps:.2f}" if v.oracle_rps is not None else "-", str(len(v.misses)) if v.misses else ""))
    lines = text_table(rows)
    lines += ["", f"{UNFAIR} tiertp leaves a tier unserved (the fairness rule of the report's metrics)",
              f"{_loads(count)}; tiertp's goodput summed over them: {total:.2f} req/s",
              f"tiertp misses a check at {_loads(len(ours))} (it serves every tier, reaches {RATIO_MIN}x the best "
              f"other policy that does, never falls below {FALL_MIN}x its best at a lower load)"]
    lines += [f"  {m}" for m in ours]
    lines.append(f"the oracle or a baseline misses a check at {_loads(len(others))} (the oracle at or above every "
                 f"policy serving every tier; every baseline within {LOWEST_LOAD_MIN}x the best at the lowest load)")
    lines += [f"  {m}" for m in others]
    return "\n".join(lines)

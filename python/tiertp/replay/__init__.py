"""Trace replay: drive the cluster simulator over a load sweep, pick each
baseline's best settings with hindsight, and report goodput, SLO attainment,
latency percentiles and the cluster configuration over time."""

from tiertp.replay.conservation import ConservationError, check_conservation
from tiertp.replay.simulated_replay import ReplayConfig, ReplayReport, replay
from tiertp.replay.policies import KNOB_VALUES, SWEPT, parse_policies, variants
from tiertp.replay.workload import DEFAULT_TIER_MAP, Load, TierRule, build_workload, cut_load

__all__ = [
    "DEFAULT_TIER_MAP", "KNOB_VALUES", "SWEPT", "ConservationError", "Load", "ReplayConfig", "ReplayReport",
    "TierRule", "build_workload", "check_conservation", "cut_load", "parse_policies", "replay", "variants",
]

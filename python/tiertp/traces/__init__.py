"""Request traces for replay: readers (Azure, BurstGPT, Mooncake), a
synthetic generator, and transforms (rate scaling, time windows, tier
assignment, merging). One concept per module; the public names are here."""

from tiertp.traces.assign import assign_by_fractions, assign_by_map, parse_fractions, parse_pairs, rename_tiers
from tiertp.traces.catalog import NAMED_TRACES, SYNTHETIC_KEYS, load_trace, parse_synthetic
from tiertp.traces.errors import TraceError
from tiertp.traces.formats import FORMATS, read_file
from tiertp.traces.merge import merge
from tiertp.traces.scale import scale_to_rps, scale_window_to_rps
from tiertp.traces.synthetic import ARRIVALS, LengthDist, SyntheticSpec, generate
from tiertp.traces.trace import UNASSIGNED, Trace, make_trace
from tiertp.traces.window import time_window

__all__ = [
    "ARRIVALS", "FORMATS", "NAMED_TRACES", "SYNTHETIC_KEYS", "UNASSIGNED",
    "LengthDist", "SyntheticSpec", "Trace", "TraceError",
    "assign_by_fractions", "assign_by_map", "generate", "load_trace", "make_trace", "merge",
    "parse_fractions", "parse_pairs", "parse_synthetic", "read_file", "rename_tiers",
    "scale_to_rps", "scale_window_to_rps", "time_window",
]

"""tiertp: tiered-SLO LLM serving with tensor parallelism as a run-time knob."""

__version__ = "0.1.0"

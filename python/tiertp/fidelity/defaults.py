"""Defaults of `tiertp fidelity`, each written once."""

from __future__ import annotations

from pathlib import Path

# SLO tiers sized for SmolLM2-135M on this 2-core CPU host (see the file).
TIERS_CPU_TWO_TIER = Path(__file__).resolve().parent / "tiers-cpu-two-tier.toml"
# The loaded probe's wave sizes: requests sent together, up to the largest
# decode batch the CPU profile grids measure.
PROBE_CONCURRENCY = (2, 4, 8, 16)

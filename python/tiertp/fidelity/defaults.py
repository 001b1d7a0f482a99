"""Defaults of `tiertp fidelity`, each written once."""

from __future__ import annotations

from pathlib import Path

# SLO tiers sized for SmolLM2-135M on this 2-core CPU host (see the file).
TIERS_CPU_TWO_TIER = Path(__file__).resolve().parent / "tiers-cpu-two-tier.toml"

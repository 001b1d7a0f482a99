"""Defaults of `tiertp fidelity`, each written once."""

from __future__ import annotations

from pathlib import Path

# SLO tiers sized for SmolLM2-135M on this 2-core CPU host (see the file).
TIERS_CPU_TWO_TIER = Path(__file__).resolve().parent / "tiers-cpu-two-tier.toml"
# The control window both sides plan with: a server fidelity starts gets it
# (`tiertp serve --window`); 1 s is also the gateway's default (DESIGN.md §1),
# what a server given with --url runs unless it was started otherwise.
GATEWAY_WINDOW_S = 1.0

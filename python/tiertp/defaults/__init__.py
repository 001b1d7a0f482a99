"""Embedded defaults shipped inside the package (tier config)."""

from __future__ import annotations

from pathlib import Path

DEFAULTS_DIR = Path(__file__).resolve().parent
DEFAULT_TIERS = DEFAULTS_DIR / "tiers.toml"

"""Tier configurations replay can name instead of giving a TOML path."""

from __future__ import annotations

from pathlib import Path

from tiertp.defaults import DEFAULT_TIERS, DEFAULTS_DIR

# The one list of shipped tier configs.
TIER_CONFIGS: dict[str, Path] = {
    "default": DEFAULT_TIERS,
    "azure-two-tier": DEFAULTS_DIR / "tiers-azure-two-tier.toml",
}


def resolve_tiers(spec: str) -> Path:
    """A shipped config's name, or a TOML file path."""
    if spec in TIER_CONFIGS:
        return TIER_CONFIGS[spec]
    path = Path(spec)
    if path.is_file():
        return path
    raise ValueError(f"unknown tier config {spec!r}: not a file, nor one of {', '.join(TIER_CONFIGS)}")

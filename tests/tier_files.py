"""The tier files the tests serve with (tests/tiers/NAME.toml), as text."""

from __future__ import annotations

from pathlib import Path

TIERS_DIR = Path(__file__).parent / "tiers"


def tier_text(name: str) -> str:
    return (TIERS_DIR / f"{name}.toml").read_text()

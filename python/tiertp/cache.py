"""The one cache root of tiertp: built models, compiled kernels and measured
profiles live under it, each in its own folder."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "TIERTP_CACHE"


def cache_root() -> Path:
    """$TIERTP_CACHE, else ~/.cache/tiertp."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "tiertp")

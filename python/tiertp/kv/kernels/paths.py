"""Where the kernel sources are and where their builds are cached."""

from __future__ import annotations

import os
from pathlib import Path

from tiertp.cache import cache_root


def kernel_dir() -> Path:
    """kernels/kv_migrate of this checkout (TIERTP_KERNELS overrides the kernels/ root)."""
    env = os.environ.get("TIERTP_KERNELS")
    root = Path(env) if env else Path(__file__).resolve().parents[4] / "kernels"
    return root / "kv_migrate"


def cache_dir() -> Path:
    """Build cache: the cache root (tiertp.cache)."""
    return cache_root()

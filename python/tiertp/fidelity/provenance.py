"""What a fidelity result depends on beyond its options: the code (git
commit, uncommitted changes), the worker's step runner choice, the host."""

from __future__ import annotations

import os
import platform
import subprocess
import time
from pathlib import Path

_REPO = Path(__file__).resolve().parents[3]


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(_REPO), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def describe() -> dict:
    status = _git("status", "--porcelain")
    return {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "git_commit": _git("rev-parse", "HEAD"),
        "git_uncommitted_files": None if status is None else len(status.splitlines()),
        "step_runner_env": os.environ.get("TIERTP_STEP_RUNNER"),
        "host": {"cpus": os.cpu_count(), "machine": platform.machine(), "python": platform.python_version()},
    }

"""Where the public data lives (traces, measured GPU kernel latencies).

Code that needs it takes a path argument or uses `data_dir()`: $TIERTP_DATA,
else ../shared/data next to the checkout.
"""

from __future__ import annotations

import os
from pathlib import Path

_HINT = (
    "tiertp's public data (Azure LLM traces, aiconfigurator GPU kernel latencies) "
    "is expected in $TIERTP_DATA or ../shared/data beside the checkout"
)


def data_dir() -> Path:
    env = os.environ.get("TIERTP_DATA")
    if env:
        path = Path(env)
    else:
        path = Path(__file__).resolve().parents[3] / "shared" / "data"
    if not path.is_dir():
        raise FileNotFoundError(f"data directory {path} not found; {_HINT}")
    return path


def data_path(*parts: str) -> Path:
    path = data_dir().joinpath(*parts)
    if not path.exists():
        raise FileNotFoundError(f"{path} not found; {_HINT}")
    return path

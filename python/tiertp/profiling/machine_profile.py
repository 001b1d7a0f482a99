"""The profile `tiertp serve` plans with unless told otherwise: this machine's.

Measured once with the quick grid (`tiertp profile --quick`) at the TP levels
the worker runs, each rank on the cores the worker gives a device, and cached
under the cache root's `profiles/` by model, device and TP levels. The file
name also carries a stamp of what else the numbers depend on (the CPU or GPU
model, the grid, the SGLang version), so a change to any of them measures
again instead of reusing stale numbers. A cached file that no longer loads is
measured again; two serves starting at once measure once (a file lock).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tiertp import _scheduler
from tiertp.cache import cache_root
from tiertp.engine.models import model_name
from tiertp.profiling import provenance
from tiertp.profiling.grid import grid_for
from tiertp.profiling.run_profile import ProfileRequest, run_profile

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MachineProfileKey:
    """What a measured profile's numbers depend on: the cache's key."""

    model: str  # the model's short name (tiertp.engine.models.model_name)
    device: str  # cpu | cuda
    tp_levels: tuple[int, ...]
    cores_per_rank: int  # CPU: cores each TP rank runs on (the worker's cores per device)

    def path(self, root: Path) -> Path:
        """The cached profile's file under the cache root `root`."""
        stamp = json.dumps({"device_model": provenance.device_name(self.device) if self.device != "cpu"
                            else provenance.cpu_name(),
                            "grid": grid_for(self.device, True).to_dict(),
                            "sglang": provenance.package_version("sglang")}, sort_keys=True)
        digest = hashlib.sha256(stamp.encode()).hexdigest()[:12]
        device = f"cpu-{self.cores_per_rank}core" if self.device == "cpu" else self.device
        levels = "-".join(str(t) for t in self.tp_levels)
        return root / "profiles" / _slug(self.model) / device / f"tp{levels}-{digest}.json"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text)


def _measure(req: ProfileRequest) -> None:
    run_profile(req, progress_bar=False)


def machine_profile(model: str, device: str, tp_levels: list[int] | tuple[int, ...], cores_per_rank: int, *,
                    root: Path | None = None, measure: Callable[[ProfileRequest], None] | None = None,
                    announce: Callable[[str], None] = print) -> Path:
    """The cached profile of this machine for `model` at `tp_levels`, measured
    first if there is none. Raises what `measure` raises (the engine failing,
    no such device) with the cache left as it was, a half-done measurement
    kept for the next try to resume. `measure` (default: `tiertp profile`'s
    run) writes the profile a ProfileRequest asks for."""
    key = MachineProfileKey(model_name(model), device, tuple(sorted(set(tp_levels))), cores_per_rank)
    path = key.path(root or cache_root())
    if _usable(path, key):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(f".{path.stem}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _usable(path, key, warn=False):  # another process measured it meanwhile
            return path
        levels = ", ".join(f"TP{t}" for t in key.tp_levels)
        announce(f"measuring this machine's profile of {key.model} ({device}, {levels}) once, about a minute "
                 f"per TP level; cached in {path.parent} (--profile synthetic skips this)")
        (measure or _measure)(ProfileRequest(model=model, tp_levels=list(key.tp_levels), device=device, out=path, quick=True,
                               cores_per_rank=cores_per_rank))
        if not _usable(path, key):
            raise RuntimeError(f"measuring the profile wrote no usable {path}")
    return path


def _usable(path: Path, key: MachineProfileKey, warn: bool = True) -> bool:
    """Whether `path` is a profile the planner can load with a table for every
    level (`warn`: say why a file that is there is not)."""
    if not path.is_file():
        return False
    try:
        loaded = _scheduler.Profile.load(str(path))
    except ValueError as e:
        if warn:
            log.warning("cached profile %s does not load (%s): measuring it again", path, e)
        return False
    return set(key.tp_levels) <= set(loaded.tp_levels)

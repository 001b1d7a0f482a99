"""CPU backing of a store: one file in /dev/shm, mapped MAP_SHARED by every process.

The file is named after its owner's pid, so `sweep_stale` can remove files
whose owner died without closing its store (a SIGKILLed agent), and every
attaching process maps the same page-cache pages: one copy in RAM however
many processes map it. `mapping_memory` reads the kernel's own accounting of
those pages for one process (/proc/<pid>/smaps).
"""

from __future__ import annotations

import os
import re
import uuid
from dataclasses import dataclass
from pathlib import Path

import torch

from tiertp.weights.errors import WeightStoreError

SHM_DIR = Path("/dev/shm")
_PREFIX = "tiertp-weights-"
_NAME = re.compile(rf"^{_PREFIX}(\d+)-[0-9a-f]+$")


@dataclass(frozen=True)
class ShmBacking:
    path: str
    nbytes: int


def create(nbytes: int) -> tuple[ShmBacking, torch.Tensor]:
    """A fresh zero-filled shared file of `nbytes` and this process's byte view of it."""
    if not SHM_DIR.is_dir():
        raise WeightStoreError(f"{SHM_DIR} does not exist; the CPU weight store needs a tmpfs there")
    stat = os.statvfs(SHM_DIR)
    free = stat.f_bavail * stat.f_frsize
    if free < nbytes:
        raise WeightStoreError(
            f"{SHM_DIR} has {free / 2**30:.2f} GiB free, the weight store needs {nbytes / 2**30:.2f} GiB"
        )
    sweep_stale()
    path = SHM_DIR / f"{_PREFIX}{os.getpid()}-{uuid.uuid4().hex}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, nbytes)
    finally:
        os.close(fd)
    backing = ShmBacking(str(path), nbytes)
    return backing, open_(backing)


def open_(backing: ShmBacking) -> torch.Tensor:
    """Map the store's file (MAP_SHARED) as a uint8 tensor of its full size."""
    path = Path(backing.path)
    if not path.is_file():
        raise WeightStoreError(f"weight store file {path} is gone (its owner closed the store or died)")
    if path.stat().st_size != backing.nbytes:
        raise WeightStoreError(f"weight store file {path} has {path.stat().st_size} bytes, expected {backing.nbytes}")
    return torch.from_file(str(path), shared=True, size=backing.nbytes, dtype=torch.uint8)


def unlink(backing: ShmBacking) -> None:
    """Remove the file; mappings that exist stay valid until their processes drop them."""
    try:
        os.unlink(backing.path)
    except FileNotFoundError:
        pass


def sweep_stale() -> list[str]:
    """Remove store files whose owner process no longer exists; returns their paths."""
    removed = []
    for path in SHM_DIR.glob(f"{_PREFIX}*"):
        m = _NAME.match(path.name)
        if m and not _alive(int(m.group(1))):
            try:
                path.unlink()
                removed.append(str(path))
            except (FileNotFoundError, PermissionError):
                pass
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def mapping_memory(path: str, pid: int | str = "self") -> dict[str, int]:
    """The kernel's accounting (bytes) of process `pid`'s mappings of `path`, summed:
    Size, Rss, Pss, Shared_Clean, Shared_Dirty, Private_Clean, Private_Dirty, and
    `mappings` (how many). Rss counts the pages this process has touched; Shared_*
    the ones some other process maps too; Pss splits each page between its mappers."""
    fields = ("Size", "Rss", "Pss", "Shared_Clean", "Shared_Dirty", "Private_Clean", "Private_Dirty")
    total = dict.fromkeys(fields, 0)
    total["mappings"] = 0
    inside = False
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split(None, 1)[0]
            if not head.endswith(":"):  # a mapping header: "start-end perms offset dev inode path"
                parts = line.split()
                inside = len(parts) >= 6 and parts[5] == path
                total["mappings"] += inside
            elif inside and head[:-1] in total:
                total[head[:-1]] += int(line.split()[1]) * 1024
    return total

"""KV pools that other processes on the host read directly (CPU pools).

`share_pool(pool)` moves a pool's buffers into shared memory, once: torch's
own storage sharing copies each storage's bytes into an unlinked /dev/shm
file and switches the storage over in place, so every tensor and view of it
(an engine's own, SGLang's included) keeps working on the same data. It
records a `PoolExport` on the pool (`pool.shared`): small and picklable, what
a peer needs to find the memory. `PoolMaps.view(export)` maps it read-only in
another process (through /proc/<pid>/fd of the owner) as a KVPool.

What it buys: a migration's receiver can copy a sender's KV straight out of
the sender's pool into its own, one copy of each byte, with no staging
buffer and no work in the sending process (tiertp.kv.shm_transport).
"""

from __future__ import annotations

import logging
import mmap
import os
import uuid
import warnings
from collections import OrderedDict
from dataclasses import dataclass

import torch

from tiertp.kv.layout import HeadRange
from tiertp.kv.pool import KVPool
from tiertp.kv.shape import KVShape

log = logging.getLogger(__name__)

_SHM_DIR = "/dev/shm"
# Free /dev/shm a pool may take, at most: tmpfs allocates lazily, so a full
# one fails with SIGBUS at first touch rather than with an error at creation.
_SHM_SHARE = 0.5
# Peer pools kept mapped per process; the least recently used beyond it is
# unmapped (a peer that is gone keeps nothing alive for long).
_KEEP_POOLS = 4


@dataclass(frozen=True)
class PoolExport:
    """Where a shared pool lies: `files[i]` = (fd in process `pid`, bytes,
    (st_dev, st_ino)) of its i-th storage; `buffers` = (file index, byte
    offset) of each K buffer, then each V buffer, per layer. `token` is
    unique per export (pids recur); the inode guards against a reused fd."""

    token: str
    pid: int
    files: tuple[tuple[int, int, tuple[int, int]], ...]
    buffers: tuple[tuple[int, int], ...]
    shape: KVShape
    heads: HeadRange
    slots: int


def share_pool(pool: KVPool) -> PoolExport | None:
    """Put `pool`'s buffers in shared memory (once) and return its export;
    None when it cannot be shared (not on CPU, /dev/shm too small, or the
    sharing failed: logged), in which case nothing changed."""
    if pool.shared is not None:
        return pool.shared
    if pool.device.type != "cpu":
        return None
    buffers = pool.k_buffers + pool.v_buffers
    storages: dict[int, torch.UntypedStorage] = {}
    for b in buffers:
        s = b.untyped_storage()
        storages.setdefault(s._cdata, s)  # the storage itself: its data pointer changes when shared
    need = sum(s.nbytes() for s in storages.values() if not s.is_shared())
    st = os.statvfs(_SHM_DIR)
    if need > _SHM_SHARE * st.f_bavail * st.f_frsize:
        log.warning("KV pool of %d MiB not shared: /dev/shm has %d MiB free", need >> 20,
                    (st.f_bavail * st.f_frsize) >> 20)
        return None
    files, index = [], {}
    try:
        for key, s in storages.items():
            fd, size = s._share_fd_cpu_()  # in place: the storage now lives in the shm file
            index[key] = len(files)
            info = os.fstat(fd)
            files.append((int(fd), int(size), (info.st_dev, info.st_ino)))
    except (RuntimeError, OSError) as e:
        log.warning("KV pool not shared: %s", e)
        return None
    # Offsets are taken after sharing: the storages moved.
    places = tuple((index[_key(b)], b.data_ptr() - b.untyped_storage().data_ptr()) for b in buffers)
    pool.shared = PoolExport(f"{os.getpid()}-{uuid.uuid4().hex[:12]}", os.getpid(), tuple(files), places,
                             pool.shape, pool.heads, int(pool.k_buffers[0].shape[0]))
    return pool.shared


def _key(b: torch.Tensor) -> int:
    return b.untyped_storage()._cdata


class PoolMaps:
    """Peer pools this process has mapped, by export token (mapped once,
    read-only, kept for the next migration)."""

    def __init__(self) -> None:
        self._views: OrderedDict[str, KVPool] = OrderedDict()

    def view(self, export: PoolExport) -> KVPool | None:
        """A read-only KVPool over the exported buffers; None (logged) if this
        process cannot map them (another host or namespace, no permission,
        an export that does not describe the file): the caller then stages."""
        pool = self._views.get(export.token)
        if pool is not None:
            self._views.move_to_end(export.token)
            return pool
        try:
            pool = _view(export)
        except Exception as e:  # noqa: BLE001 - an optimisation failing: the caller stages instead
            log.warning("cannot map the KV pool of process %d: %s: %s", export.pid, type(e).__name__, e)
            return None
        self._views[export.token] = pool
        while len(self._views) > _KEEP_POOLS:
            self._views.popitem(last=False)  # unmapped with its last tensor
        return pool


def _view(export: PoolExport) -> KVPool:
    maps = [_map(export.pid, fd, size, inode) for fd, size, inode in export.files]
    s = export.shape
    per = export.slots * export.heads.count * s.head_dim * s.itemsize
    tensors = [maps[f][off:off + per].view(s.dtype).view(export.slots, export.heads.count, s.head_dim)
               for f, off in export.buffers]
    return KVPool(s, export.heads, tensors[:s.num_layers], tensors[s.num_layers:])


def _map(pid: int, fd: int, size: int, inode: tuple[int, int]) -> torch.Tensor:
    f = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDONLY)
    try:
        st = os.fstat(f)
        if (st.st_dev, st.st_ino) != tuple(inode):
            raise OSError(f"fd {fd} of process {pid} is no longer the shared KV pool")
        # Populated at once: one call maps every page, where first touches would fault per 4 KiB.
        m = mmap.mmap(f, size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0), prot=mmap.PROT_READ)
    finally:
        os.close(f)
    with warnings.catch_warnings():  # read-only on purpose: a receiver never writes a sender's pool
        warnings.simplefilter("ignore", UserWarning)
        return torch.frombuffer(m, dtype=torch.uint8)

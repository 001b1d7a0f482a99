"""The node's shared weight stores: one full copy of the model per device.

When the agent keeps more than one TP level warm, it loads the model once per
device into a tiertp.weights store (shared memory on CPU, CUDA IPC on GPU)
before starting any execution process; every TP-level process of that
device binds its parameters to zero-copy views of it
(tiertp.switching.weight_binder). With a single TP level each device has one
process anyway and loads the weights itself.
"""

from __future__ import annotations

import logging
import pickle
import time
from pathlib import Path

from tiertp.engine.models import resolve_model
from tiertp.weights import StoreHandle, WeightStore, create_store

log = logging.getLogger(__name__)

# The CPU engine's dtype (tiertp.engine.sglang_compat.engine_kwargs): the
# store must hold what the engine computes in.
CPU_DTYPE = "float32"


def create_device_stores(model: str, devices: int, tp_levels: tuple[int, ...]) -> dict[int, WeightStore]:
    """One store per device serving every level in `tp_levels`; closes what it made on failure."""
    model_dir = resolve_model(model)
    stores: dict[int, WeightStore] = {}
    try:
        for d in range(devices):
            t0 = time.perf_counter()
            stores[d] = create_store(model_dir, tuple(tp_levels), device="cpu", dtype=CPU_DTYPE)
            log.info("device %d: weight store for TP levels %s, %.0f MiB in %.1f s", d, list(tp_levels),
                     stores[d].layout.nbytes / 2**20, time.perf_counter() - t0)
    except BaseException:
        close_stores(stores)
        raise
    return stores


def close_stores(stores: dict[int, WeightStore]) -> None:
    for s in stores.values():
        s.close()


def write_store_handles(stores: dict[int, WeightStore], directory: Path) -> Path:
    """{device: handle} into a file for the execution processes (`--weight-stores FILE`);
    a file, not an argument: a layout lists every parameter and outgrows argv."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "weight-stores.pickle"
    path.write_bytes(pickle.dumps({d: s.handle for d, s in stores.items()}))
    return path


def read_store_handles(path: str | Path) -> dict[int, StoreHandle]:
    handles = pickle.loads(Path(path).read_bytes())
    if not isinstance(handles, dict) or not all(isinstance(h, StoreHandle) for h in handles.values()):
        raise ValueError(f"{path} is not a {{device: StoreHandle}} mapping")
    return handles

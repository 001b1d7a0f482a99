"""Shared, zero-copy, interleaved weight store (DESIGN.md §3 "Weights").

Per device, the weights are loaded once into one full copy that all of that
device's TP-level processes map (CPU: a file in /dev/shm, MAP_SHARED; GPU:
one allocation shared by CUDA IPC). Each process's parameters are views of
it: a nested interleaved storage order (tiertp.weights.interleave) makes
every rank's shard of every candidate TP level one contiguous slice.

API (TP context always passed explicitly):

    # the device's owner (node agent), once per device:
    store = create_store(model_dir, levels=(1, 2, 4), device="cpu", dtype="float32")
    text = store.handle.encode()          # or pickle store.handle; small
    ...
    store.close()                         # when the device's processes are done

    # each execution process (TP level tp, rank rank on this device):
    attached = attach(StoreHandle.decode(text))
    with loading_from_store(attached, tp, rank) as loader:   # SGLang's model-loader hook
        runner = ModelRunner(...)         # its load_model binds the views; nothing read from disk
    loader.stats                          # BindStats
    # (or, on a runner built with load_format="dummy", before CUDA graphs are captured:
    #  stats = bind_sglang_model(runner.model, attached, tp, rank))

- `create_store(model_dir, levels, device=, dtype=)` -> `WeightStore` (owner;
  `.handle`, `.close()`, also usable as an `AttachedStore`). The store block
  count B is lcm(levels) ({1,2,4} -> 4, {1,3} -> 3). Levels above the model's
  KV-head count (SGLang would replicate KV heads) are rejected.
- `attach(handle)` -> `AttachedStore`: `.shard(name, tp, rank)` (a view),
  `.full(name)`, `.contains(tensor)`, `.memory()` (smaps accounting, CPU).
- `bind(model, attached, tp, rank)` -> `BindStats`: generic name-based
  parameter replacement; `bind_sglang_model` adds the SGLang Llama
  integration (block-aware split of the fused qkv / gate_up outputs) and
  `loading_from_store` / `store_loader` run it as SGLang model loader; all
  in the one module that touches SGLang's model code,
  tiertp.weights.sglang_llama. Importing tiertp.weights never imports SGLang
  (tiertp.engine.sglang_compat.apply must come first).
- A TP level the store was not built for raises `UnsupportedLevel`; model /
  store mismatches raise `BindError` / `UnsupportedModel`; a CUDA store
  without a GPU raises `NoGPUError`. All derive from `WeightStoreError`.

Modules: interleave (the maths), layout (entries, offsets, shard views),
llama_plan (checkpoint -> entries), checkpoint (safetensors reader),
shm_backing / cuda_backing (the shared buffer), store (create / attach),
bind (parameter replacement), sglang_llama (SGLang integration), verify
(SGLang normal load vs. store views, for tests and checks).
"""

from tiertp.weights.bind import BindStats, bind, parameters_outside
from tiertp.weights.errors import BindError, NoGPUError, UnsupportedLevel, UnsupportedModel, WeightStoreError
from tiertp.weights.interleave import block_count
from tiertp.weights.llama_plan import SUPPORTED_ARCHITECTURES
from tiertp.weights.sglang_llama import bind_sglang_model, loading_from_store, store_loader
from tiertp.weights.store import AttachedStore, StoreHandle, WeightStore, attach, create_store

__all__ = [
    "SUPPORTED_ARCHITECTURES", "AttachedStore", "BindError", "BindStats", "NoGPUError", "StoreHandle",
    "UnsupportedLevel", "UnsupportedModel", "WeightStore", "WeightStoreError", "attach", "bind",
    "bind_sglang_model", "block_count", "create_store", "loading_from_store", "parameters_outside", "store_loader",
]

"""tiertp's stand-in for `sgl_kernel` on CPU-only hosts (see tiertp.engine.sglang_compat).

PyPI ships only CUDA builds of `sgl_kernel`, which fail to import without a
GPU driver, yet SGLang's CPU path imports a few names from it at module
level. This package provides exactly those names. None of them is called on
the configuration tiertp uses (torch_native attention, pytorch sampling, no
speculative decoding): each raises `SglKernelStubError` if it ever is, so a
code path that needs the real kernels fails loudly instead of computing
garbage. It is only put on the import path for `device="cpu"` engines, so it
never shadows a real `sgl_kernel` on a GPU host.
"""

from __future__ import annotations

# Every name SGLang 0.5.23 imports from top-level sgl_kernel under `is_cpu()`
# (found by scanning its `from sgl_kernel import ...` statements). Extend this
# list (and only this list) when a new SGLang version imports more; models
# needing `sgl_kernel.mamba` (linear attention) are not supported on CPU.
STUB_NAMES = (
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "assign_req_to_token_pool_cpu",
    "build_draft_decode_metadata_cpu",
    "build_tree_kernel_efficient_cpu",
    "copy_all_layer_kv_cache_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "rotate_input_ids_cpu",
    "verify_tree_greedy_cpu",
)

IS_TIERTP_STUB = True


class SglKernelStubError(RuntimeError):
    """A CPU code path called a real sgl_kernel function, which this host lacks."""


def _make(name: str):
    def stub(*args, **kwargs):
        raise SglKernelStubError(
            f"sgl_kernel.{name} was called, but this is tiertp's CPU stand-in for "
            "sgl_kernel (the real package is CUDA-only). The engine configuration "
            "reached a code path that needs SGLang's native CPU kernels; use the "
            "settings in tiertp.engine.sglang_compat (torch_native attention, "
            "pytorch sampling, no speculative decoding)."
        )

    stub.__name__ = stub.__qualname__ = name
    return stub


for _name in STUB_NAMES:
    globals()[_name] = _make(_name)
del _name

"""Naive gather/scatter: one slice copy per (layer, K|V, page, token). The
ground truth the real kernels are tested against (tests/test_kv_kernels.py);
far too slow for use, so it lives with the tests, not in tiertp.kv.kernels."""

from __future__ import annotations

from tiertp.kv.kernels.base import KVKernels, check_staging


class ReferenceKernels(KVKernels):
    name = "reference"

    def gather(self, k_buffers, v_buffers, page_ids, page_size, head_start, out):
        check_staging(k_buffers, v_buffers, page_ids, page_size, head_start, out)
        hc = out.shape[4]
        for layer, bufs in enumerate(zip(k_buffers, v_buffers)):
            for kv, buf in enumerate(bufs):
                for i, page in enumerate(page_ids.tolist()):
                    for t in range(page_size):
                        out[layer, kv, i, t] = buf[page * page_size + t, head_start:head_start + hc]

    def scatter(self, k_buffers, v_buffers, page_ids, page_size, head_start, src):
        check_staging(k_buffers, v_buffers, page_ids, page_size, head_start, src)
        hc = src.shape[4]
        for layer, bufs in enumerate(zip(k_buffers, v_buffers)):
            for kv, buf in enumerate(bufs):
                for i, page in enumerate(page_ids.tolist()):
                    for t in range(page_size):
                        buf[page * page_size + t, head_start:head_start + hc] = src[layer, kv, i, t]

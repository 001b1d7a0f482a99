"""Naive gather/scatter: one slice copy per (layer, K|V, page, token). The
ground truth the real kernels are tested against (tests/test_kv_kernels.py);
far too slow for use, so it lives with the tests, not in tiertp.kv.kernels."""

from __future__ import annotations

from tiertp.kv.kernels.base import KVKernels, check_staging


class ReferenceKernels(KVKernels):
    name = "reference"

    def gather(self, k_buffers, v_buffers, page_ids, page_size, head_start, out):
        check_staging(k_buffers, v_buffers, page_ids, page_size, head_start, out)
        for buf, row, staged, heads in _token_rows(k_buffers, v_buffers, page_ids, page_size, head_start, out):
            out[staged] = buf[row, heads]

    def scatter(self, k_buffers, v_buffers, page_ids, page_size, head_start, src):
        check_staging(k_buffers, v_buffers, page_ids, page_size, head_start, src)
        for buf, row, staged, heads in _token_rows(k_buffers, v_buffers, page_ids, page_size, head_start, src):
            buf[row, heads] = src[staged]


def _token_rows(k_buffers, v_buffers, page_ids, page_size, head_start, staging):
    """One token at a time: (layer buffer, its row, the staging index, the head slice)."""
    heads = slice(head_start, head_start + staging.shape[4])
    for layer, bufs in enumerate(zip(k_buffers, v_buffers)):
        for kv, buf in enumerate(bufs):
            for i, page in enumerate(page_ids.tolist()):
                for t in range(page_size):
                    yield buf, page * page_size + t, (layer, kv, i, t), heads

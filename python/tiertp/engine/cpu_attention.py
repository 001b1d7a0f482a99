"""The CPU engine's attention: SGLang's torch_native backend, with an extend
that attends with the new tokens' queries only.

SGLang's torch_native extend gives SDPA a query row for every token of the
sequence, prefix included (rows it leaves uninitialised and then drops), so
that the plain causal mask applies. A prompt's second prefill chunk then
costs the attention of the whole prompt again: on small-llama (4 layers of 8
heads of 96) a 2-token chunk behind a 940-token prefix took ~16 ms per layer
instead of ~0.4, and served prompts just over a plan's chunk size took
~120 ms longer to a first token than the same prompts just under it. The
profile and the simulator price a chunk by its own tokens, as a GPU
backend (flashinfer, triton) runs it. Here the query holds the new tokens
only and the mask is causal from the prefix on: new token i sees key j iff
j <= prefix + i, the rows SGLang keeps, so the output is the same.

It takes over SGLang's attention registry entry "torch_native" (the name
every CPU-specific rule of SGLang keys on stays the same) in the process
that builds the model runner, before the runner is built (`install`).
Sliding windows and encoder/cross attention keep SGLang's code. So does the
SGLang `Engine` fallback runner (tiertp.worker.engine_runner): its model
runs in SGLang's own scheduler processes, which this registration does not
reach.
"""

from __future__ import annotations

import torch
from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
from torch.nn.functional import scaled_dot_product_attention

# SGLang's name for the backend taken over.
BACKEND = "torch_native"


class PrefixAwareTorchNativeBackend(TorchNativeAttnBackend):
    """torch_native whose extend attends with the new tokens' queries only (module doc)."""

    def _run_sdpa_forward_extend(self, query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
                                 extend_prefix_lens, extend_seq_lens, encoder_lens=None, scaling=None,
                                 enable_gqa=False, causal=False, is_cross_attn=False, sliding_window_size=None):
        if encoder_lens is not None or is_cross_attn or (sliding_window_size is not None and sliding_window_size > -1):
            return super()._run_sdpa_forward_extend(
                query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens, extend_prefix_lens,
                extend_seq_lens, encoder_lens, scaling=scaling, enable_gqa=enable_gqa, causal=causal,
                is_cross_attn=is_cross_attn, sliding_window_size=sliding_window_size)
        # [tokens, heads, head_dim] -> [heads, tokens, head_dim], as SDPA takes them
        query = query.movedim(0, 1)
        start_q = 0
        for pool_idx, kv_len, prefix, new in zip(req_pool_indices.tolist(), seq_lens.tolist(),
                                                 extend_prefix_lens.tolist(), extend_seq_lens.tolist(), strict=True):
            end_q = start_q + new
            q = query[:, start_q:end_q, :]
            tokens = req_to_token[pool_idx, :kv_len]
            k = k_cache[tokens].movedim(0, 1)
            v = v_cache[tokens].movedim(0, 1)
            if not (q.dtype == k.dtype == v.dtype):
                k, v = k.to(q.dtype), v.to(q.dtype)
            mask, is_causal = None, causal
            if causal and prefix > 0:
                rows = torch.arange(prefix, prefix + new, device=q.device)
                mask = torch.arange(kv_len, device=q.device)[None, :] <= rows[:, None]
                is_causal = False
            out = scaled_dot_product_attention(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), attn_mask=mask,
                                               enable_gqa=enable_gqa, scale=scaling, is_causal=is_causal)
            output[start_q:end_q, :, :] = out.squeeze(0).movedim(1, 0)
            start_q = end_q
        return output


def _create(runner):
    return PrefixAwareTorchNativeBackend(runner)


def install() -> None:
    """Make "torch_native" build `PrefixAwareTorchNativeBackend` in this
    process (module doc); call after sglang_compat.apply, before the model
    runner is built."""
    from sglang.srt.layers.attention.attention_registry import register_attention_backend

    register_attention_backend(BACKEND)(_create)

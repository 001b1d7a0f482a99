"""Which TP levels a model fits at, and how many KV tokens a group holds.

Per GPU, SGLang gives weights and KV cache the fraction MEM_FRACTION_STATIC
of HBM and keeps the rest for activations, CUDA graphs and allocator slack.
Weights are sharded evenly over the group (the embedding and LM head are
vocab-parallel; replicated norm weights are negligible), so a TP group of
`tp` GPUs holds
    tp * MEM_FRACTION_STATIC * hbm_bytes - weight_bytes
bytes of KV cache, each token taking `kv_bytes_per_token` (all layers, all
KV heads, K and V) spread over the group.
"""

from __future__ import annotations

from tiertp.profiles.gpus import GpuSpec
from tiertp.profiles.models import ModelShape

MEM_FRACTION_STATIC = 0.88

# A TP level "fits" when, besides the weights and the reserve, its KV cache
# holds at least one request of this many tokens; below that it could not
# serve even one long prompt.
MIN_KV_TOKENS = 8192

TP_CANDIDATES = (1, 2, 4, 8)


def kv_capacity_tokens(model: ModelShape, gpu: GpuSpec, tp: int) -> int:
    """KV cache tokens a TP group of `tp` GPUs holds (<= 0: weights don't fit)."""
    free = tp * MEM_FRACTION_STATIC * gpu.hbm_bytes - model.weight_bytes
    return int(free // model.kv_bytes_per_token)


def fitting_tp_levels(model: ModelShape, gpu: GpuSpec) -> list[int]:
    """TP levels (of TP_CANDIDATES) where the heads split evenly and the
    KV cache holds at least MIN_KV_TOKENS."""
    return [
        tp
        for tp in TP_CANDIDATES
        if model.tp_ok(tp) and kv_capacity_tokens(model, gpu, tp) >= MIN_KV_TOKENS
    ]

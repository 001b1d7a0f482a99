"""The CPU engine's extend attention (tiertp.engine.cpu_attention) gives what
SGLang's torch_native gives, with the new tokens' queries only.

Runs isolated: SGLang is imported only after tiertp.engine.sglang_compat.apply.
"""

from __future__ import annotations

from pathlib import Path

from tiertp.engine.isolated import run_isolated

_TIMEOUT_S = 300


def compare_extends(_: dict) -> dict:
    """Runs isolated: one batch of extends (a whole prompt, chunks behind
    prefixes, grouped-query heads) through both backends; what each gave."""
    from tiertp.engine import sglang_compat

    sglang_compat.apply("cpu", 1)
    import torch
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    from tiertp.engine import cpu_attention

    torch.manual_seed(0)
    heads, kv_heads, dim = 4, 2, 8
    # (prefix, new tokens) per request: a whole prompt, a 2-token chunk behind 37, one behind 5
    seqs = [(0, 9), (37, 2), (5, 6)]
    pool = 64
    k_cache, v_cache = torch.randn(pool, kv_heads, dim), torch.randn(pool, kv_heads, dim)
    req_to_token = torch.zeros(len(seqs), pool, dtype=torch.int64)
    order = torch.randperm(pool - 1) + 1  # each request's tokens in scattered slots, none in slot 0
    used = 0
    for i, (prefix, new) in enumerate(seqs):
        req_to_token[i, :prefix + new] = order[used:used + prefix + new]
        used += prefix + new
    query = torch.randn(sum(n for _, n in seqs), heads, dim)
    args = (query, None, k_cache, v_cache, req_to_token, torch.arange(len(seqs)),
            torch.tensor([p + n for p, n in seqs]), torch.tensor([p for p, _ in seqs]),
            torch.tensor([n for _, n in seqs]))
    out = {}
    for name, cls in (("sglang", TorchNativeAttnBackend), ("tiertp", cpu_attention.PrefixAwareTorchNativeBackend)):
        backend = object.__new__(cls)  # the extend reads none of the backend's state
        for causal in (True, False):
            a = list(args)
            a[1] = torch.zeros_like(query)
            got = cls._run_sdpa_forward_extend(backend, *a, scaling=dim ** -0.5, enable_gqa=True, causal=causal)
            out[f"{name}-{'causal' if causal else 'full'}"] = got.tolist()
    cpu_attention.install()
    out["registered"] = type(ATTENTION_BACKENDS[cpu_attention.BACKEND](_FakeRunner())).__name__
    return out


class _FakeRunner:
    """What TorchNativeAttnBackend's constructor reads of a model runner."""

    device = "cpu"
    req_to_token_pool = None
    token_to_kv_pool = None


def test_extend_behind_a_prefix_equals_sglangs_and_the_registry_builds_it():
    import numpy as np

    tests_dir = str(Path(__file__).resolve().parent)
    r = run_isolated(compare_extends, {}, timeout_s=_TIMEOUT_S, env={"PYTHONPATH": tests_dir})
    for mode in ("causal", "full"):
        np.testing.assert_allclose(np.array(r[f"tiertp-{mode}"]), np.array(r[f"sglang-{mode}"]), rtol=1e-5,
                                   atol=1e-6)
    assert r["tiertp-causal"] != r["tiertp-full"]  # the prefixes' masks mattered
    assert r["registered"] == "PrefixAwareTorchNativeBackend"

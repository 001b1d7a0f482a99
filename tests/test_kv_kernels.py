"""Gather/scatter kernels: the CPU twin (native) and the torch-ops fallback
against the naive reference."""

import random

import pytest
import torch
from kv_reference import ReferenceKernels

from tiertp.kv import NoGPUError, kernels_for
from tiertp.kv.kernels.cpu import CpuKernels
from tiertp.kv.kernels.torch_ops import TorchKernels

IMPLS = {"cpu": CpuKernels, "torch": TorchKernels}


def _bits(t):
    return t.view({2: torch.int16, 4: torch.int32, 1: torch.uint8}[t.element_size()])


def _pool(gen, layers, slots, heads, dim, dtype):
    def one():
        raw = torch.randint(-128, 128, (slots, heads, dim * torch.empty((), dtype=dtype).element_size()),
                            generator=gen, dtype=torch.int8)
        return raw.view(torch.uint8).view(dtype).view(slots, heads, dim).clone()  # random bits, NaNs included
    return [one() for _ in range(layers)], [one() for _ in range(layers)]


@pytest.mark.parametrize("impl", sorted(IMPLS))
@pytest.mark.parametrize("seed", range(12))
def test_cpu_twin_matches_reference(impl, seed):
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    dtype = rng.choice([torch.bfloat16, torch.float16, torch.float32, torch.uint8])
    layers, heads, dim, ps = rng.randint(1, 3), rng.choice([1, 2, 4, 8]), rng.choice([1, 3, 8]), rng.choice([1, 2, 16])
    pages = rng.randint(2, 12)
    k, v = _pool(gen, layers, pages * ps, heads, dim, dtype)
    ids = torch.tensor(rng.sample(range(1, pages), rng.randint(1, pages - 1)), dtype=torch.long)
    h0 = rng.randrange(heads)
    hc = rng.randint(1, heads - h0)
    out_ref = torch.zeros(layers, 2, len(ids), ps, hc, dim, dtype=dtype)
    out_cpu = torch.full_like(out_ref, 7)
    ReferenceKernels().gather(k, v, ids, ps, h0, out_ref)
    IMPLS[impl]().gather(k, v, ids, ps, h0, out_cpu)
    assert torch.equal(_bits(out_ref), _bits(out_cpu))

    k2, v2 = _pool(gen, layers, pages * ps, heads, dim, dtype)
    k3, v3 = [t.clone() for t in k2], [t.clone() for t in v2]
    ReferenceKernels().scatter(k2, v2, ids, ps, h0, out_ref)
    IMPLS[impl]().scatter(k3, v3, ids, ps, h0, out_ref)
    for a, b in zip(k2 + v2, k3 + v3):
        assert torch.equal(_bits(a), _bits(b))


@pytest.mark.parametrize("impl", sorted(IMPLS))
def test_gather_then_scatter_round_trips_only_selected_heads(impl):
    gen = torch.Generator().manual_seed(1)
    k, v = _pool(gen, 2, 8 * 4, 4, 8, torch.bfloat16)
    zeros_k, zeros_v = [torch.zeros_like(t) for t in k], [torch.zeros_like(t) for t in v]
    ids = torch.tensor([5, 2, 7], dtype=torch.long)
    st = torch.empty(2, 2, 3, 4, 2, 8, dtype=torch.bfloat16)
    IMPLS[impl]().gather(k, v, ids, 4, 1, st)
    IMPLS[impl]().scatter(zeros_k, zeros_v, ids, 4, 1, st)
    for src, dst in zip(k + v, zeros_k + zeros_v):
        for p in range(8):
            rows = slice(p * 4, p * 4 + 4)
            if p in (5, 2, 7):
                assert torch.equal(_bits(dst[rows, 1:3]), _bits(src[rows, 1:3]))
            assert not _bits(dst[rows, 0]).any() and not _bits(dst[rows, 3]).any()


@pytest.mark.parametrize("impl", sorted(IMPLS))
@pytest.mark.parametrize("bad", ["shape", "heads", "dtype", "ids", "page"])
def test_bad_arguments_are_rejected(impl, bad):
    k, v = _pool(torch.Generator().manual_seed(0), 1, 8, 2, 4, torch.float32)
    ids = torch.tensor([2 if bad == "page" else 1], dtype=torch.int32 if bad == "ids" else torch.long)
    out = torch.empty(1, 2, 1, 4, 1 if bad != "heads" else 3, 4,
                      dtype=torch.float16 if bad == "dtype" else torch.float32)
    if bad == "shape":
        out = torch.empty(1, 2, 2, 4, 1, 4)
    with pytest.raises((ValueError, IndexError)):
        IMPLS[impl]().gather(k, v, ids, 4, 0, out)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given without a GPU")
def test_cuda_kernels_say_no_gpu_clearly():
    with pytest.raises(NoGPUError, match="need a GPU"):
        kernels_for("cuda")


def test_cpu_pools_get_the_cpu_twin():
    assert kernels_for("cpu").name == "cpu"


def test_native_twin_builds_on_first_use(tmp_path, monkeypatch):
    from tiertp.kv.kernels import cpu as cpu_kernels

    monkeypatch.setenv("TIERTP_CACHE", str(tmp_path))
    cpu_kernels.load_library.cache_clear()
    try:
        CpuKernels()
        assert len(list((tmp_path / "native").glob("kv_migrate_cpu-*.so"))) == 1
    finally:
        cpu_kernels.load_library.cache_clear()


def _runs(rng, starts_from: int, lengths: list[int]) -> list[int]:
    """Page ids in runs of consecutive ids of the given lengths, runs apart."""
    ids, at = [], starts_from
    for n in lengths:
        ids += list(range(at, at + n))
        at += n + rng.randint(1, 5)
    return ids


@pytest.mark.parametrize("whole", ["destination", "source"])
@pytest.mark.parametrize("seed", range(6))
def test_copy_pages_matches_gather_then_scatter(whole, seed):
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    dtype = rng.choice([torch.bfloat16, torch.float32, torch.uint8])
    layers, dim, ps, hc = rng.randint(1, 3), rng.choice([1, 8]), rng.choice([1, 4]), rng.choice([1, 2, 4])
    wide = hc * rng.choice([1, 2, 4])  # the other side holds these heads
    n = rng.randint(32, 60)
    src_heads, dst_heads = (wide, hc) if whole == "destination" else (hc, wide)
    src_start = rng.randrange(wide - hc + 1) if whole == "destination" else 0
    dst_start = 0 if whole == "destination" else rng.randrange(wide - hc + 1)
    ordered = _runs(rng, 1, [n - n // 2, n // 2])  # the whole-rows side comes in two runs
    shuffled = rng.sample(range(1, 200), n)
    src_ids, dst_ids = (shuffled, ordered) if whole == "destination" else (ordered, shuffled)
    sk, sv = _pool(gen, layers, 200 * ps, src_heads, dim, dtype)
    dk, dv = _pool(gen, layers, 200 * ps, dst_heads, dim, dtype)
    want_k, want_v = [t.clone() for t in dk], [t.clone() for t in dv]
    staging = torch.empty(layers, 2, n, ps, hc, dim, dtype=dtype)
    ReferenceKernels().gather(sk, sv, torch.tensor(src_ids), ps, src_start, staging)
    ReferenceKernels().scatter(want_k, want_v, torch.tensor(dst_ids), ps, dst_start, staging)
    assert CpuKernels().copy_pages((sk, sv), torch.tensor(src_ids), src_start, (dk, dv), torch.tensor(dst_ids),
                                   dst_start, hc, ps)
    for a, b in zip(want_k + want_v, dk + dv):
        assert torch.equal(_bits(a), _bits(b))


def test_copy_pages_declines_what_it_cannot_do_in_one_pass_and_writes_nothing():
    gen = torch.Generator().manual_seed(3)
    sk, sv = _pool(gen, 2, 64, 4, 8, torch.float32)
    dk, dv = _pool(gen, 2, 64, 4, 8, torch.float32)
    before = [t.clone() for t in dk + dv]
    ids = torch.arange(1, 33)
    scattered = torch.tensor(random.Random(3).sample(range(1, 64), 32))
    kernels = CpuKernels()
    # Neither side's rows are whole (2 of 4 heads): staging needed.
    assert not kernels.copy_pages((sk, sv), ids, 0, (dk, dv), ids, 2, 2, 1)
    # Whole rows, but in runs of one page: a call per page costs more than staging.
    assert not kernels.copy_pages((sk, sv), scattered, 0, (dk, dv), scattered, 0, 4, 1)
    assert all(torch.equal(_bits(a), _bits(b)) for a, b in zip(before, dk + dv))
    assert TorchKernels().copy_pages((sk, sv), ids, 0, (dk, dv), ids, 0, 4, 1) is False  # the default

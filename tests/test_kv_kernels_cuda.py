"""The CUDA gather/scatter kernels on a GPU: bit-exact against the naive
reference for random geometries, every vector width the launcher picks,
grids larger than one launch covers, the caller's stream, and a whole
in-process migration between two CUDA pools. Skipped where no GPU is
visible (CI); test_kv_cuda_compile.py checks the build there."""

from __future__ import annotations

import random

import pytest
import torch
from kv_harness import one_rank_context
from kv_reference import ReferenceKernels

from tiertp.kv import HeadRange, KVPool, KVShape, Layout, RequestKV, migrate, plan_migration
from tiertp.kv.kernels.cpu import CpuKernels
from tiertp.kv.kernels.cuda import CudaKernels

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.uint8]


def _bits(t):
    return t.view({2: torch.int16, 4: torch.int32, 1: torch.uint8}[t.element_size()])


def _random_bits(gen, shape, dtype):
    """Random bit patterns (NaN payloads included) of `dtype`."""
    size = torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (*shape[:-1], shape[-1] * size), generator=gen, dtype=torch.uint8)
    return raw.view(dtype)


def _pool(gen, layers, slots, heads, dim, dtype, byte_offset=0):
    """K and V buffers on the GPU, each starting `byte_offset` bytes into its
    own allocation, so base addresses are only as aligned as that offset."""
    size = torch.empty((), dtype=dtype).element_size()
    assert byte_offset % size == 0

    def one():
        host = _random_bits(gen, (slots, heads, dim), dtype)
        raw = torch.empty(slots * heads * dim * size + byte_offset, dtype=torch.uint8, device="cuda")
        buf = raw[byte_offset:].view(dtype).view(slots, heads, dim)
        buf.copy_(host)
        return buf
    return [one() for _ in range(layers)], [one() for _ in range(layers)]


def _cpu(bufs):
    return [b.cpu() for b in bufs]


def _case(seed):
    rng = random.Random(seed)
    dtype = rng.choice(DTYPES)
    size = torch.empty((), dtype=dtype).element_size()
    return dict(rng=rng, dtype=dtype, layers=rng.randint(1, 3), heads=rng.choice([1, 2, 4, 8]),
                dim=rng.choice([1, 3, 8, 64, 128]), page_size=rng.choice([1, 2, 16]),
                pages=rng.randint(2, 40), offset=size * rng.choice([0, 1, 2, 4, 8]))


@pytest.mark.parametrize("seed", range(40))
def test_gather_and_scatter_match_the_reference_bit_for_bit(seed):
    c = _case(seed)
    rng, dtype, ps = c["rng"], c["dtype"], c["page_size"]
    gen = torch.Generator().manual_seed(seed)
    k, v = _pool(gen, c["layers"], c["pages"] * ps, c["heads"], c["dim"], dtype, c["offset"])
    ids = torch.tensor(rng.sample(range(1, c["pages"]), rng.randint(1, c["pages"] - 1)), dtype=torch.long)
    h0 = rng.randrange(c["heads"])
    hc = rng.randint(1, c["heads"] - h0)
    want = torch.zeros(c["layers"], 2, len(ids), ps, hc, c["dim"], dtype=dtype)
    ReferenceKernels().gather(_cpu(k), _cpu(v), ids, ps, h0, want)
    got = torch.full_like(want, 7).cuda()
    CudaKernels().gather(k, v, ids.cuda(), ps, h0, got)
    torch.cuda.synchronize()
    assert torch.equal(_bits(want), _bits(got.cpu()))

    k2, v2 = _pool(gen, c["layers"], c["pages"] * ps, c["heads"], c["dim"], dtype, c["offset"])
    want_k, want_v = _cpu(k2), _cpu(v2)
    ReferenceKernels().scatter(want_k, want_v, ids, ps, h0, want)
    CudaKernels().scatter(k2, v2, ids.cuda(), ps, h0, want.cuda())
    torch.cuda.synchronize()
    for a, b in zip(want_k + want_v, k2 + v2):
        assert torch.equal(_bits(a), _bits(b.cpu()))


@pytest.mark.parametrize("seed", range(24))
def test_copy_pages_matches_gather_then_scatter(seed):
    c = _case(seed)
    rng, dtype, ps, dim, layers = c["rng"], c["dtype"], c["page_size"], c["dim"], c["layers"]
    gen = torch.Generator().manual_seed(seed)
    hc = rng.choice([1, 2, 4])
    src_heads, dst_heads = hc * rng.choice([1, 2]), hc * rng.choice([1, 2])
    src_start, dst_start = rng.randrange(src_heads - hc + 1), rng.randrange(dst_heads - hc + 1)
    sk, sv = _pool(gen, layers, c["pages"] * ps, src_heads, dim, dtype, c["offset"])
    dk, dv = _pool(gen, layers, 50 * ps, dst_heads, dim, dtype)
    n = rng.randint(1, c["pages"] - 1)
    src_ids = torch.tensor(rng.sample(range(1, c["pages"]), n), dtype=torch.long)
    dst_ids = torch.tensor(rng.sample(range(1, 50), n), dtype=torch.long)
    staging = torch.empty(layers, 2, n, ps, hc, dim, dtype=dtype)
    want_k, want_v = _cpu(dk), _cpu(dv)
    ReferenceKernels().gather(_cpu(sk), _cpu(sv), src_ids, ps, src_start, staging)
    ReferenceKernels().scatter(want_k, want_v, dst_ids, ps, dst_start, staging)
    assert CudaKernels().copy_pages((sk, sv), src_ids.cuda(), src_start, (dk, dv), dst_ids, dst_start, hc, ps)
    torch.cuda.synchronize()
    for a, b in zip(want_k + want_v, dk + dv):
        assert torch.equal(_bits(a), _bits(b.cpu()))


def test_a_grid_larger_than_one_launch_copies_every_row():
    """Two Llama-8B-sized layers at 1-token pages: more 16-byte vectors than
    the launcher's 65535 x 256 threads, so the grid-stride loop does the rest."""
    gen = torch.Generator().manual_seed(3)
    layers, heads, dim, pages = 2, 8, 128, 40_000
    k, v = _pool(gen, layers, pages + 1, heads, dim, torch.bfloat16)
    ids = torch.randperm(pages, generator=gen)[: pages - 7] + 1
    out = torch.empty(layers, 2, len(ids), 1, heads, dim, dtype=torch.bfloat16, device="cuda")
    assert out.numel() * out.element_size() // 16 > 65535 * 256
    CudaKernels().gather(k, v, ids.cuda(), 1, 0, out)
    want = torch.empty_like(out, device="cpu")
    CpuKernels().gather(_cpu(k), _cpu(v), ids, 1, 0, want)
    assert torch.equal(_bits(want), _bits(out.cpu()))
    k2, v2 = _pool(gen, layers, pages + 1, heads, dim, torch.bfloat16)
    want_k, want_v = _cpu(k2), _cpu(v2)
    CudaKernels().scatter(k2, v2, ids.cuda(), 1, 0, out)
    CpuKernels().scatter(want_k, want_v, ids, 1, 0, want)
    for a, b in zip(want_k + want_v, k2 + v2):
        assert torch.equal(_bits(a), _bits(b.cpu()))


def test_copies_run_on_the_callers_stream():
    gen = torch.Generator().manual_seed(4)
    k, v = _pool(gen, 2, 64, 4, 64, torch.float16)
    ids = torch.arange(1, 64, dtype=torch.long, device="cuda")
    out = torch.empty(2, 2, 63, 1, 4, 64, dtype=torch.float16, device="cuda")
    kernels = CudaKernels()
    kernels.gather(k, v, ids, 1, 0, out)  # builds the pointer table (a host-to-device copy, which would wait)
    torch.cuda.synchronize()
    out.zero_()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # keeps the side stream busy: a copy on it must wait
        kernels.gather(k, v, ids, 1, 0, out)
        done = torch.cuda.Event()
        done.record(side)
    assert not done.query(), "the gather ran ahead of work queued earlier on its stream"
    done.synchronize()
    want = torch.stack([torch.stack([k[l][1:], v[l][1:]]) for l in range(2)]).view_as(out)
    assert torch.equal(_bits(want), _bits(out))


@pytest.fixture
def one_rank(tmp_path):
    with one_rank_context(tmp_path, timeout_s=60) as c:
        yield c


@pytest.mark.parametrize("chunk_bytes", [4096, 16 << 20])
def test_migration_between_two_cuda_pools_of_one_gpu(one_rank, chunk_bytes):
    shape = KVShape(num_layers=4, num_kv_heads=8, head_dim=128, page_size=1, dtype=torch.bfloat16)
    old = KVPool.allocate(shape, HeadRange(0, 8), 600, device="cuda")
    new = KVPool.allocate(shape, HeadRange(0, 8), 600, device="cuda")
    gen = torch.Generator().manual_seed(5)
    old.block.copy_(_random_bits(gen, tuple(old.block.shape), torch.bfloat16))
    rng = random.Random(5)
    pages = rng.sample(range(1, 601), 500)
    reqs = [RequestKV("a", tuple(pages[:300]), 300, 0, 0), RequestKV("b", tuple(pages[300:]), 200, 0, 0)]
    old.allocator.take(pages)
    plan = plan_migration(shape, Layout.of((0,)), Layout.of((0,)), reqs)
    res = migrate(one_rank, plan, old, new, chunk_bytes=chunk_bytes)
    torch.cuda.synchronize()
    assert res.bytes_local == plan.bytes_local()
    for r in reqs:
        assert torch.equal(_bits(old.read_pages(list(r.pages))), _bits(new.read_pages(res.pages[r.request_id])))

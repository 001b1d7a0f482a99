// Gather/scatter of selected KV heads of a list of pages, all layers, K and V.
//
// Plain CUDA with no torch headers, so the compile check (and CI) builds it
// in seconds; kv_migrate_binding.cpp wraps it for torch. Layouts match the
// Python contract in python/tiertp/kv/kernels/base.py:
//   pool buffer (one per layer and K|V): [slots, heads, head_dim]
//   staging:                             [layers, 2, n_pages, page_size, head_count, head_dim]
// One "row" is the head_count * head_dim contiguous elements of one token of
// one layer's K or V: the unit both sides agree is contiguous. Copies are
// bytewise (vectorised), so any dtype moves bit-exact.
#include <cstdint>
#include <cuda_runtime.h>

#include "kv_migrate.h"

namespace {

// Enough blocks to fill any current GPU; the grid-stride loops cover the rest.
int64_t blocks_for(int64_t total, int threads) {
  const int64_t need = (total + threads - 1) / threads;
  return need < 65535 ? need : 65535;
}

template <typename Vec, bool kToStaging>
__global__ void copy_heads_kernel(const int64_t* __restrict__ buffer_ptrs,  // 2 * layers: K0, V0, K1, V1, ...
                                  const int64_t* __restrict__ page_ids, int64_t n_pages,
                                  int64_t page_size, int64_t row_stride_vecs,  // heads * head_dim, in Vec
                                  int64_t head_offset_vecs,                    // head_start * head_dim, in Vec
                                  int64_t row_vecs,                            // head_count * head_dim, in Vec
                                  int64_t total_rows, Vec* __restrict__ staging) {
  const int64_t total = total_rows * row_vecs;
  const int64_t rows_per_buffer = n_pages * page_size;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / row_vecs;  // staging row: ((layer * 2 + kv) * n_pages + page_i) * page_size + t
    const int64_t col = i - row * row_vecs;
    const int64_t buffer = row / rows_per_buffer;
    const int64_t in_buffer = row - buffer * rows_per_buffer;
    const int64_t page_i = in_buffer / page_size;
    const int64_t token = in_buffer - page_i * page_size;
    const int64_t slot = page_ids[page_i] * page_size + token;
    Vec* pool = reinterpret_cast<Vec*>(buffer_ptrs[buffer]);
    Vec* p = pool + slot * row_stride_vecs + head_offset_vecs + col;
    if (kToStaging) {
      staging[i] = *p;
    } else {
      *p = staging[i];
    }
  }
}

template <typename Vec>
cudaError_t launch_vec(const KvCopyArgs& a, bool to_staging, cudaStream_t stream) {
  const int64_t v = sizeof(Vec);
  const int64_t row_vecs = a.head_count * a.head_dim * a.elem_size / v;
  const int64_t total_rows = a.num_buffers * a.n_pages * a.page_size;
  const int64_t total = total_rows * row_vecs;
  if (total == 0) return cudaSuccess;
  const int threads = 256;
  const int64_t blocks = blocks_for(total, threads);
  const int64_t stride = a.heads * a.head_dim * a.elem_size / v;
  const int64_t offset = a.head_start * a.head_dim * a.elem_size / v;
  Vec* staging = reinterpret_cast<Vec*>(a.staging);
  if (to_staging) {
    copy_heads_kernel<Vec, true><<<static_cast<unsigned>(blocks), threads, 0, stream>>>(
        a.buffer_ptrs, a.page_ids, a.n_pages, a.page_size, stride, offset, row_vecs, total_rows, staging);
  } else {
    copy_heads_kernel<Vec, false><<<static_cast<unsigned>(blocks), threads, 0, stream>>>(
        a.buffer_ptrs, a.page_ids, a.n_pages, a.page_size, stride, offset, row_vecs, total_rows, staging);
  }
  return cudaGetLastError();
}

// Pool to pool: the same rows as a gather followed by a scatter, read and
// written in one pass (a local move of a TP switch or hand-off).
template <typename Vec>
__global__ void copy_pages_kernel(const int64_t* __restrict__ src_ptrs, const int64_t* __restrict__ dst_ptrs,
                                  const int64_t* __restrict__ src_ids, const int64_t* __restrict__ dst_ids,
                                  int64_t n_pages, int64_t page_size, int64_t src_stride_vecs,
                                  int64_t dst_stride_vecs, int64_t src_offset_vecs, int64_t dst_offset_vecs,
                                  int64_t row_vecs, int64_t total_rows) {
  const int64_t total = total_rows * row_vecs;
  const int64_t rows_per_buffer = n_pages * page_size;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / row_vecs;
    const int64_t col = i - row * row_vecs;
    const int64_t buffer = row / rows_per_buffer;
    const int64_t in_buffer = row - buffer * rows_per_buffer;
    const int64_t page_i = in_buffer / page_size;
    const int64_t token = in_buffer - page_i * page_size;
    const Vec* src = reinterpret_cast<const Vec*>(src_ptrs[buffer]) +
                     (src_ids[page_i] * page_size + token) * src_stride_vecs + src_offset_vecs + col;
    Vec* dst = reinterpret_cast<Vec*>(dst_ptrs[buffer]) +
               (dst_ids[page_i] * page_size + token) * dst_stride_vecs + dst_offset_vecs + col;
    *dst = *src;
  }
}

template <typename Vec>
cudaError_t launch_copy_vec(const KvPoolCopyArgs& a, cudaStream_t stream) {
  const int64_t v = sizeof(Vec);
  const int64_t head_vecs = a.head_dim * a.elem_size / v;
  const int64_t row_vecs = a.head_count * head_vecs;
  const int64_t total_rows = a.num_buffers * a.n_pages * a.page_size;
  if (total_rows * row_vecs == 0) return cudaSuccess;
  const int threads = 256;
  copy_pages_kernel<Vec><<<static_cast<unsigned>(blocks_for(total_rows * row_vecs, threads)), threads, 0, stream>>>(
      a.src_ptrs, a.dst_ptrs, a.src_ids, a.dst_ids, a.n_pages, a.page_size, a.src_heads * head_vecs,
      a.dst_heads * head_vecs, a.src_head_start * head_vecs, a.dst_head_start * head_vecs, row_vecs, total_rows);
  return cudaGetLastError();
}

// The widest vector every address and row length is a multiple of.
template <typename Launch>
cudaError_t widest(int64_t row_bytes, int64_t align, Launch&& go) {
  auto fits = [&](int64_t v) { return row_bytes % v == 0 && align % v == 0; };
  if (fits(16)) return go(uint4{});
  if (fits(8)) return go(uint2{});
  if (fits(4)) return go(uint32_t{});
  if (fits(2)) return go(uint16_t{});
  return go(uint8_t{});
}

cudaError_t launch(const KvCopyArgs& a, bool to_staging, cudaStream_t stream) {
  // pointer_alignment: gcd of all base addresses, from the host
  return widest(a.head_dim * a.elem_size, a.pointer_alignment,
                [&](auto vec) { return launch_vec<decltype(vec)>(a, to_staging, stream); });
}

}  // namespace

cudaError_t kv_gather_heads(const KvCopyArgs& args, cudaStream_t stream) { return launch(args, true, stream); }

cudaError_t kv_scatter_heads(const KvCopyArgs& args, cudaStream_t stream) { return launch(args, false, stream); }

cudaError_t kv_copy_pages(const KvPoolCopyArgs& args, cudaStream_t stream) {
  return widest(args.head_dim * args.elem_size, args.pointer_alignment,
                [&](auto vec) { return launch_copy_vec<decltype(vec)>(args, stream); });
}

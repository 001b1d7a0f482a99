// C interface between the CUDA kernels and the torch binding.
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

struct KvCopyArgs {
  const int64_t* buffer_ptrs;  // device array: addresses of K0, V0, K1, V1, ... (2 * layers)
  int64_t num_buffers;         // 2 * layers
  const int64_t* page_ids;     // device array of n_pages page ids
  int64_t n_pages;
  int64_t page_size;   // tokens per page
  int64_t heads;       // heads held by the pool (its local head count)
  int64_t head_dim;
  int64_t head_start;  // first local head copied
  int64_t head_count;  // heads copied
  int64_t elem_size;   // bytes per element
  int64_t pointer_alignment;  // largest power of two (<= 16) dividing every base address
  void* staging;       // [layers, 2, n_pages, page_size, head_count, head_dim], contiguous
};

// Pool to pool, no staging: heads [src_head_start, +head_count) of pages
// src_ids[i] of every source buffer into heads [dst_head_start, +head_count)
// of pages dst_ids[i] of the matching destination buffer.
struct KvPoolCopyArgs {
  const int64_t* src_ptrs;  // device array: K0, V0, K1, V1, ... of the source pool
  const int64_t* dst_ptrs;  // the same of the destination pool
  int64_t num_buffers;      // 2 * layers
  const int64_t* src_ids;   // device arrays of n_pages page ids each
  const int64_t* dst_ids;
  int64_t n_pages;
  int64_t page_size;
  int64_t src_heads;  // local heads of each pool
  int64_t dst_heads;
  int64_t head_dim;
  int64_t src_head_start;
  int64_t dst_head_start;
  int64_t head_count;
  int64_t elem_size;
  int64_t pointer_alignment;  // largest power of two (<= 16) dividing every base address of both pools
};

cudaError_t kv_gather_heads(const KvCopyArgs& args, cudaStream_t stream);
cudaError_t kv_scatter_heads(const KvCopyArgs& args, cudaStream_t stream);
cudaError_t kv_copy_pages(const KvPoolCopyArgs& args, cudaStream_t stream);

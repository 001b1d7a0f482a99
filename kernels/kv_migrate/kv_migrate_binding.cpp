// torch binding of the KV head gather/scatter kernels (kv_migrate_kernels.cu).
// Argument checks live in Python (tiertp/kv/kernels/base.py check_staging); here
// only what would corrupt memory if wrong is checked again.
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "kv_migrate.h"

namespace {

KvCopyArgs make_args(const torch::Tensor& buffer_ptrs, const torch::Tensor& page_ids, int64_t page_size,
                     int64_t heads, int64_t head_dim, int64_t head_start, int64_t pointer_alignment,
                     const torch::Tensor& staging) {
  TORCH_CHECK(staging.is_cuda() && staging.is_contiguous(), "staging must be a contiguous CUDA tensor");
  TORCH_CHECK(buffer_ptrs.is_cuda() && buffer_ptrs.scalar_type() == torch::kInt64, "buffer_ptrs: CUDA int64");
  TORCH_CHECK(page_ids.is_cuda() && page_ids.scalar_type() == torch::kInt64, "page_ids: CUDA int64");
  TORCH_CHECK(staging.dim() == 6, "staging must be [layers, 2, n, page_size, head_count, head_dim]");
  TORCH_CHECK(buffer_ptrs.numel() == staging.size(0) * 2, "need one K and one V buffer per layer");
  TORCH_CHECK(staging.size(2) == page_ids.numel() && staging.size(3) == page_size, "staging/page mismatch");
  TORCH_CHECK(head_start >= 0 && head_start + staging.size(4) <= heads, "head range outside the pool");
  return KvCopyArgs{
      .buffer_ptrs = buffer_ptrs.data_ptr<int64_t>(), .num_buffers = buffer_ptrs.numel(),
      .page_ids = page_ids.data_ptr<int64_t>(), .n_pages = page_ids.numel(), .page_size = page_size,
      .heads = heads, .head_dim = head_dim, .head_start = head_start, .head_count = staging.size(4),
      .elem_size = staging.element_size(), .pointer_alignment = pointer_alignment, .staging = staging.data_ptr()};
}

void gather(torch::Tensor buffer_ptrs, torch::Tensor page_ids, int64_t page_size, int64_t heads, int64_t head_dim,
            int64_t head_start, int64_t pointer_alignment, torch::Tensor out) {
  const c10::cuda::CUDAGuard guard(out.device());
  auto a = make_args(buffer_ptrs, page_ids, page_size, heads, head_dim, head_start, pointer_alignment, out);
  C10_CUDA_CHECK(kv_gather_heads(a, at::cuda::getCurrentCUDAStream()));
}

void scatter(torch::Tensor buffer_ptrs, torch::Tensor page_ids, int64_t page_size, int64_t heads, int64_t head_dim,
             int64_t head_start, int64_t pointer_alignment, torch::Tensor src) {
  const c10::cuda::CUDAGuard guard(src.device());
  auto a = make_args(buffer_ptrs, page_ids, page_size, heads, head_dim, head_start, pointer_alignment, src);
  C10_CUDA_CHECK(kv_scatter_heads(a, at::cuda::getCurrentCUDAStream()));
}

void copy_pages(torch::Tensor src_ptrs, torch::Tensor dst_ptrs, torch::Tensor src_ids, torch::Tensor dst_ids,
                int64_t page_size, int64_t src_heads, int64_t dst_heads, int64_t head_dim, int64_t src_head_start,
                int64_t dst_head_start, int64_t head_count, int64_t elem_size, int64_t pointer_alignment) {
  for (const auto* t : {&src_ptrs, &dst_ptrs, &src_ids, &dst_ids}) {
    TORCH_CHECK(t->is_cuda() && t->scalar_type() == torch::kInt64 && t->is_contiguous() &&
                    t->device() == src_ptrs.device(),
                "copy_pages: pointer tables and page ids must be contiguous int64 on one CUDA device");
  }
  TORCH_CHECK(src_ptrs.numel() == dst_ptrs.numel(), "copy_pages: the pools differ in buffer count");
  TORCH_CHECK(src_ids.numel() == dst_ids.numel(), "copy_pages: source and destination page counts differ");
  TORCH_CHECK(src_head_start >= 0 && src_head_start + head_count <= src_heads && dst_head_start >= 0 &&
                  dst_head_start + head_count <= dst_heads,
              "copy_pages: head range outside a pool");
  const c10::cuda::CUDAGuard guard(src_ptrs.device());
  const KvPoolCopyArgs a{
      .src_ptrs = src_ptrs.data_ptr<int64_t>(), .dst_ptrs = dst_ptrs.data_ptr<int64_t>(),
      .num_buffers = src_ptrs.numel(),
      .src_ids = src_ids.data_ptr<int64_t>(), .dst_ids = dst_ids.data_ptr<int64_t>(), .n_pages = src_ids.numel(),
      .page_size = page_size, .src_heads = src_heads, .dst_heads = dst_heads, .head_dim = head_dim,
      .src_head_start = src_head_start, .dst_head_start = dst_head_start, .head_count = head_count,
      .elem_size = elem_size, .pointer_alignment = pointer_alignment};
  C10_CUDA_CHECK(kv_copy_pages(a, at::cuda::getCurrentCUDAStream()));
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "tiertp KV migration: gather/scatter selected heads of KV pages (CUDA)";
  m.def("gather", &gather, "pool pages -> staging (on the current CUDA stream)");
  m.def("scatter", &scatter, "staging -> pool pages (on the current CUDA stream)");
  m.def("copy_pages", &copy_pages, "pool pages -> pool pages, no staging (on the current CUDA stream)");
}

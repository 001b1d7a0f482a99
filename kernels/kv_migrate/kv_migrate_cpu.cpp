// CPU twin of kv_migrate_kernels.cu: the same rows, copied with memcpy.
//
// Plain C ABI (no torch headers) so it builds in about a second at first use
// and loads with ctypes; python/tiertp/kv/kernels/cpu.py wraps it in
// the KVKernels interface. Layouts as in kv_migrate.h. When the copied heads
// are all the pool's heads, a page of one layer's K or V is one contiguous
// block and goes in a single memcpy.
#include <cstdint>
#include <cstring>

namespace {

template <bool kToStaging>
void copy_heads(const int64_t* buffer_ptrs, int64_t num_buffers, const int64_t* page_ids, int64_t n_pages,
                int64_t page_size, int64_t heads, int64_t head_dim, int64_t head_start, int64_t head_count,
                int64_t elem_size, char* staging) {
  const int64_t head_bytes = head_dim * elem_size;
  const int64_t row = head_count * head_bytes;   // bytes per token in staging
  const int64_t stride = heads * head_bytes;     // bytes per token in the pool
  const bool whole_page = head_count == heads;   // page is contiguous in the pool
  char* out = staging;
  for (int64_t b = 0; b < num_buffers; ++b) {
    char* base = reinterpret_cast<char*>(buffer_ptrs[b]) + head_start * head_bytes;
    for (int64_t i = 0; i < n_pages; ++i) {
      char* page = base + page_ids[i] * page_size * stride;
      if (whole_page) {
        if (kToStaging) std::memcpy(out, page, page_size * row);
        else std::memcpy(page, out, page_size * row);
        out += page_size * row;
        continue;
      }
      for (int64_t t = 0; t < page_size; ++t, out += row) {
        if (kToStaging) std::memcpy(out, page + t * stride, row);
        else std::memcpy(page + t * stride, out, row);
      }
    }
  }
}

}  // namespace

extern "C" {

void tiertp_kv_gather(const int64_t* buffer_ptrs, int64_t num_buffers, const int64_t* page_ids, int64_t n_pages,
                      int64_t page_size, int64_t heads, int64_t head_dim, int64_t head_start, int64_t head_count,
                      int64_t elem_size, void* staging) {
  copy_heads<true>(buffer_ptrs, num_buffers, page_ids, n_pages, page_size, heads, head_dim, head_start, head_count,
                   elem_size, static_cast<char*>(staging));
}

void tiertp_kv_scatter(const int64_t* buffer_ptrs, int64_t num_buffers, const int64_t* page_ids, int64_t n_pages,
                       int64_t page_size, int64_t heads, int64_t head_dim, int64_t head_start, int64_t head_count,
                       int64_t elem_size, void* staging) {
  copy_heads<false>(buffer_ptrs, num_buffers, page_ids, n_pages, page_size, heads, head_dim, head_start, head_count,
                    elem_size, static_cast<char*>(staging));
}

}  // extern "C"

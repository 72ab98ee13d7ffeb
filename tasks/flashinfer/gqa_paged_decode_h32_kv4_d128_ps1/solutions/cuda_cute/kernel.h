// GQA paged decode (32 query heads, 4 KV heads, head dim 128, page size 1): launcher shared by
// kernel.cu (the CUDA side, CuTe views) and main.cpp (the torch binding). Plain pointers only, so
// main.cpp needs no CUDA device headers and kernel.cu no torch headers.
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

namespace gqa {

constexpr int kQoHeads = 32;
constexpr int kKvHeads = 4;
constexpr int kHeadDim = 128;

// q, out: [batch, 32, 128] bf16; k_cache, v_cache: [num_pages, 1, 4, 128] bf16; lse: [batch, 32]
// fp32; kv_indptr: [batch + 1] int32 and kv_indices int32, both on the device. All contiguous.
cudaError_t launch_decode(const void* q, const void* k_cache, const void* v_cache, const int32_t* kv_indptr,
                          const int32_t* kv_indices, void* out, float* lse, int batch, int num_pages,
                          float sm_scale, cudaStream_t stream);

}  // namespace gqa

// GQA paged decode with CuTe views: one thread block per (request, KV head), split-free.
//
// The block holds the 8 query heads of its group in shared memory (pre-scaled by
// sm_scale * log2 e, so the softmax runs in base 2 and the lse comes out in base 2) and walks
// the request's page list in tiles of kTileN tokens:
//   1. logits: each warp takes tokens of the tile; its 32 lanes read one 256-byte K row (4 bf16
//      each) and reduce the 8 dot products with shuffles;
//   2. online softmax: one thread per head rescales its running max and sum and turns the
//      tile's logits into probabilities in place;
//   3. P·V: thread d owns output column d of all 8 heads and accumulates p * V[token, d] in fp32
//      (V rows are read coalesced, 256 bytes per token).
// Everything is fp32 after the bf16 loads, so the only rounding is the final bf16 store. An empty
// request writes 0 and lse -inf. There is no split over the sequence: a long single request runs
// on only 4 blocks, the first thing a faster kernel would change.
//
// The tunables below (tokens per tile, the occupancy hint of __launch_bounds__) are read and
// rewritten by the offline policy; every choice computes the same result.
#include "kernel.h"

#include <cuda_bf16.h>

#include <cmath>
#include <cute/tensor.hpp>

namespace gqa {
namespace {

using namespace cute;

constexpr int kGroup = kQoHeads / kKvHeads;  // query heads per KV head
constexpr int kThreads = kHeadDim;           // thread d owns output column d
constexpr int kWarps = kThreads / 32;
constexpr int kTileN = 32;  // tunable: [8, 16, 32, 64, 128]
constexpr int kMinBlocksPerSm = 1;  // tunable: [1, 2, 4]
constexpr int kLaneElems = kHeadDim / 32;    // K elements per lane in the logit step
constexpr float kLog2e = 1.4426950408889634f;

static_assert(kHeadDim == 128 && kLaneElems == 4, "one 8-byte load per lane covers a 128-wide K row");
static_assert(kGroup <= 32 && kTileN <= kThreads, "one softmax thread per head, one page id per thread");

__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
decode_kernel(const __nv_bfloat16* __restrict__ q_ptr, const __nv_bfloat16* __restrict__ k_ptr,
              const __nv_bfloat16* __restrict__ v_ptr, const int32_t* __restrict__ kv_indptr,
              const int32_t* __restrict__ kv_indices, __nv_bfloat16* __restrict__ out_ptr,
              float* __restrict__ lse_ptr, int batch, int num_pages, float qk_scale) {
  const int b = blockIdx.x;
  const int kvh = blockIdx.y;
  const int tid = threadIdx.x;
  const int lane = tid % 32;
  const int warp = tid / 32;

  // Global views: q and out [batch, 32, 128], the caches [pages, 4, 128] (page size 1), lse [batch, 32].
  auto row_major3 = [](auto n) { return make_layout(make_shape(n, Int<kQoHeads>{}, Int<kHeadDim>{}), LayoutRight{}); };
  auto cache_layout = make_layout(make_shape(num_pages, Int<kKvHeads>{}, Int<kHeadDim>{}), LayoutRight{});
  Tensor gQ = make_tensor(make_gmem_ptr(q_ptr), row_major3(batch));
  Tensor gO = make_tensor(make_gmem_ptr(out_ptr), row_major3(batch));
  Tensor gK = make_tensor(make_gmem_ptr(k_ptr), cache_layout);
  Tensor gV = make_tensor(make_gmem_ptr(v_ptr), cache_layout);
  Tensor gLse = make_tensor(make_gmem_ptr(lse_ptr), make_layout(make_shape(batch, Int<kQoHeads>{}), LayoutRight{}));

  __shared__ float q_smem[kGroup * kHeadDim];
  __shared__ float s_smem[kGroup * kTileN];  // a tile's logits, then its probabilities
  __shared__ int page_smem[kTileN];
  __shared__ float m_smem[kGroup];            // running max (log2 units)
  __shared__ float l_smem[kGroup];            // running sum of 2^(logit - max)
  __shared__ float alpha_smem[kGroup];        // this tile's rescale factor
  Tensor sQ = make_tensor(make_smem_ptr(q_smem), make_layout(make_shape(Int<kGroup>{}, Int<kHeadDim>{}), LayoutRight{}));
  Tensor sS = make_tensor(make_smem_ptr(s_smem), make_layout(make_shape(Int<kGroup>{}, Int<kTileN>{}), LayoutRight{}));

  for (int g = 0; g < kGroup; ++g) {
    sQ(g, tid) = __bfloat162float(gQ(b, kvh * kGroup + g, tid)) * qk_scale;
  }
  if (tid < kGroup) {
    m_smem[tid] = -INFINITY;
    l_smem[tid] = 0.f;
  }
  float acc[kGroup];
  for (int g = 0; g < kGroup; ++g) acc[g] = 0.f;

  const int start = kv_indptr[b];
  const int end = kv_indptr[b + 1];
  __syncthreads();

  for (int tile = start; tile < end; tile += kTileN) {
    const int n = min(kTileN, end - tile);
    if (tid < n) page_smem[tid] = kv_indices[tile + tid];
    __syncthreads();

    // 1. Logits of the tile's tokens, one warp per token at a time (j is uniform across a warp).
    for (int j = warp; j < kTileN; j += kWarps) {
      if (j < n) {
        const __nv_bfloat162* k2 =
            reinterpret_cast<const __nv_bfloat162*>(&gK(page_smem[j], kvh, lane * kLaneElems));
        const float2 k01 = __bfloat1622float2(k2[0]);
        const float2 k23 = __bfloat1622float2(k2[1]);
        float part[kGroup];
        for (int g = 0; g < kGroup; ++g) {
          const int d = lane * kLaneElems;
          part[g] = sQ(g, d) * k01.x + sQ(g, d + 1) * k01.y + sQ(g, d + 2) * k23.x + sQ(g, d + 3) * k23.y;
        }
        for (int offset = 16; offset > 0; offset >>= 1) {
          for (int g = 0; g < kGroup; ++g) part[g] += __shfl_xor_sync(0xffffffffu, part[g], offset);
        }
        if (lane < kGroup) {
          float mine = part[0];  // lane g stores head g; indexed through a loop to stay in registers
          for (int g = 1; g < kGroup; ++g) mine = (lane == g) ? part[g] : mine;
          sS(lane, j) = mine;
        }
      } else if (lane < kGroup) {
        sS(lane, j) = -INFINITY;
      }
    }
    __syncthreads();

    // 2. Online softmax, one thread per head.
    if (tid < kGroup) {
      const float m_old = m_smem[tid];
      float m_new = m_old;
      for (int j = 0; j < kTileN; ++j) m_new = fmaxf(m_new, sS(tid, j));
      const float alpha = exp2f(m_old - m_new);  // 0 on the first tile (m_old = -inf)
      float sum = 0.f;
      for (int j = 0; j < kTileN; ++j) {
        const float p = exp2f(sS(tid, j) - m_new);  // 0 for the padding (-inf)
        sS(tid, j) = p;
        sum += p;
      }
      m_smem[tid] = m_new;
      l_smem[tid] = l_smem[tid] * alpha + sum;
      alpha_smem[tid] = alpha;
    }
    __syncthreads();

    // 3. P·V: thread tid owns column tid of every head.
    for (int g = 0; g < kGroup; ++g) acc[g] *= alpha_smem[g];
    for (int j = 0; j < n; ++j) {
      const float v = __bfloat162float(gV(page_smem[j], kvh, tid));
      for (int g = 0; g < kGroup; ++g) acc[g] += sS(g, j) * v;
    }
    __syncthreads();  // the next tile overwrites page_smem and s_smem
  }

  for (int g = 0; g < kGroup; ++g) {
    const float l = l_smem[g];
    gO(b, kvh * kGroup + g, tid) = __float2bfloat16(l > 0.f ? acc[g] / l : 0.f);
  }
  if (tid < kGroup) {
    const float l = l_smem[tid];
    gLse(b, kvh * kGroup + tid) = l > 0.f ? m_smem[tid] + log2f(l) : -INFINITY;
  }
}

}  // namespace

cudaError_t launch_decode(const void* q, const void* k_cache, const void* v_cache, const int32_t* kv_indptr,
                          const int32_t* kv_indices, void* out, float* lse, int batch, int num_pages,
                          float sm_scale, cudaStream_t stream) {
  if (batch == 0) return cudaSuccess;
  const dim3 grid(batch, kKvHeads);
  decode_kernel<<<grid, kThreads, 0, stream>>>(
      static_cast<const __nv_bfloat16*>(q), static_cast<const __nv_bfloat16*>(k_cache),
      static_cast<const __nv_bfloat16*>(v_cache), kv_indptr, kv_indices, static_cast<__nv_bfloat16*>(out), lse,
      batch, num_pages, sm_scale * kLog2e);
  return cudaGetLastError();
}

}  // namespace gqa

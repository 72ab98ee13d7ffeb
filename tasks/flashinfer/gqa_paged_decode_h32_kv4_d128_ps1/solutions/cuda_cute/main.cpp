// Torch binding of the CuTe GQA decode kernel: run(q, k_cache, v_cache, kv_indptr, kv_indices,
// sm_scale) -> (output, lse), FlashInfer-Bench's value-returning convention.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include <tuple>

#include "kernel.h"

namespace {

void check_cuda(const torch::Tensor& t, const char* name, at::ScalarType dtype) {
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor");
  TORCH_CHECK(t.scalar_type() == dtype, name, " must be ", dtype, ", got ", t.scalar_type());
}

}  // namespace

std::tuple<torch::Tensor, torch::Tensor> run(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                                             torch::Tensor kv_indptr, torch::Tensor kv_indices, double sm_scale) {
  check_cuda(q, "q", at::kBFloat16);
  check_cuda(k_cache, "k_cache", at::kBFloat16);
  check_cuda(v_cache, "v_cache", at::kBFloat16);
  check_cuda(kv_indptr, "kv_indptr", at::kInt);
  check_cuda(kv_indices, "kv_indices", at::kInt);
  TORCH_CHECK(q.dim() == 3 && q.size(1) == gqa::kQoHeads && q.size(2) == gqa::kHeadDim, "q must be [B, 32, 128]");
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.size(1) == 1 && k_cache.size(2) == gqa::kKvHeads &&
                  k_cache.size(3) == gqa::kHeadDim,
              "k_cache must be [pages, 1, 4, 128] (page size 1)");
  TORCH_CHECK(v_cache.sizes() == k_cache.sizes(), "v_cache must have k_cache's shape");
  TORCH_CHECK(kv_indptr.dim() == 1 && kv_indptr.size(0) == q.size(0) + 1, "kv_indptr must be [B + 1]");

  const c10::cuda::OptionalCUDAGuard guard(q.device());
  const auto qc = q.contiguous();
  const auto kc = k_cache.contiguous();
  const auto vc = v_cache.contiguous();
  const auto indptr = kv_indptr.contiguous();
  const auto indices = kv_indices.contiguous();
  auto out = torch::empty_like(qc);
  auto lse = torch::empty({q.size(0), gqa::kQoHeads}, q.options().dtype(at::kFloat));
  const cudaError_t err = gqa::launch_decode(
      qc.data_ptr(), kc.data_ptr(), vc.data_ptr(), indptr.data_ptr<int32_t>(), indices.data_ptr<int32_t>(),
      out.data_ptr(), lse.data_ptr<float>(), static_cast<int>(q.size(0)), static_cast<int>(kc.size(0)),
      static_cast<float>(sm_scale), c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == cudaSuccess, "gqa decode kernel launch failed: ", cudaGetErrorString(err));
  return {out, lse};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("run", &run, "GQA paged decode (h32/kv4/d128, page size 1) -> (output, lse)");
}

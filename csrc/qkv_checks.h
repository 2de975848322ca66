// Agreement of q, k (N, H, L, E) and v (N, H, L, M): shared by the CPU and CUDA sources,
// whose own checks add the device and the dtypes each supports.
#pragma once
#include <ATen/core/Tensor.h>

inline void check_qkv_shapes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
              "causal_product: expected 4-d q, k (N, H, L, E) and v (N, H, L, M)");
  TORCH_CHECK(q.sizes() == k.sizes(), "causal_product: q and k must have the same shape (N, H, L, E)");
  TORCH_CHECK(v.size(0) == q.size(0) && v.size(1) == q.size(1) && v.size(2) == q.size(2),
              "causal_product: v must share (N, H, L) with q");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type(),
              "causal_product: q, k, v must share one dtype");
}

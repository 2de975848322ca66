// The sampler's draw of one byte per image on the CPU (imagegen.model.heads: LogisticMixture.probs and
// sample, whose PyTorch forms are the references):
// - mixture_probs: the discretized logistic mixture's probabilities over the 256 byte values, one row of
//   parameters at a time. Params (N, 3K) float32: K mixture logits, K means, K log-scales (clamped at -7);
// with w = softmax(logits) and s_k = exp(-log_scale_k), the mixture's CDF at the 255 inner bin edges
// e_i = (i + 0.5) / 127.5 - 1 is C(e) = sum_k w_k sigmoid((e - mean_k) s_k), and p (N, 256) its
// differences with C = 0 below value 0 and 1 above 255 (PixelCNN++'s edges). PyTorch built a (N, K, 255)
// tensor and ran five ops over it, about a tenth of an int8 decoding step at 64 images (paper_mnist);
// here the edges are vector lanes and the K components a loop over registers.
// - guided_probs: classifier-free guidance over two rows of probabilities, as heads.guided_probs: the softmax of
//   log p_c + (G - 1) (log p_c - log p_u) (the log-ratio clamped to [-bound, bound] for G > 1), logs taken of
//   p clamped at float32's smallest normal; its ten PyTorch ops over (N, 256) were 15% of cifar10-linear's int8
//   step at 64 guided images.
// - inverse_cdf: the byte that a uniform u draws from each row of probabilities, as sample's cumsum and
//   searchsorted (their ops' fixed costs were a tenth of the int8 step at one image).

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include "cpu_kernel.h"
#include "vec.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

namespace {

constexpr int kValues = 256;                 // 255 inner edges, padded to whole vectors
constexpr float kMinLogScale = -7.0f;

// the inner bin edges as the reference makes them in float32: (i + 0.5) / 127.5 - 1
const std::array<float, kValues> kEdges = [] {
  std::array<float, kValues> e{};
  for (int i = 0; i < kValues; ++i) e[i] = (static_cast<float>(i) + 0.5f) / 127.5f - 1.0f;
  return e;
}();

// sigmoid(z) = 1 / (1 + t) for z >= 0, t / (1 + t) below, with t = exp(-|z|) <= 1: no overflow, and the
// lower tail keeps its relative precision (down to exp_nonpositive's floor near 1.6e-38)
inline __attribute__((always_inline)) svec_t<float> sigmoid_vec(svec_t<float> z) {
  using V = svec_t<float>;
  const V t = exp_nonpositive(z < 0.0f ? z : -z);
  const V d = t + 1.0f;                        // in [1, 2]
#if CP_SWEEP_BYTES == 64 && defined(__AVX512F__)  // 1 / d: a 14-bit estimate and one Newton step, not a division
  const V r = (V)_mm512_rcp14_ps((__m512)d);
  const V s = r * (2.0f - d * r);
#else
  const V s = (V{} + 1.0f) / d;
#endif
  return z < 0.0f ? t * s : s;
}

// rows [n0, n1) of params (N, 3K) -> p (N, 256)
CP_MULTIVERSION void mixture_rows(const float* params, float* probs, int64_t K, int64_t n0, int64_t n1) {
  using V = svec_t<float>;
  constexpr int64_t L = kSweep<float>;
  std::vector<float> w(K), inv_s(K);
  alignas(64) float cdf[kValues];
  for (int64_t n = n0; n < n1; ++n) {
    const float* logits = params + n * 3 * K;
    const float* means = logits + K;
    const float* log_scales = means + K;
    const float top = *std::max_element(logits, logits + K);
    float total = 0.0f;
    for (int64_t k = 0; k < K; ++k) total += w[k] = std::exp(logits[k] - top);
    for (int64_t k = 0; k < K; ++k) {
      w[k] /= total;
      inv_s[k] = std::exp(-std::max(log_scales[k], kMinLogScale));
    }
    for (int64_t i = 0; i < kValues; i += L) {
      const V edge = sload(kEdges.data() + i);
      V acc{};
      for (int64_t k = 0; k < K; ++k) acc += w[k] * sigmoid_vec((edge - means[k]) * inv_s[k]);
      sstore(cdf + i, acc);
    }
    float* p = probs + n * kValues;
    p[0] = cdf[0];
    for (int i = 1; i < kValues - 1; ++i) p[i] = cdf[i] - cdf[i - 1];
    p[kValues - 1] = 1.0f - cdf[kValues - 2];
  }
}

// The first i with cdf[i] >= u * cdf[255], at most 255, for cdf the running sums of one row p[0, 256) summed
// in float64 and rounded to float32 as torch's CPU cumsum does, and u * cdf[255] rounded to float32.
CP_MULTIVERSION void inverse_cdf_rows(const float* probs, const float* u, uint8_t* out, int64_t n0, int64_t n1) {
  float cdf[kValues];
  for (int64_t n = n0; n < n1; ++n) {
    const float* p = probs + n * kValues;
    double sum = 0.0;
    for (int i = 0; i < kValues; ++i) cdf[i] = static_cast<float>(sum += p[i]);
    const float target = u[n] * cdf[kValues - 1];
    out[n] = static_cast<uint8_t>(std::min<int64_t>(std::lower_bound(cdf, cdf + kValues, target) - cdf, kValues - 1));
  }
}

// rows [n0, n1) of p_c, p_u (N, 256) -> the guided probabilities (N, 256)
CP_MULTIVERSION void guided_rows(const float* pc, const float* pu, float* out, float guidance, float bound, int64_t n0,
                                 int64_t n1) {
  using V = svec_t<float>;
  constexpr int64_t L = kSweep<float>;
  constexpr float kTiny = 1.17549435e-38f;     // float32's smallest normal: torch.finfo(float32).tiny
  alignas(64) float z[kValues];
  for (int64_t n = n0; n < n1; ++n) {
    const float *c = pc + n * kValues, *u = pu + n * kValues;
    V top = V{} - __builtin_inff();
    for (int64_t i = 0; i < kValues; i += L) {
      const V c_i = sload(c + i), u_i = sload(u + i);
      const V log_c = log_normal(c_i < kTiny ? V{} + kTiny : c_i);
      V ratio = log_c - log_normal(u_i < kTiny ? V{} + kTiny : u_i);
      ratio = ratio < -bound ? V{} - bound : (ratio > bound ? V{} + bound : ratio);
      const V z_i = log_c + (guidance - 1.0f) * ratio;
      sstore(z + i, z_i);
      top = z_i > top ? z_i : top;
    }
    float m = top[0];
    for (int64_t j = 1; j < L; ++j) m = std::max(m, top[j]);
    V total{};
    float* o = out + n * kValues;
    for (int64_t i = 0; i < kValues; i += L) {
      const V e = exp_nonpositive(sload(z + i) - m);
      sstore(o + i, e);
      total += e;
    }
    const float inv = 1.0f / hsum<float>(total);
    for (int64_t i = 0; i < kValues; i += L) sstore(o + i, sload(o + i) * inv);
  }
}

}  // namespace

at::Tensor mixture_probs(const at::Tensor& params) {
  TORCH_CHECK(params.dim() == 2 && params.size(1) % 3 == 0 && params.size(1) > 0 &&
                  params.scalar_type() == at::kFloat && params.is_contiguous() && params.device().is_cpu(),
              "mixture_probs: params must be a contiguous float32 CPU tensor (N, 3K)");
  const int64_t N = params.size(0), K = params.size(1) / 3;
  auto probs = at::empty({N, kValues}, params.options());
  const float* pp = params.data_ptr<float>();
  float* out = probs.data_ptr<float>();
  at::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) { mixture_rows(pp, out, K, n0, n1); });
  return probs;
}

at::Tensor inverse_cdf(const at::Tensor& probs, const at::Tensor& u) {
  TORCH_CHECK(probs.dim() == 2 && probs.size(1) == kValues && probs.scalar_type() == at::kFloat &&
                  probs.is_contiguous() && u.scalar_type() == at::kFloat && u.is_contiguous() &&
                  u.numel() == probs.size(0) && probs.device().is_cpu() && u.device().is_cpu(),
              "inverse_cdf: probs must be a contiguous float32 CPU tensor (N, 256) and u N contiguous float32 values");
  const int64_t N = probs.size(0);
  auto out = at::empty({N}, probs.options().dtype(at::kByte));
  const float *pp = probs.data_ptr<float>(), *up = u.data_ptr<float>();
  uint8_t* op = out.data_ptr<uint8_t>();
  at::parallel_for(0, N, 64, [&](int64_t n0, int64_t n1) { inverse_cdf_rows(pp, up, op, n0, n1); });
  return out;
}

at::Tensor guided_probs(const at::Tensor& pc, const at::Tensor& pu, double guidance, double bound) {
  for (const auto& p : {pc, pu})
    TORCH_CHECK(p.dim() == 2 && p.size(1) == kValues && p.scalar_type() == at::kFloat && p.is_contiguous() &&
                    p.device().is_cpu() && p.size(0) == pc.size(0),
                "guided_probs: p_c and p_u must be contiguous float32 CPU tensors (N, 256) of one shape");
  const int64_t N = pc.size(0);
  auto out = at::empty({N, kValues}, pc.options());
  const float *cp = pc.data_ptr<float>(), *up = pu.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float g = static_cast<float>(guidance), b = guidance > 1 ? static_cast<float>(bound) : __builtin_inff();
  at::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) { guided_rows(cp, up, op, g, b, n0, n1); });
  return out;
}

// Causal product (the numerator) on the CPU, forward and backward, as in Algorithm 1 of
// "Transformers are RNNs" (Katharopoulos et al. 2020).
//
// Shapes: q, k (N, H, L, E) feature-mapped; v (N, H, L, M); out (N, H, L, M).
// Everything is one recurrent primitive, the causal dot of one (n, h) pair,
//     out_t = sum_{j<=t} (a_t . b_j) c_j   (reverse: j >= t),   a, b (L, D); c, out (L, C),
// which carries the D x C state S = sum_j b_j c_j^T through time and reads out_t = S^T a_t:
//   forward   out    = causal_dot(q, k, v)           S  = sum_{j<=t} k_j v_j^T   (E x M)
//   backward  grad_q = causal_dot(g, v, k)           S  = sum_{j<=t} v_j k_j^T   forward sweep
//             grad_v = the reverse dot (k, q, g)     S' = sum_{j>=t} q_j g_j^T   one reverse sweep
//             grad_k = the reverse dot (v, g, q)     S'^T                        for both (reverse_grads)
// (grad_q_t = S_t g_t, grad_k_t = S'_t v_t, grad_v_t = S'_t^T k_t; keeping S'^T for grad_k
// turns its read-out into row accumulations like the others, with no horizontal sums.)
// Parallel over N * H; memory O(L (E + M)) plus one state per thread, never L x E x M.
// The state's columns are zero-padded to a multiple of one 64-byte SIMD vector (16 floats or 8
// doubles) and processed in blocks of one (AVX-512) or half of one (AVX2 and older: see
// CP_SWEEP_BYTES in vec.h, whose update_and_read is the sweep), the output block accumulating
// in a register over D.

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>

#include "cpu_kernel.h"
#include "vec.h"

#include <algorithm>
#include <cstdint>
#include <tuple>
#include <vector>

namespace {

// Scratch for causal_dot_head: the state (D, padded C), kSteps padded rows of c and of out.
template <typename T>
int64_t scratch_size(int64_t D, int64_t C) { return (D + 2 * kSteps) * padded<T>(C); }

// out_t = sum_{j<=t} (a_t . b_j) c_j for one (n, h) pair, kSteps steps per pass over the state.
// a, b (L, D); c, out (L, C); work: scratch_size<T>(D, C) values. stream: write out with stream_row
// (the backward's gradients).
template <typename T, int64_t K>
inline __attribute__((always_inline)) void causal_dot_head(
    const T* __restrict__ a, const T* __restrict__ b, const T* __restrict__ c, T* __restrict__ out,
    T* __restrict__ work, int64_t L, int64_t D_, int64_t C_, bool stream) {
  const int64_t D = K ? K : D_, C = K ? K : C_;  // K: D = C known when compiled (vec.h's kHeadDim)
  const int64_t Cp = padded<T>(C);
  T* S = work;                    // (D, Cp) state; the padding columns stay zero
  T* c_rows = S + D * Cp;         // (kSteps, Cp) c_t, zero-padded
  T* o_rows = c_rows + kSteps * Cp;  // (kSteps, Cp) out_t before trimming to C
  std::fill(work, work + scratch_size<T>(D, C), T(0));
  const T *a_s[kSteps], *b_s[kSteps], *c_s[kSteps];
  T *o_s[kSteps], *out_s[kSteps];
  for (int64_t s0 = 0; s0 < L; s0 += kSteps) {
    const int n = static_cast<int>(smaller(kSteps, L - s0));
    for (int s = 0; s < n; ++s) {
      const int64_t t = s0 + s;
      a_s[s] = a + t * D, b_s[s] = b + t * D, c_s[s] = c_rows + s * Cp, o_s[s] = o_rows + s * Cp;
      out_s[s] = out + t * C;
      copy_row(c + t * C, c_rows + s * Cp, C);
    }
    update_and_read(S, b_s, c_s, a_s, o_s, n, D, Cp);
    for (int s = 0; s < n; ++s) {
      if (stream) stream_row(o_s[s], out_s[s], C);
      else copy_row(o_s[s], out_s[s], C);
    }
  }
  if (stream) stream_fence();
}

// grad_v and grad_k of one (n, h) pair in one reverse sweep (two sweeps, one each, read the rows twice:
// docs/notes/code-measurements.md): the states S' = sum_{j>=t} q_j g_j^T (E, Mp) and S'^T (M, Ep) advanced from the same
// kSteps rows at a time, grad_v_t = S'_t^T k_t, grad_k_t = S'_t v_t, both streamed out. q, k (L, E);
// v, g (L, M); work: reverse_scratch<T>(E, M) values.
template <typename T>
int64_t reverse_scratch(int64_t E, int64_t M) { return (E + 2 * kSteps) * padded<T>(M) + (M + 2 * kSteps) * padded<T>(E); }

template <typename T, int64_t D>
inline __attribute__((always_inline)) void reverse_grads_head(const T* __restrict__ q, const T* __restrict__ k,
                                                              const T* __restrict__ v, const T* __restrict__ g,
                                                              T* __restrict__ gk, T* __restrict__ gv,
                                                              T* __restrict__ work, int64_t L, int64_t E_, int64_t M_) {
  const int64_t E = D ? D : E_, M = D ? D : M_;  // D: E = M known when compiled
  const int64_t Ep = padded<T>(E), Mp = padded<T>(M);
  T *S = work, *St = S + E * Mp;                               // S' (E, Mp), S'^T (M, Ep)
  T *g_rows = St + M * Ep, *gv_rows = g_rows + kSteps * Mp;     // (kSteps, Mp) each: g_t, grad_v_t
  T *q_rows = gv_rows + kSteps * Mp, *gk_rows = q_rows + kSteps * Ep;  // (kSteps, Ep) each: q_t, grad_k_t
  std::fill(work, work + reverse_scratch<T>(E, M), T(0));
  const T *q_s[kSteps], *k_s[kSteps], *v_s[kSteps], *g_s[kSteps], *qp_s[kSteps], *gp_s[kSteps];
  T *gv_s[kSteps], *gk_s[kSteps];
  for (int64_t s0 = 0; s0 < L; s0 += kSteps) {
    const int n = static_cast<int>(smaller(kSteps, L - s0));
    for (int s = 0; s < n; ++s) {
      const int64_t t = L - 1 - (s0 + s);
      q_s[s] = q + t * E, k_s[s] = k + t * E, v_s[s] = v + t * M, g_s[s] = g + t * M;
      qp_s[s] = q_rows + s * Ep, gp_s[s] = g_rows + s * Mp, gv_s[s] = gv_rows + s * Mp, gk_s[s] = gk_rows + s * Ep;
      copy_row(g_s[s], g_rows + s * Mp, M);
      copy_row(q_s[s], q_rows + s * Ep, E);
    }
    update_and_read(S, q_s, gp_s, k_s, gv_s, n, E, Mp);   // S' += q_t g_t^T; grad_v_t = S'^T k_t
    update_and_read(St, g_s, qp_s, v_s, gk_s, n, M, Ep);  // S'^T += g_t q_t^T; grad_k_t = S' v_t
    for (int s = 0; s < n; ++s) {
      const int64_t t = L - 1 - (s0 + s);
      stream_row(gv_s[s], gv + t * M, M);
      stream_row(gk_s[s], gk + t * E, E);
    }
  }
  stream_fence();
}

CP_MULTIVERSION void reverse_grads_f32(const float* q, const float* k, const float* v, const float* g, float* gk,
                                       float* gv, float* work, int64_t L, int64_t E, int64_t M) {
  if (E == kHeadDim && M == kHeadDim) reverse_grads_head<float, kHeadDim>(q, k, v, g, gk, gv, work, L, E, M);
  else reverse_grads_head<float, 0>(q, k, v, g, gk, gv, work, L, E, M);
}
CP_MULTIVERSION void reverse_grads_f64(const double* q, const double* k, const double* v, const double* g, double* gk,
                                       double* gv, double* work, int64_t L, int64_t E, int64_t M) {
  reverse_grads_head<double, 0>(q, k, v, g, gk, gv, work, L, E, M);
}

CP_MULTIVERSION void causal_dot_f32(const float* a, const float* b, const float* c, float* out, float* work,
                                    int64_t L, int64_t D, int64_t C, bool stream) {
  if (D == kHeadDim && C == kHeadDim) causal_dot_head<float, kHeadDim>(a, b, c, out, work, L, D, C, stream);
  else causal_dot_head<float, 0>(a, b, c, out, work, L, D, C, stream);
}
CP_MULTIVERSION void causal_dot_f64(const double* a, const double* b, const double* c, double* out, double* work,
                                    int64_t L, int64_t D, int64_t C, bool stream) {
  causal_dot_head<double, 0>(a, b, c, out, work, L, D, C, stream);
}

template <typename T>
void causal_dot(const T* a, const T* b, const T* c, T* out, T* work, int64_t L, int64_t D, int64_t C,
                bool stream = false) {
  if constexpr (std::is_same_v<T, float>) causal_dot_f32(a, b, c, out, work, L, D, C, stream);
  else causal_dot_f64(a, b, c, out, work, L, D, C, stream);
}

template <typename T>
void reverse_grads(const T* q, const T* k, const T* v, const T* g, T* gk, T* gv, T* work, int64_t L, int64_t E,
                   int64_t M) {
  if constexpr (std::is_same_v<T, float>) reverse_grads_f32(q, k, v, g, gk, gv, work, L, E, M);
  else reverse_grads_f64(q, k, v, g, gk, gv, work, L, E, M);
}
}  // namespace

// q, k (N, H, L, E), v (N, H, L, M) -> out (N, H, L, M). bfloat16 (no sweep of its own here,
// unlike the fused attention): computed in float32 and rounded back.
at::Tensor causal_product_forward(at::Tensor q, at::Tensor k, at::Tensor v) {
  check_inputs(q, k, v);
  if (q.scalar_type() == at::kBFloat16)
    return causal_product_forward(q.to(at::kFloat), k.to(at::kFloat), v.to(at::kFloat)).to(at::kBFloat16);
  q = q.contiguous(); k = k.contiguous(); v = v.contiguous();
  const int64_t BH = q.size(0) * q.size(1), L = q.size(2), E = q.size(3), M = v.size(3);
  auto out = at::empty_like(v);
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "causal_product_forward", [&] {
    const scalar_t *qp = q.data_ptr<scalar_t>(), *kp = k.data_ptr<scalar_t>(), *vp = v.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    at::parallel_for(0, BH, 1, [&](int64_t begin, int64_t end) {
      Scratch<scalar_t> work(scratch_size<scalar_t>(E, M));
      for (int64_t i = begin; i < end; ++i)
        causal_dot(qp + i * L * E, kp + i * L * E, vp + i * L * M, op + i * L * M, work.data(), L, E, M);
    });
  });
  return out;
}

// q, k (N, H, L, E), v, grad_out (N, H, L, M) -> (grad_q, grad_k, grad_v)
std::tuple<at::Tensor, at::Tensor, at::Tensor> causal_product_backward(
    at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor grad_out) {
  check_inputs(q, k, v);
  TORCH_CHECK(grad_out.sizes() == v.sizes() && grad_out.scalar_type() == v.scalar_type(),
              "causal_product backward: grad_out must match v in shape and dtype");
  if (q.scalar_type() == at::kBFloat16) {
    auto [gq, gk, gv] = causal_product_backward(q.to(at::kFloat), k.to(at::kFloat), v.to(at::kFloat),
                                                grad_out.to(at::kFloat));
    return {gq.to(at::kBFloat16), gk.to(at::kBFloat16), gv.to(at::kBFloat16)};
  }
  q = q.contiguous(); k = k.contiguous(); v = v.contiguous();
  auto g = grad_out.contiguous();
  const int64_t BH = q.size(0) * q.size(1), L = q.size(2), E = q.size(3), M = v.size(3);
  auto gq = at::empty_like(q), gk = at::empty_like(k), gv = at::empty_like(v);
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "causal_product_backward", [&] {
    const scalar_t *qp = q.data_ptr<scalar_t>(), *kp = k.data_ptr<scalar_t>(), *vp = v.data_ptr<scalar_t>(),
                   *gp = g.data_ptr<scalar_t>();
    scalar_t *gqp = gq.data_ptr<scalar_t>(), *gkp = gk.data_ptr<scalar_t>(), *gvp = gv.data_ptr<scalar_t>();
    at::parallel_for(0, BH, 1, [&](int64_t begin, int64_t end) {
      Scratch<scalar_t> work(std::max(scratch_size<scalar_t>(M, E), reverse_scratch<scalar_t>(E, M)));
      for (int64_t i = begin; i < end; ++i) {
        const scalar_t *q_i = qp + i * L * E, *k_i = kp + i * L * E, *v_i = vp + i * L * M, *g_i = gp + i * L * M;
        causal_dot(g_i, v_i, k_i, gqp + i * L * E, work.data(), L, M, E, true);  // grad_q (L, E)
        reverse_grads(q_i, k_i, v_i, g_i, gkp + i * L * E, gvp + i * L * M, work.data(), L, E, M);  // grad_k, grad_v
      }
    });
  });
  return {gq, gk, gv};
}

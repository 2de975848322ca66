// Causal product on the CPU, forward and backward, as in Algorithm 1 of
// "Transformers are RNNs" (Katharopoulos et al. 2020).
//
// Shapes: q, k (N, H, L, E) feature-mapped; v (N, H, L, M); out (N, H, L, M).
// Everything is one recurrent primitive, the causal dot of one (n, h) pair,
//     out_t = sum_{j<=t} (a_t . b_j) c_j   (reverse: j >= t),   a, b (L, D); c, out (L, C),
// which carries the D x C state S = sum_j b_j c_j^T through time and reads out_t = S^T a_t:
//   forward   out    = causal_dot(q, k, v)           S  = sum_{j<=t} k_j v_j^T   (E x M)
//   backward  grad_q = causal_dot(g, v, k)           S  = sum_{j<=t} v_j k_j^T   forward sweep
//             grad_v = causal_dot(k, q, g, reverse)  S' = sum_{j>=t} q_j g_j^T   reverse sweep
//             grad_k = causal_dot(v, g, q, reverse)  S'^T                        reverse sweep
// (grad_q_t = S_t g_t, grad_k_t = S'_t v_t, grad_v_t = S'_t^T k_t; keeping S'^T for grad_k
// turns its read-out into row accumulations like the others, with no horizontal sums.)
// Parallel over N * H; memory O(L (E + M)) plus one state per thread, never L x E x M.
// The state's columns are zero-padded to a multiple of one 64-byte SIMD vector (16 floats or 8
// doubles) and processed in blocks of one (AVX-512) or half of one (AVX2 and older: see
// CP_SWEEP_BYTES), the output block accumulating in a register over D.
//
// The second half is the whole normalised attention of the model, fused (attention_forward /
// attention_backward): phi(x) = elu(x) + 1 applied to raw q, k inside the sweeps, the
// denominator phi(q_t) . z_t (z = sum phi(k_j)) carried beside S rather than as a padded ones
// column, the division done in place, and inputs and outputs read and written through their
// strides (the model's q, k, v are views of one projection; out is written (N, L, H, M) so that
// merging heads is free). Only 1 / (den + eps) per position is kept for the backward pass.
// It also takes bfloat16 q, k, v (autocast training): rows are widened to float32 as they are
// read, every sum runs in float32, and out and the gradients are rounded (to nearest even) as
// they are written, so the model's projections feed it with no casts around it.

// Light headers (not torch/extension.h): tensors, dispatch, parallel_for and pybind only.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/add.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/layer_norm.h>
#include <ATen/ops/zeros.h>
#include <c10/util/BFloat16.h>
#include <torch/csrc/utils/pybind.h>

#include "qkv_checks.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <utility>
#include <tuple>
#include <type_traits>
#include <vector>

// The vector helpers below are always inlined, so GCC's note that passing 64-byte vectors
// by value changes the ABI without AVX-512 does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace {

// One 64-byte SIMD vector of T (GCC/Clang vector extension: one zmm register with AVX-512,
// two ymm with AVX2, four xmm on baseline x86-64), loaded and stored unaligned.
template <typename T> struct Simd;
template <> struct Simd<float> { typedef float type __attribute__((vector_size(64))); };
template <> struct Simd<double> { typedef double type __attribute__((vector_size(64))); };
template <typename T> using vec_t = typename Simd<T>::type;
template <typename T> constexpr int64_t kBlock = sizeof(vec_t<T>) / sizeof(T);  // 16 floats, 8 doubles

template <typename T>
inline __attribute__((always_inline)) vec_t<T> load(const T* p) { vec_t<T> x; __builtin_memcpy(&x, p, sizeof x); return x; }
template <typename T>
inline __attribute__((always_inline)) void store(T* p, vec_t<T> x) { __builtin_memcpy(p, &x, sizeof x); }

template <typename T>
constexpr int64_t padded(int64_t n) { return (n + kBlock<T> - 1) / kBlock<T> * kBlock<T>; }

// The vector of the state sweeps below: one whole 64-byte vector where AVX-512 has 32 registers of
// it; a 32-byte one otherwise, with one block of columns at a time. AVX2's 16 ymm registers cannot
// hold kSteps x 2 blocks of 64-byte accumulators and inputs (32 ymm): GCC spilled them to the stack
// at every step, and the sweeps ran several times slower than the chunked PyTorch form (issue 22).
// Padding stays a multiple of kBlock (64 bytes), which is a multiple of either.
#if defined(__AVX512F__)
#define CP_SWEEP_BYTES 64
constexpr int kSweepBlocks = 2;
#else
#define CP_SWEEP_BYTES 32
constexpr int kSweepBlocks = 1;
#endif
template <typename T> struct SweepSimd { typedef T type __attribute__((vector_size(CP_SWEEP_BYTES))); };
template <typename T> using svec_t = typename SweepSimd<T>::type;
template <typename T> constexpr int64_t kSweep = sizeof(svec_t<T>) / sizeof(T);
template <typename T>
inline __attribute__((always_inline)) svec_t<T> sload(const T* p) { svec_t<T> x; __builtin_memcpy(&x, p, sizeof x); return x; }
template <typename T>
inline __attribute__((always_inline)) void sstore(T* p, svec_t<T> x) { __builtin_memcpy(p, &x, sizeof x); }

// The state update and read-out of n consecutive steps s (in the order given):
//   rows[r] += a[s][r] * b[s]   for r < R      (rows: R x Cp; b[s], out[s]: Cp, zero-padded)
//   out[s]   = sum_r w[s][r] * rows[r]         (rows after step s's update)
// Each row is loaded and stored once per NT steps and kept in registers in between (the
// state's loads and stores, not the arithmetic, bound a one-step loop); columns go NB vector
// blocks at a time so that each broadcast of a[s][r], w[s][r] serves NB blocks.
template <typename T, int NB, int NT>
inline __attribute__((always_inline)) void update_and_read_blocks(T* __restrict__ rows, const T* const* a,
                                                                  const T* const* b, const T* const* w,
                                                                  T* const* out, int64_t R, int64_t Cp) {
  using V = svec_t<T>;
  constexpr int64_t B = kSweep<T>;
  V b_blk[NT][NB], acc[NT][NB];
  const T* a_s[NT];
  const T* w_s[NT];
  for (int s = 0; s < NT; ++s) {
    a_s[s] = a[s];
    w_s[s] = w[s];
    for (int j = 0; j < NB; ++j) {
      b_blk[s][j] = sload(b[s] + j * B);
      acc[s][j] = V{};
    }
  }
  for (int64_t r = 0; r < R; ++r) {
    for (int j = 0; j < NB; ++j) {
      T* row = rows + r * Cp + j * B;
      V x = sload(row);
      for (int s = 0; s < NT; ++s) {
        x += a_s[s][r] * b_blk[s][j];
        acc[s][j] += w_s[s][r] * x;
      }
      sstore(row, x);
    }
  }
  for (int s = 0; s < NT; ++s)
    for (int j = 0; j < NB; ++j) sstore(out[s] + j * B, acc[s][j]);
}

template <typename T, int NT>
inline __attribute__((always_inline)) void update_and_read_steps(T* rows, const T* const* a, const T* const* b,
                                                                 const T* const* w, T* const* out, int64_t R,
                                                                 int64_t Cp) {
  constexpr int64_t B = kSweep<T>;
  const T *b_c[NT];
  T* out_c[NT];
  for (int64_t c0 = 0; c0 < Cp;) {
    for (int s = 0; s < NT; ++s) {
      b_c[s] = b[s] + c0;
      out_c[s] = out[s] + c0;
    }
    if (kSweepBlocks >= 2 && c0 + 2 * B <= Cp) {
      update_and_read_blocks<T, kSweepBlocks >= 2 ? 2 : 1, NT>(rows + c0, a, b_c, w, out_c, R, Cp);
      c0 += (kSweepBlocks >= 2 ? 2 : 1) * B;
    } else {
      update_and_read_blocks<T, 1, NT>(rows + c0, a, b_c, w, out_c, R, Cp);
      c0 += B;
    }
  }
}

constexpr int kSteps = 4;  // steps per state pass

// update_and_read_steps for any n <= kSteps steps.
template <typename T>
inline __attribute__((always_inline)) void update_and_read(T* rows, const T* const* a, const T* const* b,
                                                           const T* const* w, T* const* out, int n, int64_t R,
                                                           int64_t Cp) {
  if (n == kSteps) return update_and_read_steps<T, kSteps>(rows, a, b, w, out, R, Cp);
  for (int s = 0; s < n; ++s) update_and_read_steps<T, 1>(rows, a + s, b + s, w + s, out + s, R, Cp);
}

// Copy n values: whole vectors, then a scalar tail (GCC would turn a plain copy loop into a
// memmove call, which costs more than the copy for these short rows).
template <typename T>
inline __attribute__((always_inline)) void copy_row(const T* __restrict__ src, T* __restrict__ dst, int64_t n) {
  int64_t i = 0;
  for (; i + kBlock<T> <= n; i += kBlock<T>) store(dst + i, load(src + i));
  for (; i < n; ++i) dst[i] = src[i];
}

// The fused attention's storage types: float, double, and bfloat16 computed in float.
template <typename S> struct Compute { using type = S; };
template <> struct Compute<c10::BFloat16> { using type = float; };
template <typename S> using compute_t = typename Compute<S>::type;

// Copy n values converting between storage S and compute T (bfloat16 -> float is exact;
// float -> bfloat16 rounds to nearest even, as torch does).
template <typename To, typename From>
inline __attribute__((always_inline)) void convert_row(const From* __restrict__ src, To* __restrict__ dst,
                                                       int64_t n) {
  if constexpr (std::is_same_v<To, From>) copy_row(src, dst, n);
  else for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<To>(src[i]);
}

// Scratch for causal_dot_head: the state (D, padded C), one padded row of c, one of out.
template <typename T>
int64_t scratch_size(int64_t D, int64_t C) { return (D + 2) * padded<T>(C); }

// out_t = sum_{j<=t} (a_t . b_j) c_j (reverse: j >= t) for one (n, h) pair.
// a, b (L, D); c, out (L, C); work: scratch_size<T>(D, C) values.
template <typename T>
inline __attribute__((always_inline)) void causal_dot_head(
    const T* __restrict__ a, const T* __restrict__ b, const T* __restrict__ c, T* __restrict__ out,
    T* __restrict__ work, int64_t L, int64_t D, int64_t C, bool reverse) {
  const int64_t Cp = padded<T>(C);
  T* S = work;               // (D, Cp) state; the padding columns stay zero
  T* c_row = S + D * Cp;     // (Cp) c_t, zero-padded
  T* o_row = c_row + Cp;     // (Cp) out_t before trimming to C
  const T* c_row_c = c_row;
  std::fill(work, work + (D + 1) * Cp, T(0));
  for (int64_t s = 0; s < L; ++s) {
    const int64_t t = reverse ? L - 1 - s : s;
    const T *a_t = a + t * D, *b_t = b + t * D;
    copy_row(c + t * C, c_row, C);
    update_and_read_steps<T, 1>(S, &b_t, &c_row_c, &a_t, &o_row, D, Cp);
    copy_row(o_row, out + t * C, C);
  }
}

// ---- per-dtype entry points, cloned for AVX-512 / AVX2 / baseline x86-64 ----------
// The build uses flags valid on any x86-64; the clones pick the widest vector unit at
// load time (GCC function multiversioning), so a cached build stays portable.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define CP_MULTIVERSION __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define CP_MULTIVERSION
#endif

CP_MULTIVERSION void causal_dot_f32(const float* a, const float* b, const float* c, float* out, float* work,
                                    int64_t L, int64_t D, int64_t C, bool reverse) {
  causal_dot_head<float>(a, b, c, out, work, L, D, C, reverse);
}
CP_MULTIVERSION void causal_dot_f64(const double* a, const double* b, const double* c, double* out, double* work,
                                    int64_t L, int64_t D, int64_t C, bool reverse) {
  causal_dot_head<double>(a, b, c, out, work, L, D, C, reverse);
}

template <typename T>
void causal_dot(const T* a, const T* b, const T* c, T* out, T* work, int64_t L, int64_t D, int64_t C, bool reverse) {
  if constexpr (std::is_same_v<T, float>) causal_dot_f32(a, b, c, out, work, L, D, C, reverse);
  else causal_dot_f64(a, b, c, out, work, L, D, C, reverse);
}

void check_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  TORCH_CHECK(q.device().is_cpu() && k.device().is_cpu() && v.device().is_cpu(),
              "causal_product (CPU kernel): q, k, v must be CPU tensors");
  check_qkv_shapes(q, k, v);
  TORCH_CHECK(q.scalar_type() == at::kFloat || q.scalar_type() == at::kDouble || q.scalar_type() == at::kBFloat16,
              "causal_product (CPU kernel): float32, float64 or bfloat16 only, got ", q.scalar_type());
}


// ---- fused normalised attention ------------------------------------------------------

// exp(x) for x <= 0 on one vector of floats (Cephes expf: range reduction to |r| <= ln2/2,
// degree-7 polynomial, 2^n through the exponent bits); relative error < 2e-7, down to
// x = -87 (below, the result is clamped near 1.6e-38).
// On the sweep vector (CP_SWEEP_BYTES): GCC lowered the 64-byte selects to scalar code on AVX2.
typedef int32_t vec_i32 __attribute__((vector_size(CP_SWEEP_BYTES)));
inline __attribute__((always_inline)) svec_t<float> exp_nonpositive(svec_t<float> x) {
  using V = svec_t<float>;
  x = x < -87.0f ? V{} - 87.0f : x;
  const vec_i32 n = __builtin_convertvector(x * 1.44269504088896341f - 0.5f, vec_i32);  // round(x / ln2), x <= 0
  const V nf = __builtin_convertvector(n, V);
  const V r = x - nf * 0.693359375f + nf * 2.12194440e-4f;
  V p = V{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  return p * (V)((n + 127) << 23);
}

// y[0, D) = phi(x[0, D)) = elu(x) + 1, y[D, Dp) = 0; y holds padded(D) values; x may be bfloat16.
template <typename S>
inline __attribute__((always_inline)) void phi_row(const S* x, float* y, int64_t D) {
  using V = svec_t<float>;
  convert_row(x, y, D);
  for (int64_t i = 0; i < D; i += kSweep<float>) {
    const V u = sload(y + i);
    sstore(y + i, u > 0.0f ? u + 1.0f : exp_nonpositive(u > 0.0f ? V{} : u));
  }
  std::fill(y + D, y + padded<float>(D), 0.0f);
}
inline __attribute__((always_inline)) void phi_row(const double* x, double* y, int64_t D) {
  for (int64_t i = 0; i < D; ++i) y[i] = x[i] > 0 ? x[i] + 1 : std::exp(x[i]);
  std::fill(y + D, y + padded<double>(D), 0.0);
}

// Sum of the lanes of x as a tree (a chain of lane additions would cost ~4 cycles per lane).
template <typename T>
inline __attribute__((always_inline)) T hsum(vec_t<T> x) {
  T lanes[kBlock<T>];
  __builtin_memcpy(lanes, &x, sizeof x);
  for (int64_t w = kBlock<T> / 2; w >= 1; w /= 2)
    for (int64_t i = 0; i < w; ++i) lanes[i] += lanes[i + w];
  return lanes[0];
}

template <typename T>
inline __attribute__((always_inline)) T dot(const T* a, const T* b, int64_t Dp) {  // Dp: a multiple of kBlock
  vec_t<T> acc = {};
  for (int64_t i = 0; i < Dp; i += kBlock<T>) acc += load(a + i) * load(b + i);
  return hsum<T>(acc);
}

// A (L, D) matrix of one (n, h) pair read or written through its row stride.
template <typename T> struct Rows {
  T* p;
  int64_t stride;
  T* operator[](int64_t t) const { return p + t * stride; }
};

// Forward of one (n, h) pair: out_t = phi(q_t)^T S_t / (phi(q_t) . z_t + eps) with
// S_t = sum_{j<=t} phi(k_j) v_j^T (E x M) and z_t = sum_{j<=t} phi(k_j); inv_t = 1 / (den_t + eps).
// Steps go kSteps at a time through the state: S (E, Mp) followed by z (Ep), state_size<T>(E, M)
// values, read at the start (zeros for a whole sequence) and left at its end (for decoding).
template <typename T>
int64_t state_size(int64_t E, int64_t M) { return E * padded<T>(M) + padded<T>(E); }

template <typename S, typename T = compute_t<S>>
inline __attribute__((always_inline)) void attention_forward_head(
    Rows<const S> q, Rows<const S> k, Rows<const S> v, Rows<S> out, T* inv, int64_t L, int64_t E, int64_t M,
    T eps, T* state, T* work) {
  const int64_t Ep = padded<T>(E), Mp = padded<T>(M);
  T *z = state + E * Mp, *qf = work, *kf = qf + kSteps * Ep, *v_row = kf + kSteps * Ep,
    *o = v_row + kSteps * Mp;  // work: kSteps rows each of phi(q), phi(k), v, out
  std::fill(work, o + kSteps * Mp, T(0));
  const T *qf_s[kSteps], *kf_s[kSteps], *v_s[kSteps];
  T* o_s[kSteps];
  for (int64_t t0 = 0; t0 < L; t0 += kSteps) {
    const int n = static_cast<int>(std::min<int64_t>(kSteps, L - t0));
    for (int s = 0; s < n; ++s) {
      const int64_t t = t0 + s;
      qf_s[s] = qf + s * Ep, kf_s[s] = kf + s * Ep, v_s[s] = v_row + s * Mp, o_s[s] = o + s * Mp;
      phi_row(q[t], qf + s * Ep, E);
      phi_row(k[t], kf + s * Ep, E);
      convert_row(v[t], v_row + s * Mp, M);
      for (int64_t i = 0; i < Ep; i += kBlock<T>) store(z + i, load(z + i) + load(kf_s[s] + i));
      inv[t] = T(1) / (dot(qf_s[s], z, Ep) + eps);
    }
    update_and_read(state, kf_s, v_s, qf_s, o_s, n, E, Mp);
    for (int s = 0; s < n; ++s)
      for (int64_t m = 0; m < M; ++m) out[t0 + s][m] = static_cast<S>(o_s[s][m] * inv[t0 + s]);
  }
}

// dst = grad_feature * phi'(x) with phi'(x) = min(phi(x), 1), from the feature phi(x).
template <typename S, typename T>
inline __attribute__((always_inline)) void grad_through_phi(const T* __restrict__ grad_feature,
                                                            const T* __restrict__ feature, S* __restrict__ dst,
                                                            int64_t E) {
  // (a select, not std::min: in the target_clones entry points GCC called std::min out of line per value)
  for (int64_t e = 0; e < E; ++e) dst[e] = static_cast<S>(grad_feature[e] * (feature[e] < T(1) ? feature[e] : T(1)));
}

// Backward of one (n, h) pair from g = dLoss/dout. With gn_t = g_t inv_t and
// gd_t = -(g_t . out_t) inv_t (the gradients of the numerator and the denominator):
//   forward sweep   grad phi(q_t) = sum_{j<=t} phi(k_j) (v_j . gn_t) + z_t gd_t   (state S^T, M x E)
//   reverse sweep   grad phi(k_j) = sum_{t>=j} phi(q_t) (v_j . gn_t + gd_t)       (state R^T, M x E, and r)
//                   grad v_j      = sum_{t>=j} (phi(q_t) . phi(k_j)) gn_t         (state R, E x M)
// and phi'(x) = min(phi(x), 1) turns the feature gradients into grad q, grad k.
// phi(q), phi(k), v, gn and gd are computed once, in T, into per-thread rows of work (O(L (E + M))).
template <typename S, typename T = compute_t<S>>
inline __attribute__((always_inline)) void attention_backward_head(
    Rows<const S> q, Rows<const S> k, Rows<const S> v, Rows<const S> out, const T* inv, Rows<const S> g,
    Rows<S> gq, Rows<S> gk, Rows<S> gv, int64_t L, int64_t E, int64_t M, T* work) {
  using V = vec_t<T>;
  constexpr int64_t B = kBlock<T>;
  const int64_t Ep = padded<T>(E), Mp = padded<T>(M);
  T *St = work, *Rt = St + M * Ep, *R = Rt + M * Ep, *z = R + E * Mp, *r = z + Ep, *acc = r + Ep,
    *o = acc + kSteps * Ep;  // acc: kSteps rows of Ep, o: kSteps rows of Mp
  T *QF = o + kSteps * Mp, *KF = QF + L * Ep, *VF = KF + L * Ep, *GN = VF + L * Mp,
    *gd = GN + L * Mp;  // (L, Ep) twice, (L, Mp) twice, (L)
  std::fill(work, QF, T(0));
  for (int64_t t = 0; t < L; ++t) {
    T* gn = GN + t * Mp;
    phi_row(q[t], QF + t * Ep, E);
    phi_row(k[t], KF + t * Ep, E);
    convert_row(v[t], VF + t * Mp, M);
    for (int64_t m = 0; m < M; ++m) gn[m] = static_cast<T>(g[t][m]) * inv[t];
    std::fill(gn + M, gn + Mp, T(0));
    convert_row(out[t], o, M);      // o: scratch here, zero-padded above; a vector dot, not a scalar chain
    gd[t] = -dot(gn, o, Mp);
  }
  const T *qf_s[kSteps], *kf_s[kSteps], *gn_s[kSteps], *v_s[kSteps];
  T *acc_s[kSteps], *o_s[kSteps];
  for (int s = 0; s < kSteps; ++s) acc_s[s] = acc + s * Ep, o_s[s] = o + s * Mp;
  // gather kSteps steps (ascending or descending from t0) into the pointer arrays
  auto gather = [&](int64_t t0, int n, int dir) {
    for (int s = 0; s < n; ++s) {
      const int64_t t = t0 + dir * s;
      qf_s[s] = QF + t * Ep, kf_s[s] = KF + t * Ep, gn_s[s] = GN + t * Mp, v_s[s] = VF + t * Mp;
    }
  };
  for (int64_t t0 = 0; t0 < L; t0 += kSteps) {
    const int n = static_cast<int>(std::min<int64_t>(kSteps, L - t0));
    gather(t0, n, 1);
    update_and_read(St, v_s, kf_s, gn_s, acc_s, n, M, Ep);
    for (int s = 0; s < n; ++s) {
      for (int64_t i = 0; i < Ep; i += B) {
        store(z + i, load(z + i) + load(kf_s[s] + i));
        store(acc_s[s] + i, load(acc_s[s] + i) + gd[t0 + s] * load(z + i));
      }
      grad_through_phi(acc_s[s], qf_s[s], gq[t0 + s], E);
    }
  }
  for (int64_t t0 = L - 1; t0 >= 0; t0 -= kSteps) {
    const int n = static_cast<int>(std::min<int64_t>(kSteps, t0 + 1));
    gather(t0, n, -1);
    update_and_read(R, qf_s, gn_s, kf_s, o_s, n, E, Mp);
    update_and_read(Rt, gn_s, qf_s, v_s, acc_s, n, M, Ep);
    for (int s = 0; s < n; ++s) {
      const int64_t t = t0 - s;
      convert_row(o_s[s], gv[t], M);
      for (int64_t i = 0; i < Ep; i += B) {
        const V r_new = load(r + i) + gd[t] * load(qf_s[s] + i);
        store(r + i, r_new);
        store(acc_s[s] + i, load(acc_s[s] + i) + r_new);
      }
      grad_through_phi(acc_s[s], kf_s[s], gk[t], E);
    }
  }
}

template <typename T>
int64_t attention_scratch(int64_t L, int64_t E, int64_t M) {  // backward (forward: L = 0)
  const int64_t Ep = padded<T>(E), Mp = padded<T>(M);
  return 2 * M * Ep + E * Mp + (2 + 2 * kSteps) * Ep + 3 * kSteps * Mp + L * (2 * Ep + 2 * Mp + 1);  // >= forward's
}

// Entry points per storage type (f32, f64, bf16), cloned as above.
#define ATTENTION_ENTRY_POINTS(S, suffix)                                                                    \
  CP_MULTIVERSION void attention_forward_##suffix(Rows<const S> q, Rows<const S> k, Rows<const S> v,        \
                                                  Rows<S> out, compute_t<S>* inv, int64_t L, int64_t E,     \
                                                  int64_t M, compute_t<S> eps, compute_t<S>* state,         \
                                                  compute_t<S>* work) {                                     \
    attention_forward_head<S>(q, k, v, out, inv, L, E, M, eps, state, work);                              \
  }                                                                                                         \
  CP_MULTIVERSION void attention_backward_##suffix(Rows<const S> q, Rows<const S> k, Rows<const S> v,       \
                                                   Rows<const S> out, const compute_t<S>* inv,              \
                                                   Rows<const S> g, Rows<S> gq, Rows<S> gk, Rows<S> gv,     \
                                                   int64_t L, int64_t E, int64_t M, compute_t<S>* work) {   \
    attention_backward_head<S>(q, k, v, out, inv, g, gq, gk, gv, L, E, M, work);                          \
  }
ATTENTION_ENTRY_POINTS(float, f32)
ATTENTION_ENTRY_POINTS(double, f64)
ATTENTION_ENTRY_POINTS(c10::BFloat16, bf16)
#undef ATTENTION_ENTRY_POINTS

template <typename S, typename... Args> void attention_forward(Args... args) {
  if constexpr (std::is_same_v<S, float>) attention_forward_f32(args...);
  else if constexpr (std::is_same_v<S, double>) attention_forward_f64(args...);
  else attention_forward_bf16(args...);
}
template <typename S, typename... Args> void attention_backward(Args... args) {
  if constexpr (std::is_same_v<S, float>) attention_backward_f32(args...);
  else if constexpr (std::is_same_v<S, double>) attention_backward_f64(args...);
  else attention_backward_bf16(args...);
}

// The (L, D) rows of each pair i = n * H + h of a 4-d (N, H, L, D) tensor with unit last stride,
// its pointer and strides read once (tensor calls per pair cost ~5% of a decoding step's attention).
template <typename T> struct Heads {
  T* p;
  int64_t H, s0, s1, s2;
  explicit Heads(const at::Tensor& x)
      : p(static_cast<T*>(x.data_ptr())), H(x.size(1)), s0(x.stride(0)), s1(x.stride(1)), s2(x.stride(2)) {}
  Rows<T> operator[](int64_t i) const { return {p + (i / H) * s0 + (i % H) * s1, s2}; }
};

// A new (N, H, L, D) tensor laid out as (N, L, H, D): what merging heads reads without a copy.
at::Tensor empty_heads_last(const at::Tensor& like, int64_t D) {
  return at::empty({like.size(0), like.size(2), like.size(1), D}, like.options()).transpose(1, 2);
}

// ---- small-batch bfloat16 products for decoding --------------------------------------------
// out (N, O) = b + x W for a few rows x (N, K) float32 and W (K, O), b (O) bfloat16: each row of W
// is widened to float32 in registers (bfloat16 is float32's upper half) and accumulated in float32,
// out rounded to bfloat16 (nearest even). At batch 1 the product only streams W, and reading
// bfloat16 halves that; torch's bfloat16 matmul (oneDNN) gains little there on this CPU (without AMX).
// Columns go kLinCols at a time so that every widened W row serves all N rows from registers.
constexpr int kLinCols = 64;     // 4 vectors of 16 floats
constexpr int kLinMaxRows = 4;   // rows handled together; more go through torch's matmul

typedef uint16_t u16x16_t __attribute__((vector_size(32)));
typedef uint32_t u32x16_t __attribute__((vector_size(64)));
inline __attribute__((always_inline)) vec_t<float> widen_bf16(const c10::BFloat16* p) {
  u16x16_t h;
  __builtin_memcpy(&h, p, sizeof h);
  const u32x16_t w = __builtin_convertvector(h, u32x16_t) << 16;
  vec_t<float> f;
  __builtin_memcpy(&f, &w, sizeof f);
  return f;
}

template <int NR>
inline __attribute__((always_inline)) void linear_bf16_cols(const float* x, const c10::BFloat16* W,
                                                            const c10::BFloat16* b, c10::BFloat16* out,
                                                            int64_t K, int64_t O, int64_t c0) {
  using V = vec_t<float>;
  constexpr int NB = kLinCols / 16;
  V acc[NR][NB];
  for (int j = 0; j < NB; ++j) {
    const V bias = widen_bf16(b + c0 + 16 * j);
    for (int n = 0; n < NR; ++n) acc[n][j] = bias;
  }
  for (int64_t k = 0; k < K; ++k) {
    const c10::BFloat16* w = W + k * O + c0;
    V wk[NB];
    for (int j = 0; j < NB; ++j) wk[j] = widen_bf16(w + 16 * j);
    for (int n = 0; n < NR; ++n)
      for (int j = 0; j < NB; ++j) acc[n][j] += x[n * K + k] * wk[j];
  }
  for (int n = 0; n < NR; ++n)
    for (int j = 0; j < NB; ++j) {
      float lanes[16];
      __builtin_memcpy(lanes, &acc[n][j], sizeof lanes);
      for (int i = 0; i < 16; ++i) out[n * O + c0 + 16 * j + i] = c10::BFloat16(lanes[i]);
    }
}

CP_MULTIVERSION void linear_bf16_range(const float* x, const c10::BFloat16* W, const c10::BFloat16* b,
                                       c10::BFloat16* out, int64_t N, int64_t K, int64_t O, int64_t begin,
                                       int64_t end) {
  for (int64_t c = begin; c < end; ++c) {
    const int64_t c0 = c * kLinCols;
    switch (N) {
      case 1: linear_bf16_cols<1>(x, W, b, out, K, O, c0); break;
      case 2: linear_bf16_cols<2>(x, W, b, out, K, O, c0); break;
      case 3: linear_bf16_cols<3>(x, W, b, out, K, O, c0); break;
      default: linear_bf16_cols<4>(x, W, b, out, K, O, c0); break;
    }
  }
}

// ---- residual add and LayerNorm of the bfloat16 decoding step -------------------------------
// Rows [n0, n1) of h (N, D) float32: h += y (bfloat16; none when y is null), then
// out = LayerNorm(h) * w + b rounded to bfloat16, with the mean and the (biased) variance summed
// in float32 vectors. One pass per row where torch would run an add, a LayerNorm and a copy.
CP_MULTIVERSION void add_layer_norm_rows(float* h, const c10::BFloat16* y, const float* w, const float* b,
                                         c10::BFloat16* out, int64_t n0, int64_t n1, int64_t D, float eps) {
  using V = vec_t<float>;
  constexpr int64_t B = kBlock<float>;
  const int64_t Dv = D / B * B;
  for (int64_t n = n0; n < n1; ++n) {
    float* hr = h + n * D;
    if (y) {
      const c10::BFloat16* yr = y + n * D;
      for (int64_t i = 0; i < Dv; i += B) store(hr + i, load(hr + i) + widen_bf16(yr + i));
      for (int64_t i = Dv; i < D; ++i) hr[i] += static_cast<float>(yr[i]);
    }
    V acc{};
    for (int64_t i = 0; i < Dv; i += B) acc += load(hr + i);
    float sum = hsum<float>(acc);
    for (int64_t i = Dv; i < D; ++i) sum += hr[i];
    const float mean = sum / D;
    acc = V{};
    for (int64_t i = 0; i < Dv; i += B) {
      const V d = load(hr + i) - mean;
      acc += d * d;
    }
    float var = hsum<float>(acc);
    for (int64_t i = Dv; i < D; ++i) var += (hr[i] - mean) * (hr[i] - mean);
    const float rstd = 1.0f / std::sqrt(var / D + eps);
    c10::BFloat16* o = out + n * D;
    for (int64_t i = 0; i < D; ++i) o[i] = c10::BFloat16((hr[i] - mean) * rstd * w[i] + b[i]);
  }
}

void check_unit_stride(const at::Tensor& x, const char* name) {
  TORCH_CHECK(x.dim() == 4 && x.stride(3) == 1, "linear attention (CPU kernel): ", name,
              " must be 4-d with a contiguous last dimension");
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
      std::vector<scalar_t> work(scratch_size<scalar_t>(E, M));
      for (int64_t i = begin; i < end; ++i)
        causal_dot(qp + i * L * E, kp + i * L * E, vp + i * L * M, op + i * L * M, work.data(), L, E, M, false);
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
      std::vector<scalar_t> work(std::max(scratch_size<scalar_t>(E, M), scratch_size<scalar_t>(M, E)));
      for (int64_t i = begin; i < end; ++i) {
        const scalar_t *q_i = qp + i * L * E, *k_i = kp + i * L * E, *v_i = vp + i * L * M, *g_i = gp + i * L * M;
        causal_dot(g_i, v_i, k_i, gqp + i * L * E, work.data(), L, M, E, false);  // grad_q (L, E)
        causal_dot(v_i, g_i, q_i, gkp + i * L * E, work.data(), L, M, E, true);   // grad_k (L, E)
        causal_dot(k_i, q_i, g_i, gvp + i * L * M, work.data(), L, E, M, true);   // grad_v (L, M)
      }
    });
  });
  return {gq, gk, gv};
}

// The dtype the fused attention computes in for storage dtype `dtype`: float32 for bfloat16.
at::ScalarType compute_type(at::ScalarType dtype) { return dtype == at::kBFloat16 ? at::kFloat : dtype; }

#define DISPATCH_ATTENTION_TYPES(dtype, name, ...) \
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, dtype, name, __VA_ARGS__)

// Fused attention: raw q, k (N, H, L, E), v (N, H, L, M), float32, float64 or bfloat16, any
// strides with a contiguous last dim -> (out (N, H, L, M) of their dtype laid out (N, L, H, M),
// inv (N, H, L) = 1 / (den + eps) in the compute dtype).
// With a state (from attention_state) the sequence continues from it and leaves it at its end:
// decoding one position at a time is this call with L = 1.
std::tuple<at::Tensor, at::Tensor> attention_forward_cpu(at::Tensor q, at::Tensor k, at::Tensor v, double eps,
                                                         std::optional<at::Tensor> state) {
  check_inputs(q, k, v);
  check_unit_stride(q, "q"); check_unit_stride(k, "k"); check_unit_stride(v, "v");
  const int64_t BH = q.size(0) * q.size(1), L = q.size(2), E = q.size(3), M = v.size(3);
  auto out = empty_heads_last(v, M);
  auto inv = at::empty({q.size(0), q.size(1), L}, q.options().dtype(compute_type(q.scalar_type())));
  DISPATCH_ATTENTION_TYPES(q.scalar_type(), "attention_forward", [&] {
    using T = compute_t<scalar_t>;
    const int64_t state_n = state_size<T>(E, M);
    TORCH_CHECK(!state || (state->is_contiguous() && state->scalar_type() == inv.scalar_type() &&
                           state->numel() == BH * state_n),
                "linear attention: the state does not fit these q, k, v; make it with attention_state");
    const Heads<const scalar_t> hq(q), hk(k), hv(v);
    const Heads<scalar_t> ho(out);
    T *states = state ? state->data_ptr<T>() : nullptr, *invs = inv.data_ptr<T>();
    at::parallel_for(0, BH, 1, [&](int64_t begin, int64_t end) {
      std::vector<T> work(attention_scratch<T>(0, E, M));  // no per-position rows
      for (int64_t i = begin; i < end; ++i) {
        T* S = states ? states + i * state_n : work.data();
        if (!states) std::fill(S, S + state_n, T(0));
        attention_forward<scalar_t>(hq[i], hk[i], hv[i], ho[i], invs + i * L, L, E, M, static_cast<T>(eps), S,
                                    work.data() + state_n);
      }
    });
  });
  return {out, inv};
}

// A zero state for attention_forward on q, k, v like `like`: (N * H, state_size) in the compute dtype.
at::Tensor attention_state(const at::Tensor& like, int64_t BH, int64_t E, int64_t M) {
  int64_t n = 0;
  DISPATCH_ATTENTION_TYPES(like.scalar_type(), "attention_state", [&] { n = state_size<compute_t<scalar_t>>(E, M); });
  return at::zeros({BH, n}, like.options().dtype(compute_type(like.scalar_type())));
}

// Writes grad_q, grad_k, grad_v (shaped and typed like q, k, v, any strides with a contiguous last
// dim: views of one buffer, say, so that their caller need not concatenate them).
void attention_backward_cpu(at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor out, at::Tensor inv,
                            at::Tensor grad_out, at::Tensor gq, at::Tensor gk, at::Tensor gv) {
  check_inputs(q, k, v);
  for (const auto& [x, name] : {std::pair{q, "q"}, {k, "k"}, {v, "v"}, {out, "out"}, {grad_out, "grad_out"},
                                {gq, "grad_q"}, {gk, "grad_k"}, {gv, "grad_v"}})
    check_unit_stride(x, name);
  TORCH_CHECK(out.sizes() == v.sizes() && grad_out.sizes() == v.sizes() && gq.sizes() == q.sizes() &&
                  gk.sizes() == k.sizes() && gv.sizes() == v.sizes(),
              "linear attention backward: out, grad_out, grad_v must be shaped like v, grad_q, grad_k like q");
  for (const auto& x : {out, grad_out, gq, gk, gv})
    TORCH_CHECK(x.scalar_type() == v.scalar_type(), "linear attention backward: dtypes differ from v's");
  TORCH_CHECK(inv.is_contiguous() && inv.scalar_type() == compute_type(v.scalar_type()),
              "linear attention backward: inv must be attention_forward's");
  const int64_t BH = q.size(0) * q.size(1), L = q.size(2), E = q.size(3), M = v.size(3);
  DISPATCH_ATTENTION_TYPES(q.scalar_type(), "attention_backward", [&] {
    using T = compute_t<scalar_t>;
    const Heads<const scalar_t> hq(q), hk(k), hv(v), ho(out), hg(grad_out);
    const Heads<scalar_t> hgq(gq), hgk(gk), hgv(gv);
    const T* invs = inv.data_ptr<T>();
    at::parallel_for(0, BH, 1, [&](int64_t begin, int64_t end) {
      std::vector<T> work(attention_scratch<T>(L, E, M));
      for (int64_t i = begin; i < end; ++i)
        attention_backward<scalar_t>(hq[i], hk[i], hv[i], ho[i], invs + i * L, hg[i], hgq[i], hgk[i], hgv[i], L, E,
                                     M, work.data());
    });
  });
}

// b + x W through oneDNN with W prepacked for it (`imagegen.layers.pack`: torch.ops.mkldnn.
// _reorder_linear_weight of W^T, an opaque (O, K) tensor): torch.ops.mkldnn._linear_pointwise, the
// op torch.compile uses for frozen CPU linears, which skips repacking W at every call.
at::Tensor packed_linear(const at::Tensor& x, const at::Tensor& W, const at::Tensor& b) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                               c10::string_view, c10::List<std::optional<at::Scalar>>,
                                               std::optional<c10::string_view>)>();
  return op.call(x.to(W.scalar_type()).contiguous(), W, b, "none", c10::List<std::optional<at::Scalar>>(),
                 std::nullopt);
}

// b + x W for x (N, K) of any floating dtype and W (K, O), b (O) of one dtype -> (N, O) of W's
// dtype, as torch.addmm(b, x.to(W.dtype), W): through oneDNN for a prepacked W (see packed_linear),
// through linear_bf16_range for bfloat16 W, a few rows and O a multiple of kLinCols, else through torch.
at::Tensor decode_linear(const at::Tensor& x, const at::Tensor& W, const at::Tensor& b) {
  if (W.is_mkldnn()) return packed_linear(x, W, b);
  const int64_t N = x.size(0), K = x.size(1), O = W.size(1);
  if (W.scalar_type() != at::kBFloat16 || N > kLinMaxRows || O % kLinCols || !W.is_contiguous() ||
      !b.is_contiguous() || b.scalar_type() != at::kBFloat16 || b.numel() != O || W.size(0) != K)
    return at::addmm(b, x.to(W.scalar_type()), W);
  // x as torch.addmm(b, x.to(bfloat16), W) would take it: rounded to bfloat16, here widened again to float32
  const auto xc = x.contiguous();
  std::vector<float> xf(N * K);
  if (xc.scalar_type() == at::kBFloat16) {
    const auto* xp = xc.data_ptr<c10::BFloat16>();
    for (int64_t i = 0; i < N * K; ++i) xf[i] = static_cast<float>(xp[i]);
  } else if (xc.scalar_type() == at::kFloat) {
    const auto* xp = xc.data_ptr<float>();
    for (int64_t i = 0; i < N * K; ++i) xf[i] = static_cast<float>(c10::BFloat16(xp[i]));
  } else {
    return at::addmm(b, x.to(W.scalar_type()), W);
  }
  auto out = at::empty({N, O}, W.options());
  const float* xp = xf.data();
  const auto *Wp = W.data_ptr<c10::BFloat16>(), *bp = b.data_ptr<c10::BFloat16>();
  auto* op = out.data_ptr<c10::BFloat16>();
  // split columns over threads only where each gets at least ~256 KiB of W to stream
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 17) / (K * kLinCols));
  at::parallel_for(0, O / kLinCols, grain, [&](int64_t begin, int64_t end) {
    linear_bf16_range(xp, Wp, bp, op, N, K, O, begin, end);
  });
  return out;
}

// One decoding position of a whole PixelTransformer whose every layer is linear attention on
// this kernel: the loop of PixelTransformer.step in one call, which saves the Python and module
// overhead of some ninety small ops per position (most of the batch-1 time). h (N, D): the
// embedded input token. layers: per block [ln1 weight, bias, qkv W, b, out W, b, ln2 weight, bias,
// ff1 W, b, ff2 W, b, decoding state], Dense weights stored (in, out) or prepacked for oneDNN (see
// packed_linear). head: [ln_f weight, bias, proj W, b]. -> distribution parameters (N, P); the
// states advance in place.
// The blocks' Dense weights may be bfloat16 while h and the rest are float32 (bfloat16 decoding):
// then each block output (bfloat16) is added to the float32 h and the next LayerNorm rounded to
// bfloat16 in one pass (add_layer_norm_rows), the attention reads bfloat16 q, k, v into its float32
// state, and the products return bfloat16.
at::Tensor decode_step_cpu(at::Tensor h, const std::vector<std::vector<at::Tensor>>& layers,
                           const std::vector<at::Tensor>& head, int64_t n_heads, double ln_eps, double eps) {
  TORCH_CHECK(h.dim() == 2 && head.size() == 4 && n_heads > 0 && h.size(1) % n_heads == 0 && !layers.empty(),
              "decode_step: h must be (N, D) with D divisible by n_heads, layers not empty and head hold 4 tensors");
  const int64_t N = h.size(0), D = h.size(1), E = D / n_heads;
  const auto dtype = layers.front()[2].scalar_type();  // the products' dtype
  for (const auto& w : layers) {
    TORCH_CHECK(w.size() == 13, "decode_step: each layer takes 13 tensors");
    for (int j : {2, 3, 4, 5, 8, 9, 10, 11})
      TORCH_CHECK(w[j].scalar_type() == dtype,
                  "decode_step: every block's Dense weights and biases must share one dtype");
  }
  auto attention = [&](const at::Tensor& x, const std::vector<at::Tensor>& w) {  // LayerNorm'd x -> (N, D)
    auto qkv = decode_linear(x, w[2], w[3]).view({N, 3, n_heads, 1, E});
    return std::get<0>(attention_forward_cpu(qkv.select(1, 0), qkv.select(1, 1), qkv.select(1, 2), eps, w[12]))
        .reshape({N, D});
  };
  if (dtype == at::kBFloat16 && h.scalar_type() == at::kFloat) {
    h = h.contiguous().clone();                     // the float32 residual stream, updated in place
    at::Tensor y;                                   // the last block output not yet added to h
    auto add_norm = [&](const at::Tensor& w, const at::Tensor& b) {  // h += y; -> LayerNorm(h) in bfloat16
      TORCH_CHECK(w.scalar_type() == at::kFloat && b.scalar_type() == at::kFloat && w.is_contiguous() &&
                      b.is_contiguous() && (!y.defined() || (y.scalar_type() == at::kBFloat16 && y.is_contiguous())),
                  "decode_step: LayerNorm parameters must be contiguous float32");
      auto out = at::empty({N, D}, h.options().dtype(at::kBFloat16));
      const auto* yp = y.defined() ? y.data_ptr<c10::BFloat16>() : nullptr;
      at::parallel_for(0, N, 64, [&](int64_t n0, int64_t n1) {
        add_layer_norm_rows(h.data_ptr<float>(), yp, w.data_ptr<float>(), b.data_ptr<float>(),
                            out.data_ptr<c10::BFloat16>(), n0, n1, D, static_cast<float>(ln_eps));
      });
      return out;
    };
    for (const auto& w : layers) {
      y = decode_linear(attention(add_norm(w[0], w[1]), w), w[4], w[5]);                    // attention out W + b
      auto f = decode_linear(add_norm(w[6], w[7]), w[8], w[9]);
      y = decode_linear(at::gelu_(f), w[10], w[11]);                                           // GELU(ff1) W + b
    }
    h.add_(y);
  } else {
    TORCH_CHECK(dtype == h.scalar_type(), "decode_step: the products must be bfloat16 or h's dtype");
    for (const auto& w : layers) {        // h + x W + b as one addmm into h
      h = at::addmm(h, attention(at::layer_norm(h, {D}, w[0], w[1], ln_eps), w), w[4]).add_(w[5]);
      auto f = at::addmm(w[9], at::layer_norm(h, {D}, w[6], w[7], ln_eps), w[8]);
      h = at::addmm(h, at::gelu_(f), w[10]).add_(w[11]);
    }
  }
  return at::addmm(head[3], at::layer_norm(h, {D}, head[0], head[1], ln_eps), head[2]);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Causal linear attention numerator (CPU): out_i = sum_{j<=i} (q_i . k_j) v_j";
  m.def("forward", &causal_product_forward, "forward(q, k, v) -> out; q, k (N,H,L,E), v (N,H,L,M)");
  m.def("backward", &causal_product_backward,
        "backward(q, k, v, grad_out) -> (grad_q, grad_k, grad_v)");
  m.def("attention_forward", &attention_forward_cpu, pybind11::arg("q"), pybind11::arg("k"), pybind11::arg("v"),
        pybind11::arg("eps"), pybind11::arg("state") = pybind11::none(),
        "attention_forward(q, k, v, eps, state=None) -> (out, inv): normalised elu+1 attention on raw q, k");
  m.def("attention_state", &attention_state, "attention_state(like, N*H, E, M) -> zero decoding state");
  m.def("attention_backward", &attention_backward_cpu,
        "attention_backward(q, k, v, out, inv, grad_out, grad_q, grad_k, grad_v): writes the gradients");
  m.def("decode_linear", &decode_linear,
        "decode_linear(x, W, b) -> b + x W in W's dtype (bfloat16 W, few rows: widened and summed in float32)");
  m.def("decode_step", &decode_step_cpu,
        "decode_step(h, layers, head, n_heads, ln_eps, eps) -> params: one position of a linear PixelTransformer");
}

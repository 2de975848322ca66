// The whole normalised attention of the model on the CPU, fused (attention_forward /
// attention_backward), with the recurrence of numerator.cpp (vec.h's update_and_read):
// phi(x) = elu(x) + 1 applied to raw q, k inside the sweeps, the
// denominator phi(q_t) . z_t (z = sum phi(k_j)) carried beside S rather than as a padded ones
// column, the division done in place, and inputs and outputs read and written through their
// strides (the model's q, k, v are views of one projection; out is written (N, L, H, M) so that
// merging heads is free). Only 1 / (den + eps) per position is kept for the backward pass.
// It also takes bfloat16 q, k, v (autocast training): rows are widened to float32 as they are
// read, every sum runs in float32, and out and the gradients are rounded (to nearest even) as
// they are written, so the model's projections feed it with no casts around it.
// Decoding one position at a time is attention_forward with L = 1 and a state (attention_state).
// mapped: q and k are features already (another feature map, applied by the caller, whose autograd
// carries the gradient through it): phi is the identity and phi' is 1, the rest as above; the
// numerator kernel's form, [v, 1] through causal_product and a division, ran the state 33 columns
// wide (48 padded) at M = 32, in three backward sweeps over the rows and a fourth pass to divide.

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/util/BFloat16.h>

#include "cpu_kernel.h"
#include "vec.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <utility>
#include <tuple>
#include <type_traits>
#include <vector>

namespace {

// The fused attention's storage types: float, double, and bfloat16 computed in float.
template <typename S> struct Compute { using type = S; };
template <> struct Compute<c10::BFloat16> { using type = float; };
template <typename S> using compute_t = typename Compute<S>::type;

inline __attribute__((always_inline)) svec_t<float> phi_vec(svec_t<float> u) {
  using V = svec_t<float>;
  return u > 0.0f ? u + 1.0f : exp_nonpositive(u > 0.0f ? V{} : u);
}

// y[0, D) = phi(x[0, D)) = elu(x) + 1, y[D, Dp) = 0; y holds padded(D) values; x may be bfloat16.
// float rows are read straight from x, whole vectors at a time: copied into y and read back at once,
// the loads waited on the copy's stores (a fifth of the fused forward's time at E = 32).
template <typename S>
inline __attribute__((always_inline)) void phi_row(const S* x, float* y, int64_t D) {
  int64_t i = 0;
  if constexpr (std::is_same_v<S, float>)
    for (; i + kSweep<float> <= D; i += kSweep<float>) sstore(y + i, phi_vec(sload(x + i)));
  if (i < D) {
    convert_row(x + i, y + i, D - i);
    for (; i < D; i += kSweep<float>) sstore(y + i, phi_vec(sload(y + i)));
  }
  std::fill(y + D, y + padded<float>(D), 0.0f);
}
inline __attribute__((always_inline)) void phi_row(const double* x, double* y, int64_t D) {
  for (int64_t i = 0; i < D; ++i) y[i] = x[i] > 0 ? x[i] + 1 : std::exp(x[i]);
  std::fill(y + D, y + padded<double>(D), 0.0);
}

// y = the features of x, padded as phi_row's: phi(x), or (Mapped) x itself.
template <bool Mapped, typename S, typename T>
inline __attribute__((always_inline)) void feature_row(const S* x, T* y, int64_t D) {
  if constexpr (Mapped) {
    convert_row(x, y, D);
    std::fill(y + D, y + padded<T>(D), T(0));
  } else {
    phi_row(x, y, D);
  }
}

// A (L, D) matrix of one (n, h) pair read or written through its row stride.
template <typename T> struct Rows {
  T* p;
  int64_t stride;
  T* operator[](int64_t t) const { return p + t * stride; }
  // Ask for row t's cache lines ahead of use: the rows of one head lie a whole position apart
  // (heads-last views of one projection), and the backward's first pass stalled on them.
  void prefetch(int64_t t, int64_t D) const {
    const char* row = reinterpret_cast<const char*>(p + t * stride);
    for (int64_t b = 0; b < D * static_cast<int64_t>(sizeof(T)); b += 64) __builtin_prefetch(row + b);
  }
};
constexpr int64_t kAhead = 8;  // rows prefetched ahead

// Forward of one (n, h) pair: out_t = phi(q_t)^T S_t / (phi(q_t) . z_t + eps) with
// S_t = sum_{j<=t} phi(k_j) v_j^T (E x M) and z_t = sum_{j<=t} phi(k_j); inv_t = 1 / (den_t + eps).
// Steps go kSteps at a time through the state: S (E, Mp) followed by z (Ep), state_size<T>(E, M)
// values, read at the start (zeros for a whole sequence) and left at its end (for decoding). stream:
// write out with non-temporal stores (whole sequences; a decoding step reads its row back at once).
template <typename T>
int64_t state_size(int64_t E, int64_t M) { return E * padded<T>(M) + padded<T>(E); }

template <typename S, int64_t D, bool Mapped, typename T = compute_t<S>>
inline __attribute__((always_inline)) void attention_forward_head(
    Rows<const S> q, Rows<const S> k, Rows<const S> v, Rows<S> out, T* inv, int64_t L, int64_t E_, int64_t M_,
    T eps, T* state, T* work, bool stream) {
  const int64_t E = D ? D : E_, M = D ? D : M_;  // D: E = M known when compiled (see kHeadDim)
  const int64_t Ep = padded<T>(E), Mp = padded<T>(M);
  T *z = state + E * Mp, *qf = work, *kf = qf + kSteps * Ep, *v_row = kf + kSteps * Ep,
    *o = v_row + kSteps * Mp;  // work: kSteps rows each of phi(q), phi(k), v, out
  // phi_row pads its rows and the sweep writes whole out rows; only v's padding must be zeros (zeroing all
  // four was a tenth of a decoding step's attention, which calls this once per position)
  if (Mp != M) std::fill(v_row, o, T(0));
  const T *qf_s[kSteps], *kf_s[kSteps], *v_s[kSteps];
  T* o_s[kSteps];
  for (int64_t t0 = 0; t0 < L; t0 += kSteps) {
    const int n = static_cast<int>(smaller(kSteps, L - t0));
    for (int s = 0; s < n; ++s) {
      const int64_t t = t0 + s;
      if (t + kAhead < L) q.prefetch(t + kAhead, E), k.prefetch(t + kAhead, E), v.prefetch(t + kAhead, M);
      qf_s[s] = qf + s * Ep, kf_s[s] = kf + s * Ep, v_s[s] = v_row + s * Mp, o_s[s] = o + s * Mp;
      feature_row<Mapped>(q[t], qf + s * Ep, E);
      feature_row<Mapped>(k[t], kf + s * Ep, E);
      convert_row(v[t], v_row + s * Mp, M);
    }
    update_and_read(state, kf_s, v_s, qf_s, o_s, n, E, Mp);
    // z after S: the state read front to back (S, then z, then the next pair's S), one stream that the
    // CPU's prefetch follows; z first stalled each decoding step's pair (docs/notes/code-measurements.md)
    for (int s = 0; s < n; ++s) {  // out's rows lie H rows apart: streamed (stream), not read in before the write
      for (int64_t i = 0; i < Ep; i += kSweep<T>) sstore(z + i, sload(z + i) + sload(kf_s[s] + i));
      inv[t0 + s] = T(1) / (dot(qf_s[s], z, Ep) + eps);
      for (int64_t m = 0; m < Mp; m += kSweep<T>) sstore(o_s[s] + m, sload(o_s[s] + m) * inv[t0 + s]);
      if (stream) stream_row(o_s[s], out[t0 + s], M);
      else convert_row(o_s[s], out[t0 + s], M);
    }
  }
}

// dst[0, E) = grad_feature * phi'(x) with phi'(x) = min(phi(x), 1), from the feature phi(x); both
// rows hold Ep (padded) values, and grad_feature is overwritten with the product. Vectors and a
// select: a scalar loop branched on feature < 1 per value (half of them mispredicted on real data)
// and took a third of the backward's time. Mapped: phi' = 1, grad_feature written as it is.
template <bool Mapped, typename S, typename T>
inline __attribute__((always_inline)) void grad_through_phi(T* __restrict__ grad_feature,
                                                            const T* __restrict__ feature, S* __restrict__ dst,
                                                            int64_t E) {
  using V = svec_t<T>;
  if constexpr (!Mapped)
    for (int64_t e = 0; e < padded<T>(E); e += kSweep<T>) {
      const V f = sload(feature + e);
      sstore(grad_feature + e, sload(grad_feature + e) * (f < T(1) ? f : V{} + T(1)));
    }
  stream_row(grad_feature, dst, E);
}

// Backward of one (n, h) pair from g = dLoss/dout. With gn_t = g_t inv_t and
// gd_t = -(g_t . out_t) inv_t (the gradients of the numerator and the denominator):
//   forward sweep   grad phi(q_t) = sum_{j<=t} phi(k_j) (v_j . gn_t) + z_t gd_t   (state S^T, M x E)
//   reverse sweep   grad phi(k_j) = sum_{t>=j} phi(q_t) (v_j . gn_t + gd_t)       (state R^T, M x E, and r)
//                   grad v_j      = sum_{t>=j} (phi(q_t) . phi(k_j)) gn_t         (state R, E x M)
// and phi'(x) = min(phi(x), 1) turns the feature gradients into grad q, grad k.
// Each sweep prepares its rows kRowBlock = kSteps positions at a time, just before the state pass
// that uses them, so that their loads (and phi's exps) overlap the previous pass's multiply-adds
// (docs/notes/code-measurements.md); phi(q), phi(k), gn
// and gd are computed by the first sweep for the whole sequence and read back by the second
// (cheaper than the exps again).
// v (and out, for gd) are read in place where they are float rows (the sweeps read v's values one
// at a time); bfloat16 ones are widened into block rows of work first.
// The gradient rows are written with stream_row (non-temporal stores).
constexpr int64_t kRowBlock = kSteps;  // a multiple of kSteps

template <typename S, int64_t D, bool Mapped, typename T>
struct BackwardRows {
  Rows<const S> q, k, v, out, g;
  const T* inv;
  int64_t L, E, M;
  T *QF, *KF, *GN, *VF, *gd, *o;  // QF, KF, GN (L, Ep or Mp); VF (kRowBlock, Mp); gd (L); o (Mp) scratch
  static constexpr bool kInPlace = std::is_same_v<S, T>;  // v's rows read where they are

  // v's row t (in place, or widened into row t - t0 of VF)
  const T* v_row(int64_t t, int64_t t0) const {
    if constexpr (kInPlace) return v[t];
    else return VF + (t - t0) * padded<T>(D ? D : M);
  }

  // Rows t0 .. t0 + n - 1: v widened into VF (bfloat16); first (the forward sweep): also phi(q_t),
  // phi(k_t), gn_t into rows t of QF, KF, GN, and gd_t; else those are read back.
  void prepare(int64_t t0, int64_t n, bool first) const {
    const int64_t E = D ? D : this->E, M = D ? D : this->M, Ep = padded<T>(E), Mp = padded<T>(M);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t t = t0 + i;
      if (t + kAhead < L) {
        v.prefetch(t + kAhead, M);
        if (first) q.prefetch(t + kAhead, E), k.prefetch(t + kAhead, E), out.prefetch(t + kAhead, M),
                   g.prefetch(t + kAhead, M);
      }
      if constexpr (!kInPlace) convert_row(v[t], VF + i * Mp, M);
      if (first) {
        T* gn = GN + t * Mp;
        for (int64_t m = 0; m < M; ++m) gn[m] = static_cast<T>(g[t][m]) * inv[t];
        for (int64_t m = M; m < Mp; ++m) gn[m] = T(0);
        feature_row<Mapped>(q[t], QF + t * Ep, E);
        feature_row<Mapped>(k[t], KF + t * Ep, E);
        if constexpr (kInPlace) {
          if (M == Mp) {  // out's row read in place
            gd[t] = -dot(gn, out[t], Mp);
            continue;
          }
        }
        convert_row(out[t], o, M);  // o zero-padded; a vector dot, not a scalar chain
        gd[t] = -dot(gn, o, Mp);
      }
    }
  }
};

template <typename S, int64_t D, bool Mapped, typename T = compute_t<S>>
inline __attribute__((always_inline)) void attention_backward_head(
    Rows<const S> q, Rows<const S> k, Rows<const S> v, Rows<const S> out, const T* inv, Rows<const S> g,
    Rows<S> gq, Rows<S> gk, Rows<S> gv, int64_t L, int64_t E_, int64_t M_, T* work) {
  const int64_t E = D ? D : E_, M = D ? D : M_;
  using V = svec_t<T>;
  constexpr int64_t B = kSweep<T>;
  const int64_t Ep = padded<T>(E), Mp = padded<T>(M);
  T *St = work, *Rt = St + M * Ep, *R = Rt + M * Ep, *z = R + E * Mp, *r = z + Ep, *acc = r + Ep,
    *o = acc + kSteps * Ep;  // acc: kSteps rows of Ep, o: kSteps rows of Mp
  T *QF = o + kSteps * Mp, *KF = QF + L * Ep, *GN = KF + L * Ep, *VF = GN + L * Mp, *gd = VF + kRowBlock * Mp;
  std::fill(work, QF, T(0));
  const BackwardRows<S, D, Mapped, T> rows{q, k, v, out, g, inv, L, E, M, QF, KF, GN, VF, gd, o};
  const T *qf_s[kSteps], *kf_s[kSteps], *gn_s[kSteps], *v_s[kSteps];
  T *acc_s[kSteps], *o_s[kSteps];
  for (int s = 0; s < kSteps; ++s) acc_s[s] = acc + s * Ep, o_s[s] = o + s * Mp;
  // gather n steps (block rows i0, i0 + dir, ...) into the pointer arrays
  auto gather = [&](int64_t b0, int64_t i0, int n, int dir) {
    for (int s = 0; s < n; ++s) {
      const int64_t i = i0 + dir * s;
      qf_s[s] = QF + (b0 + i) * Ep, kf_s[s] = KF + (b0 + i) * Ep, gn_s[s] = GN + (b0 + i) * Mp;
      v_s[s] = rows.v_row(b0 + i, b0);
    }
  };
  for (int64_t b0 = 0; b0 < L; b0 += kRowBlock) {
    const int64_t nb = smaller(kRowBlock, L - b0);
    rows.prepare(b0, nb, true);
    for (int64_t i0 = 0; i0 < nb; i0 += kSteps) {
      const int n = static_cast<int>(smaller(kSteps, nb - i0));
      gather(b0, i0, n, 1);
      update_and_read(St, v_s, kf_s, gn_s, acc_s, n, M, Ep);
      for (int s = 0; s < n; ++s) {
        const int64_t t = b0 + i0 + s;
        for (int64_t i = 0; i < Ep; i += B) {
          const V z_new = sload(z + i) + sload(kf_s[s] + i);
          sstore(z + i, z_new);
          sstore(acc_s[s] + i, sload(acc_s[s] + i) + gd[t] * z_new);
        }
        grad_through_phi<Mapped>(acc_s[s], qf_s[s], gq[t], E);
      }
    }
  }
  for (int64_t b1 = L; b1 > 0; b1 -= kRowBlock) {
    const int64_t b0 = b1 > kRowBlock ? b1 - kRowBlock : 0;
    rows.prepare(b0, b1 - b0, false);
    for (int64_t i0 = b1 - b0 - 1; i0 >= 0; i0 -= kSteps) {
      const int n = static_cast<int>(smaller(kSteps, i0 + 1));
      gather(b0, i0, n, -1);
      update_and_read(R, qf_s, gn_s, kf_s, o_s, n, E, Mp);
      update_and_read(Rt, gn_s, qf_s, v_s, acc_s, n, M, Ep);
      for (int s = 0; s < n; ++s) {
        const int64_t t = b0 + i0 - s;
        stream_row(o_s[s], gv[t], M);
        for (int64_t i = 0; i < Ep; i += B) {
          const V r_new = sload(r + i) + gd[t] * sload(qf_s[s] + i);
          sstore(r + i, r_new);
          sstore(acc_s[s] + i, sload(acc_s[s] + i) + r_new);
        }
        grad_through_phi<Mapped>(acc_s[s], kf_s[s], gk[t], E);
      }
    }
  }
  stream_fence();  // stream_row's stores, visible before the pair is done
}

template <typename T>
int64_t attention_scratch(int64_t L, int64_t E, int64_t M) {  // backward (forward: L = 0)
  const int64_t Ep = padded<T>(E), Mp = padded<T>(M);
  return 2 * M * Ep + E * Mp + (2 + 2 * kSteps) * Ep + 3 * kSteps * Mp + kRowBlock * Mp + L * (2 * Ep + Mp + 1);  // >= forward's
}

// Entry points per storage type (f32, f64, bf16), cloned as above. Each has a copy compiled for
// E = M = kHeadDim (vec.h), whose row loops have fixed counts, and one for mapped features (phi the identity).
#define ATTENTION_ENTRY_POINTS(S, suffix)                                                                    \
  CP_MULTIVERSION void attention_forward_##suffix(Rows<const S> q, Rows<const S> k, Rows<const S> v,        \
                                                  Rows<S> out, compute_t<S>* inv, int64_t L, int64_t E,     \
                                                  int64_t M, compute_t<S> eps, compute_t<S>* state,         \
                                                  compute_t<S>* work, bool stream, bool mapped) {           \
    const bool fixed = E == kHeadDim && M == kHeadDim;                                                      \
    if (mapped && fixed)                                                                                    \
      attention_forward_head<S, kHeadDim, true>(q, k, v, out, inv, L, E, M, eps, state, work, stream);      \
    else if (mapped)                                                                                        \
      attention_forward_head<S, 0, true>(q, k, v, out, inv, L, E, M, eps, state, work, stream);             \
    else if (fixed)                                                                                         \
      attention_forward_head<S, kHeadDim, false>(q, k, v, out, inv, L, E, M, eps, state, work, stream);     \
    else                                                                                                    \
      attention_forward_head<S, 0, false>(q, k, v, out, inv, L, E, M, eps, state, work, stream);            \
  }                                                                                                         \
  CP_MULTIVERSION void attention_backward_##suffix(Rows<const S> q, Rows<const S> k, Rows<const S> v,       \
                                                   Rows<const S> out, const compute_t<S>* inv,              \
                                                   Rows<const S> g, Rows<S> gq, Rows<S> gk, Rows<S> gv,     \
                                                   int64_t L, int64_t E, int64_t M, compute_t<S>* work,     \
                                                   bool mapped) {                                           \
    const bool fixed = E == kHeadDim && M == kHeadDim;                                                      \
    if (mapped && fixed)                                                                                    \
      attention_backward_head<S, kHeadDim, true>(q, k, v, out, inv, g, gq, gk, gv, L, E, M, work);          \
    else if (mapped)                                                                                        \
      attention_backward_head<S, 0, true>(q, k, v, out, inv, g, gq, gk, gv, L, E, M, work);                 \
    else if (fixed)                                                                                         \
      attention_backward_head<S, kHeadDim, false>(q, k, v, out, inv, g, gq, gk, gv, L, E, M, work);         \
    else                                                                                                    \
      attention_backward_head<S, 0, false>(q, k, v, out, inv, g, gq, gk, gv, L, E, M, work);                \
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

void check_unit_stride(const at::Tensor& x, const char* name) {
  TORCH_CHECK(x.dim() == 4 && x.stride(3) == 1, "linear attention (CPU kernel): ", name,
              " must be 4-d with a contiguous last dimension");
}
}  // namespace

// The dtype the fused attention computes in for storage dtype `dtype`: float32 for bfloat16.
at::ScalarType compute_type(at::ScalarType dtype) { return dtype == at::kBFloat16 ? at::kFloat : dtype; }

#define DISPATCH_ATTENTION_TYPES(dtype, name, ...) \
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, dtype, name, __VA_ARGS__)

// Fused attention: raw q, k (N, H, L, E), v (N, H, L, M), float32, float64 or bfloat16, any
// strides with a contiguous last dim -> (out (N, H, L, M) of their dtype laid out (N, L, H, M),
// inv (N, H, L) = 1 / (den + eps) in the compute dtype).
// With a state (from attention_state) the sequence continues from it and leaves it at its end:
// decoding one position at a time is this call with L = 1. mapped: q, k are features (no phi).
std::tuple<at::Tensor, at::Tensor> attention_forward_cpu(at::Tensor q, at::Tensor k, at::Tensor v, double eps,
                                                         std::optional<at::Tensor> state, bool mapped) {
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
      Scratch<T> work(attention_scratch<T>(0, E, M));  // no per-position rows
      for (int64_t i = begin; i < end; ++i) {
        T* S = states ? states + i * state_n : work.data();
        if (!states) std::fill(S, S + state_n, T(0));
        attention_forward<scalar_t>(hq[i], hk[i], hv[i], ho[i], invs + i * L, L, E, M, static_cast<T>(eps), S,
                                    work.data() + state_n, !states, mapped);
      }
      if (!states) stream_fence();  // stream_row's stores, visible before out is used
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
// dim: views of one buffer, say, so that their caller need not concatenate them). mapped: as the forward's.
void attention_backward_cpu(at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor out, at::Tensor inv,
                            at::Tensor grad_out, at::Tensor gq, at::Tensor gk, at::Tensor gv, bool mapped) {
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
      Scratch<T> work(attention_scratch<T>(L, E, M));
      for (int64_t i = begin; i < end; ++i)
        attention_backward<scalar_t>(hq[i], hk[i], hv[i], ho[i], invs + i * L, hg[i], hgq[i], hgk[i], hgv[i], L, E,
                                     M, work.data(), mapped);
    });
  });
}

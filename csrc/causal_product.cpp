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
// The state's columns are processed in blocks of one 64-byte SIMD vector (16 floats or 8
// doubles; C zero-padded to a multiple), the output block accumulating in a register over D.

// Light headers (not torch/extension.h): tensors, dispatch, parallel_for and pybind only.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
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

// Scratch for causal_dot_head: the state (D, padded C), one padded row of c, one of out.
template <typename T>
int64_t scratch_size(int64_t D, int64_t C) { return (D + 2) * padded<T>(C); }

// out_t = sum_{j<=t} (a_t . b_j) c_j (reverse: j >= t) for one (n, h) pair.
// a, b (L, D); c, out (L, C); work: scratch_size<T>(D, C) values.
template <typename T>
inline __attribute__((always_inline)) void causal_dot_head(
    const T* __restrict__ a, const T* __restrict__ b, const T* __restrict__ c, T* __restrict__ out,
    T* __restrict__ work, int64_t L, int64_t D, int64_t C, bool reverse) {
  using V = vec_t<T>;
  constexpr int64_t B = kBlock<T>;
  const int64_t Cp = padded<T>(C);
  T* S = work;               // (D, Cp) state; the padding columns stay zero
  T* c_row = S + D * Cp;     // (Cp) c_t, zero-padded
  T* o_row = c_row + Cp;     // (Cp) out_t before trimming to C
  std::fill(work, work + (D + 1) * Cp, T(0));
  for (int64_t s = 0; s < L; ++s) {
    const int64_t t = reverse ? L - 1 - s : s;
    const T *a_t = a + t * D, *b_t = b + t * D;
    std::copy(c + t * C, c + (t + 1) * C, c_row);
    for (int64_t m0 = 0; m0 < Cp; m0 += B) {  // one block of B state columns
      const V c_blk = load(c_row + m0);
      V acc = {};
      for (int64_t d = 0; d < D; ++d) {
        T* row = S + d * Cp + m0;
        const V r = load(row) + b_t[d] * c_blk;  // S[d, block] += b_t[d] c_t[block]
        store(row, r);
        acc += a_t[d] * r;                       // out_t[block] += a_t[d] S[d, block]
      }
      store(o_row + m0, acc);
    }
    std::copy(o_row, o_row + C, out + t * C);
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
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
              "causal_product: expected 4-d q, k (N, H, L, E) and v (N, H, L, M)");
  TORCH_CHECK(q.sizes() == k.sizes(), "causal_product: q and k must have the same shape (N, H, L, E)");
  TORCH_CHECK(v.size(0) == q.size(0) && v.size(1) == q.size(1) && v.size(2) == q.size(2),
              "causal_product: v must share (N, H, L) with q");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type(),
              "causal_product: q, k, v must share one dtype");
  TORCH_CHECK(q.scalar_type() == at::kFloat || q.scalar_type() == at::kDouble,
              "causal_product (CPU kernel): float32 or float64 only, got ", q.scalar_type());
}

}  // namespace

// q, k (N, H, L, E), v (N, H, L, M) -> out (N, H, L, M)
at::Tensor causal_product_forward(at::Tensor q, at::Tensor k, at::Tensor v) {
  check_inputs(q, k, v);
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

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Causal linear attention numerator (CPU): out_i = sum_{j<=i} (q_i . k_j) v_j";
  m.def("forward", &causal_product_forward, "forward(q, k, v) -> out; q, k (N,H,L,E), v (N,H,L,M)");
  m.def("backward", &causal_product_backward,
        "backward(q, k, v, grad_out) -> (grad_q, grad_k, grad_v)");
}

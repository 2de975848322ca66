// The vector helpers of the CPU kernel, shared by numerator.cpp, fused_attention.cpp and
// decode_step.cpp: one 64-byte SIMD vector and its loads and stores, the state sweep
// (update_and_read: the recurrence every causal product runs, on AVX-512 or AVX2 vectors, see
// CP_SWEEP_BYTES), row copies and conversions, lane sums, and the bfloat16 widening load.
// Everything here is inlined into its callers (internal linkage, as when it was one file); the
// entry points each source clones per vector unit are marked CP_MULTIVERSION.
#pragma once

#include <c10/util/BFloat16.h>

#if defined(__AVX512F__)
#include <immintrin.h>
#elif defined(__SSE__)
#include <xmmintrin.h>
#endif

#include <cstdint>
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
// it; a 32-byte one otherwise. AVX2's 16 ymm registers cannot hold 4 steps x 2 blocks of 64-byte
// accumulators and inputs (32 ymm): GCC spilled them to the stack at every step, and the sweeps ran
// several times slower than the chunked PyTorch form. On AVX2 a pass takes 2 steps over 2 blocks of
// 32 bytes (8 accumulators and inputs), which measured faster than 4 steps over one block
// (docs/speed.md, "The backward").
// Padding stays a multiple of kBlock (64 bytes), which is a multiple of either.
#if defined(__AVX512F__)
#define CP_SWEEP_BYTES 64
constexpr int kSteps = 4;  // steps per state pass
#else
#define CP_SWEEP_BYTES 32
constexpr int kSteps = 2;
#endif
// Every preset's head size (d_model / n_heads): the sweeps' callers compile a copy for E = M = kHeadDim whose
// row loops have fixed counts (the fused backward 215 -> 186 ns a position and head, docs/notes/speed.md).
constexpr int64_t kHeadDim = 32;
template <typename T> struct SweepSimd { typedef T type __attribute__((vector_size(CP_SWEEP_BYTES))); };
template <typename T> using svec_t = typename SweepSimd<T>::type;
template <typename T> constexpr int64_t kSweep = sizeof(svec_t<T>) / sizeof(T);
template <typename T>
inline __attribute__((always_inline)) svec_t<T> sload(const T* p) { svec_t<T> x; __builtin_memcpy(&x, p, sizeof x); return x; }
template <typename T>
inline __attribute__((always_inline)) void sstore(T* p, svec_t<T> x) { __builtin_memcpy(p, &x, sizeof x); }

// exp(x) for x <= 0 on one sweep vector of floats (phi in fused_attention.cpp, the mixture's sigmoid) (Cephes expf: range reduction to |r| <= ln2/2,
// degree-7 polynomial, 2^n through the exponent bits); relative error < 2e-7, down to
// x = -87 (below, the result is clamped near 1.6e-38).
// On the sweep vector (CP_SWEEP_BYTES): GCC lowered the 64-byte selects to scalar code on AVX2.
typedef int32_t vec_i32 __attribute__((vector_size(CP_SWEEP_BYTES)));
inline __attribute__((always_inline)) svec_t<float> exp_nonpositive(svec_t<float> x) {
  using V = svec_t<float>;
  x = x < -87.0f ? V{} - 87.0f : x;
#if CP_SWEEP_BYTES == 64 && defined(__AVX512F__)  // round and 2^n in one instruction each (vrndscaleps, vscalefps)
  const V nf = (V)_mm512_roundscale_ps((__m512)(x * 1.44269504088896341f), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#else
  const vec_i32 n = __builtin_convertvector(x * 1.44269504088896341f - 0.5f, vec_i32);  // round(x / ln2), x <= 0
  const V nf = __builtin_convertvector(n, V);
#endif
  const V r = x - nf * 0.693359375f + nf * 2.12194440e-4f;
  V p = V{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
#if CP_SWEEP_BYTES == 64 && defined(__AVX512F__)
  return (V)_mm512_scalef_ps((__m512)p, (__m512)nf);
#else
  return p * (V)((n + 127) << 23);
#endif
}

// log(x) for normal positive x on one sweep vector of floats (the guided draw's log-probabilities in draw.cpp;
// callers clamp x at float32's smallest normal, 2^-126) (Cephes logf: x = m 2^e with m in [sqrt(1/2), sqrt(2)),
// log(m) = f - f^2/2 + f^3 P(f) for f = m - 1, P of degree 8, e ln 2 added in two parts); relative error ~1e-7.
// NaN stays NaN.
inline __attribute__((always_inline)) svec_t<float> log_normal(svec_t<float> x) {
  using V = svec_t<float>;
  vec_i32 bits;
  __builtin_memcpy(&bits, &x, sizeof bits);
  vec_i32 e = (bits >> 23) - 126;                            // x = m 2^e, m in [1/2, 1)
  bits = (bits & 0x007fffff) | 0x3f000000;
  V m;
  __builtin_memcpy(&m, &bits, sizeof m);
  const auto small = m < 0.70710678118654752f;              // m < sqrt(1/2): m -> 2 m, e -> e - 1
  e = small ? e - 1 : e;
  const V f = (small ? m + m : m) - 1.0f;
  const V ef = __builtin_convertvector(e, V);
  const V z = f * f;
  V y = V{} + 7.0376836292e-2f;
  y = y * f - 1.1514610310e-1f;
  y = y * f + 1.1676998740e-1f;
  y = y * f - 1.2420140846e-1f;
  y = y * f + 1.4249322787e-1f;
  y = y * f - 1.6668057665e-1f;
  y = y * f + 2.0000714765e-1f;
  y = y * f - 2.4999993993e-1f;
  y = y * f + 3.3333331174e-1f;
  y = y * f * z - 2.12194440e-4f * ef - 0.5f * z;
  const V result = f + y + 0.693359375f * ef;
  return x == x ? result : x;
}

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
    if (c0 + 2 * B <= Cp) {
      update_and_read_blocks<T, 2, NT>(rows + c0, a, b_c, w, out_c, R, Cp);
      c0 += 2 * B;
    } else {
      update_and_read_blocks<T, 1, NT>(rows + c0, a, b_c, w, out_c, R, Cp);
      c0 += B;
    }
  }
}

// update_and_read_steps for any n <= kSteps steps.
template <typename T>
inline __attribute__((always_inline)) void update_and_read(T* rows, const T* const* a, const T* const* b,
                                                           const T* const* w, T* const* out, int n, int64_t R,
                                                           int64_t Cp) {
  if (n == kSteps) return update_and_read_steps<T, kSteps>(rows, a, b, w, out, R, Cp);
  for (int s = 0; s < n; ++s) update_and_read_steps<T, 1>(rows, a + s, b + s, w + s, out + s, R, Cp);
}

// n values of T of scratch starting at a 64-byte boundary, so that rows padded to whole vectors never
// straddle two cache lines. std::vector's 16-byte alignment put every row of the state across two:
// each load and store split in two, and a row stored and read back at once (the running z of the
// fused forward) could not be forwarded from the store and waited for it (a sixth of the forward).
template <typename T>
struct Scratch {
  std::vector<T> values;
  T* p;
  explicit Scratch(int64_t n) : values(n + 64 / sizeof(T)) {
    p = reinterpret_cast<T*>((reinterpret_cast<uintptr_t>(values.data()) + 63) & ~uintptr_t(63));
  }
  T* data() const { return p; }
};

// The smaller of two counts. In the target_clones entry points GCC called std::min out of line
// (4% of the fused backward).
inline __attribute__((always_inline)) int64_t smaller(int64_t a, int64_t b) { return a < b ? a : b; }

// Copy n values: whole vectors, then a scalar tail (GCC would turn a plain copy loop into a
// memmove call, which costs more than the copy for these short rows).
template <typename T>
inline __attribute__((always_inline)) void copy_row(const T* __restrict__ src, T* __restrict__ dst, int64_t n) {
  int64_t i = 0;
  for (; i + kSweep<T> <= n; i += kSweep<T>) sstore(dst + i, sload(src + i));  // sweep vectors: see dot
  for (; i < n; ++i) dst[i] = src[i];
}

// Copy n values converting between storage S and compute T (bfloat16 -> float is exact;
// float -> bfloat16 rounds to nearest even, as torch does).
template <typename To, typename From>
inline __attribute__((always_inline)) void convert_row(const From* __restrict__ src, To* __restrict__ dst,
                                                       int64_t n) {
  if constexpr (std::is_same_v<To, From>) copy_row(src, dst, n);
  else for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<To>(src[i]);
}

// Write n values converting from compute T to storage S, bypassing the cache where it can (x86:
// float rows of whole 16-byte groups at aligned addresses, non-temporal stores), for rows written
// once and not read again soon (the backward's gradients: the lines of fresh rows were otherwise
// read in before each write). stream_fence() must follow before the rows are used.
template <typename S, typename T>
inline __attribute__((always_inline)) void stream_row(const T* __restrict__ src, S* __restrict__ dst, int64_t n) {
#if defined(__SSE__)
  if constexpr (std::is_same_v<S, float> && std::is_same_v<T, float>) {
#if defined(__AVX512F__)
    if (n % 16 == 0 && reinterpret_cast<uintptr_t>(dst) % 64 == 0) {  // whole lines: one store each
      for (int64_t i = 0; i < n; i += 16) _mm512_stream_ps(dst + i, _mm512_loadu_ps(src + i));
      return;
    }
#endif
    if (n % 4 == 0 && reinterpret_cast<uintptr_t>(dst) % 16 == 0) {
      for (int64_t i = 0; i < n; i += 4) _mm_stream_ps(dst + i, _mm_loadu_ps(src + i));
      return;
    }
  }
#endif
  convert_row(src, dst, n);
}

inline void stream_fence() {
#if defined(__SSE__)
  _mm_sfence();
#endif
}

// Sum of the lanes of x (a 64-byte or sweep vector) as a tree (a chain of lane additions would
// cost ~4 cycles per lane).
template <typename T, typename Vec>
inline __attribute__((always_inline)) T hsum(Vec x) {
  constexpr int64_t n = sizeof(Vec) / sizeof(T);
  T lanes[n];
  __builtin_memcpy(lanes, &x, sizeof x);
  for (int64_t w = n / 2; w >= 1; w /= 2)
    for (int64_t i = 0; i < w; ++i) lanes[i] += lanes[i + w];
  return lanes[0];
}

// On sweep vectors: with AVX2, GCC split 64-byte vectors in short loops like this one through the
// stack, and the halves' stores stalled the next loads (docs/notes/code-measurements.md).
template <typename T>
inline __attribute__((always_inline)) T dot(const T* a, const T* b, int64_t Dp) {  // Dp: a multiple of kBlock
  svec_t<T> acc = {};
  for (int64_t i = 0; i < Dp; i += kSweep<T>) acc += sload(a + i) * sload(b + i);
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float>) {  // in registers: hsum's stores and scalar reloads sat in the
    __m512 m;                                // fused forward's chain from z to 1 / den
    __builtin_memcpy(&m, &acc, sizeof m);
    return _mm512_reduce_add_ps(m);
  }
#endif
  return hsum<T>(acc);
}

// 16 bfloat16 values widened to one vector of float32 (bfloat16 is float32's upper half).
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

}  // namespace

// The entry points of each source (per dtype), cloned for AVX-512 / AVX2 / baseline x86-64
// when the build uses flags valid on any x86-64 (without CP_NATIVE): the clones pick the widest
// vector unit at load time (GCC function multiversioning), so such a build stays portable.
// A -march=native build (imagegen's, always: ops/build.py defines CP_NATIVE) is for this CPU alone and needs
// no clones; cloning there also crashes GCC 12 on AVX-512 CPUs (an internal compiler error in
// expand_direct_optab_fn: the vectorizer, set up for the native target, emits operations the
// narrower clones cannot expand).
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && !defined(CP_NATIVE)
#define CP_MULTIVERSION __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define CP_MULTIVERSION
#endif

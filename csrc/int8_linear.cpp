// int8 products (precision=int8, decoding and evaluation): out (N, O) = b + x W for float32 rows
// x (N, K), any N (4 rows per pass over each panel), and W rounded to 8 bits per output column
// (w ~ scale[o] * q, q in [-127, 127]), the int8 counterpart of decode_step.cpp's linear_f32_panels.
// torch's fbgemm dynamic linear quantizes a whole batch with one scale and packs x at every call;
// which of the two is faster at a batch is measured (imagegen.ops.int8's probe).
//
// Each row of x is quantized on the fly, symmetric with its own scale: sx = max|x| / 127,
// xs = round(x * (127 / max|x|)) in [-127, 127] (nearest even), stored unsigned as xu = xs + 128, since
// AVX512-VNNI's vpdpbusd multiplies unsigned by signed bytes. Then, exactly in int32,
//   acc[n][o] = sum_k xu[n][k] q[k][o] - 128 colsum[o]  (= sum_k xs[n][k] q[k][o]),
// colsum[o] = sum_k q[k][o] computed once at pack time, and
//   out[n][o] = float(acc[n][o]) * (sx[n] * scale[o]) + b[o]   in float32.
// |acc| <= K * 255 * 127 stays in int32 for K <= 65536 (checked).
//
// W's layout (imagegen.ops.int8.pack_int8): (ceil(O / 64), ceil(K / 4), 64, 4) int8: panels of 64
// output columns; in a panel, per group of 4 consecutive k, each column's 4 weights together (one
// 32-bit lane of vpdpbusd), so one group of one panel is 4 zmm of 64 bytes. Padding (k >= K,
// o >= O) is zero; x's padding is xs = 0.
//
// Three forms compute the same int32 sums: int8_panel_vnni (AVX512-VNNI), int8_panel_avx2 (AVX2, a sign
// trick against vpmaddubsw's saturation) and int8_panel (elsewhere); why, in docs/notes/code-measurements.md.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include "cpu_kernel.h"
#include "vec.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define CP_HAVE_VNNI_PATH 1
#define CP_HAVE_AVX2_PATH 1
#endif

namespace {

constexpr int64_t kI8Cols = 64;   // columns per panel
constexpr int64_t kI8Group = 4;   // consecutive k per 32-bit lane
constexpr int kI8MaxRows = 4;     // rows per pass over a panel

// ---- quantizing x ----------------------------------------------------------------------------
// Row n of x (K floats) -> xu (Kp bytes, the padding xs = 0, i.e. 128) and its scale sx.
void quantize_row(const float* x, uint8_t* xu, float* sx, int64_t K, int64_t Kp) {
  float amax = 0.0f;
  for (int64_t k = 0; k < K; ++k) amax = std::max(amax, std::fabs(x[k]));
  const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
  *sx = amax / 127.0f;
  for (int64_t k = 0; k < K; ++k) {
    // nearbyint of the rounded product (a call: never contracted into a fused multiply-add)
    const float v = std::nearbyint(x[k] * inv);
    xu[k] = static_cast<uint8_t>(static_cast<int32_t>(std::min(127.0f, std::max(-127.0f, v))) + 128);
  }
  for (int64_t k = K; k < Kp; ++k) xu[k] = 128;
}

#ifdef CP_HAVE_VNNI_PATH
#define CP_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))

CP_VNNI void quantize_row_vnni(const float* x, uint8_t* xu, float* sx, int64_t K, int64_t Kp) {
  const int64_t Kv = K / 16 * 16;
  __m512 m = _mm512_setzero_ps();
  for (int64_t k = 0; k < Kv; k += 16) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(x + k)));
  float amax = _mm512_reduce_max_ps(m);
  for (int64_t k = Kv; k < K; ++k) amax = std::max(amax, std::fabs(x[k]));
  const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
  *sx = amax / 127.0f;
  const __m512 vinv = _mm512_set1_ps(inv);
  const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127), off = _mm512_set1_epi32(128);
  for (int64_t k = 0; k < Kv; k += 16) {
    // product rounded to float32, then to the nearest integer (ties to even: MXCSR's default)
    const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + k), vinv));
    const __m512i u = _mm512_add_epi32(_mm512_min_epi32(_mm512_max_epi32(q, lo), hi), off);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(xu + k), _mm512_cvtepi32_epi8(u));
  }
  for (int64_t k = Kv; k < K; ++k) {
    const float v = std::nearbyint(x[k] * inv);
    xu[k] = static_cast<uint8_t>(static_cast<int32_t>(std::min(127.0f, std::max(-127.0f, v))) + 128);
  }
  for (int64_t k = K; k < Kp; ++k) xu[k] = 128;
}

// acc + the 4-byte dot products of u (unsigned) and s (signed) per int32 lane: vpdpbusd through inline
// asm, its value passed in and out (no address taken, so the sums stay in registers). GCC 12 compiles
// _mm512_dpbusd_epi32 in int8_panel_vnni's loop with two register copies per vpdpbusd (each sum copied
// out and back every group), which took half the vector unit's slots (docs/notes/code-measurements.md).
CP_VNNI inline __attribute__((always_inline)) __m512i dpbusd(__m512i acc, __m512i u, __m512i s) {
  asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s));
  return acc;
}

// One panel for NR rows: 4 zmm of int32 sums per row (64 columns), each group's 4 weight vectors
// loaded once for all rows. One row keeps two sets of sums (even and odd groups), so that two
// vpdpbusd chains per vector hide its latency.
template <int NR>
CP_VNNI inline __attribute__((always_inline)) void int8_panel_vnni(const uint8_t* xu, const float* sx,
                                                                   const int8_t* w, const float* scale,
                                                                   const int32_t* colsum, const float* b,
                                                                   float* out, int64_t G, int64_t ldx,
                                                                   int64_t ldo) {
  constexpr int S = NR == 1 ? 2 : 1;  // sets of sums
  __m512i acc[S][NR][4];
  for (int j = 0; j < 4; ++j) {
    // -128 colsum: the xu = xs + 128 offset taken back
    const __m512i c = _mm512_mullo_epi32(_mm512_loadu_si512(colsum + 16 * j), _mm512_set1_epi32(-128));
    for (int n = 0; n < NR; ++n) {
      acc[0][n][j] = c;
      if (S == 2) acc[S - 1][n][j] = _mm512_setzero_si512();
    }
  }
  int64_t g = 0;
  for (; g + S <= G; g += S)
    for (int s = 0; s < S; ++s) {
      const int8_t* wg = w + (g + s) * (kI8Cols * kI8Group);
      __m512i wv[4];
      for (int j = 0; j < 4; ++j) wv[j] = _mm512_loadu_si512(wg + 64 * j);
      for (int n = 0; n < NR; ++n) {
        int32_t x4;
        std::memcpy(&x4, xu + n * ldx + (g + s) * kI8Group, 4);
        const __m512i xv = _mm512_set1_epi32(x4);
        for (int j = 0; j < 4; ++j) acc[s][n][j] = dpbusd(acc[s][n][j], xv, wv[j]);
      }
    }
  for (; g < G; ++g) {  // one row, odd G: the last group
    const int8_t* wg = w + g * (kI8Cols * kI8Group);
    for (int n = 0; n < NR; ++n) {
      int32_t x4;
      std::memcpy(&x4, xu + n * ldx + g * kI8Group, 4);
      const __m512i xv = _mm512_set1_epi32(x4);
      for (int j = 0; j < 4; ++j) acc[0][n][j] = dpbusd(acc[0][n][j], xv, _mm512_loadu_si512(wg + 64 * j));
    }
  }
  for (int j = 0; j < 4; ++j) {
    const __m512 sc = _mm512_loadu_ps(scale + 16 * j), bias = _mm512_loadu_ps(b + 16 * j);
    for (int n = 0; n < NR; ++n) {
      __m512i a = acc[0][n][j];
      if (S == 2) a = _mm512_add_epi32(a, acc[S - 1][n][j]);
      const __m512 s = _mm512_mul_ps(_mm512_set1_ps(sx[n]), sc);
      _mm512_storeu_ps(out + n * ldo + 16 * j, _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(a), s), bias));
    }
  }
}
#endif  // CP_HAVE_VNNI_PATH

#ifdef CP_HAVE_AVX2_PATH
// AVX2 (GCC keeps the command line's ISA too: a -march=native build on an AVX-512 CPU may encode these
// as EVEX and use 32 ymm registers; the loops below are written for 16, so an AVX2-only CPU runs the same)
#define CP_AVX2 __attribute__((target("avx2")))

CP_AVX2 void quantize_row_avx2(const float* x, uint8_t* xu, float* sx, int64_t K, int64_t Kp) {
  const int64_t Kv = K / 8 * 8;
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 m = _mm256_setzero_ps();
  for (int64_t k = 0; k < Kv; k += 8) m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(x + k), absmask));
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
  float amax = _mm_cvtss_f32(h);
  for (int64_t k = Kv; k < K; ++k) amax = __builtin_fabsf(x[k]) > amax ? __builtin_fabsf(x[k]) : amax;
  const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
  *sx = amax / 127.0f;
  const __m256 vinv = _mm256_set1_ps(inv);
  const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127), off = _mm256_set1_epi32(128);
  for (int64_t k = 0; k < Kv; k += 8) {
    // as quantize_row_vnni: the product rounded to float32, then to the nearest integer (ties to even)
    const __m256i q = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + k), vinv));
    const __m256i u = _mm256_add_epi32(_mm256_min_epi32(_mm256_max_epi32(q, lo), hi), off);   // [1, 255]
    const __m128i u16 = _mm_packus_epi32(_mm256_castsi256_si128(u), _mm256_extracti128_si256(u, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(xu + k), _mm_packus_epi16(u16, u16));
  }
  for (int64_t k = Kv; k < K; ++k) {
    const int32_t v = _mm_cvtss_si32(_mm_set_ss(x[k] * inv));   // ties to even, as above
    xu[k] = static_cast<uint8_t>((v < -127 ? -127 : v > 127 ? 127 : v) + 128);
  }
  for (int64_t k = K; k < Kp; ++k) xu[k] = 128;
}

// Half a panel (32 columns, w: the half's first byte in group 0, groups 256 bytes apart) for NR <= 2
// rows: 4 ymm of int32 sums per row (8 columns each), |q| taken once per weight vector for all rows.
// The sign trick (see the top of this file): |q| (u8) x xs sign(q) (s8) summed in pairs by vpmaddubsw,
// the pairs in int32 by vpmaddwd; exact, and the sums are sum_k xs q (no colsum offset).
template <int NR>
CP_AVX2 inline __attribute__((always_inline)) void int8_half_avx2(const uint8_t* xu, const float* sx,
                                                                  const int8_t* w, const float* scale,
                                                                  const float* b, float* out, int64_t G,
                                                                  int64_t ldx, int64_t ldo) {
  __m256i acc[NR][4];
  for (int n = 0; n < NR; ++n)
    for (int j = 0; j < 4; ++j) acc[n][j] = _mm256_setzero_si256();
  const __m256i ones = _mm256_set1_epi16(1), flip = _mm256_set1_epi8(static_cast<char>(0x80));
  for (int64_t g = 0; g < G; ++g) {
    const int8_t* wg = w + g * (kI8Cols * kI8Group);
    __m256i xs[NR];
    for (int n = 0; n < NR; ++n) {
      int32_t x4;
      std::memcpy(&x4, xu + n * ldx + g * kI8Group, 4);
      xs[n] = _mm256_xor_si256(_mm256_set1_epi32(x4), flip);   // xu - 128 = xs, in [-127, 127]
    }
    for (int j = 0; j < 4; ++j) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wg + 32 * j));
      const __m256i u = _mm256_abs_epi8(q);                      // |q| <= 128, read as unsigned
      for (int n = 0; n < NR; ++n) {
        const __m256i pairs = _mm256_maddubs_epi16(u, _mm256_sign_epi8(xs[n], q));   // |pair| <= 32512
        acc[n][j] = _mm256_add_epi32(acc[n][j], _mm256_madd_epi16(pairs, ones));
      }
    }
  }
  for (int j = 0; j < 4; ++j) {
    const __m256 sc = _mm256_loadu_ps(scale + 8 * j), bias = _mm256_loadu_ps(b + 8 * j);
    for (int n = 0; n < NR; ++n) {
      const __m256 s = _mm256_mul_ps(_mm256_set1_ps(sx[n]), sc);
      _mm256_storeu_ps(out + n * ldo + 8 * j, _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(acc[n][j]), s), bias));
    }
  }
}

// (2 rows x 32 columns: 8 sums, 2 rows' x, |q|, q and temporaries fit AVX2's 16 registers; 4 rows or 64
// columns would not)
CP_AVX2 void int8_panel_rows_avx2(int nr, const uint8_t* xu, const float* sx, const int8_t* w, const float* scale,
                                  const int32_t*, const float* b, float* out, int64_t G, int64_t ldx, int64_t ldo) {
  for (int h = 0; h < 2; ++h)
    for (int r = 0; r < nr; r += 2) {
      const uint8_t* x = xu + r * ldx;
      const int8_t* wh = w + h * (kI8Cols / 2) * kI8Group;
      float* o = out + r * ldo + h * (kI8Cols / 2);
      if (nr - r >= 2)
        int8_half_avx2<2>(x, sx + r, wh, scale + h * 32, b + h * 32, o, G, ldx, ldo);
      else
        int8_half_avx2<1>(x, sx + r, wh, scale + h * 32, b + h * 32, o, G, ldx, ldo);
    }
}

bool cpu_has_avx2() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2");
  }();
  return has;
}
#else
bool cpu_has_avx2() { return false; }
#endif  // CP_HAVE_AVX2_PATH

// The portable panel, one row: 256 int32 partial sums, entry 4c + t holding column c's products at
// k = 4g + t (the weights summed as they lie, in runs of 16 bytes that the loop vectorizer widens),
// the 4 entries of each column added at the end.
inline __attribute__((always_inline)) void int8_panel(const uint8_t* xu, const float* sx, const int8_t* w,
                                                      const float* scale, const int32_t* colsum, const float* b,
                                                      float* out, int64_t G) {
  constexpr int64_t L = kI8Cols * kI8Group;
  int32_t acc[L];
  for (int64_t e = 0; e < L; ++e) acc[e] = 0;
  for (int64_t g = 0; g < G; ++g) {
    const int8_t* wg = w + g * L;
    const uint8_t* x4 = xu + g * kI8Group;
    int32_t pat[16];
    for (int e = 0; e < 16; ++e) pat[e] = x4[e & 3];
    for (int64_t e0 = 0; e0 < L; e0 += 16)
      for (int e = 0; e < 16; ++e) acc[e0 + e] += pat[e] * static_cast<int32_t>(wg[e0 + e]);
  }
  for (int64_t o = 0; o < kI8Cols; ++o) {
    const int32_t* a = acc + kI8Group * o;
    const int32_t sum = a[0] + a[1] + a[2] + a[3] - 128 * colsum[o];
    const float s = sx[0] * scale[o];
    const float y = static_cast<float>(sum) * s;   // rounded before the add (GCC may fuse them)
    out[o] = y + b[o];
  }
}

// One panel for nr <= kI8MaxRows rows, each loop an entry point of its own (VNNI, or cloned per
// vector unit), called once per panel through a pointer.
typedef void (*PanelFn)(int, const uint8_t*, const float*, const int8_t*, const float*, const int32_t*,
                        const float*, float*, int64_t, int64_t, int64_t);

// (the portable loop one row at a time: GCC's vectorized loop over 4 rows' sums ran 6 times slower
// than 4 passes of one row's)
CP_MULTIVERSION void int8_panel_rows(int nr, const uint8_t* xu, const float* sx, const int8_t* w, const float* scale,
                                     const int32_t* colsum, const float* b, float* out, int64_t G, int64_t ldx,
                                     int64_t ldo) {
  for (int n = 0; n < nr; ++n) int8_panel(xu + n * ldx, sx + n, w, scale, colsum, b, out + n * ldo, G);
}

#ifdef CP_HAVE_VNNI_PATH
CP_VNNI void int8_panel_rows_vnni(int nr, const uint8_t* xu, const float* sx, const int8_t* w, const float* scale,
                                  const int32_t* colsum, const float* b, float* out, int64_t G, int64_t ldx,
                                  int64_t ldo) {
  switch (nr) {
    case 1: int8_panel_vnni<1>(xu, sx, w, scale, colsum, b, out, G, ldx, ldo); break;
    case 2: int8_panel_vnni<2>(xu, sx, w, scale, colsum, b, out, G, ldx, ldo); break;
    case 3: int8_panel_vnni<3>(xu, sx, w, scale, colsum, b, out, G, ldx, ldo); break;
    default: int8_panel_vnni<4>(xu, sx, w, scale, colsum, b, out, G, ldx, ldo); break;
  }
}

bool cpu_has_vnni() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
  }();
  return has;
}
#else
bool cpu_has_vnni() { return false; }
#endif

// Panels [begin, end) for all N rows, kI8MaxRows rows per pass; the last panel, when O is not a
// multiple of 64, through 64-wide copies of its scales, sums and bias and a 64-wide output.
void int8_panels(PanelFn panel, const uint8_t* xu, const float* sx, const int8_t* W, const float* scale,
                 const int32_t* colsum, const float* b, float* out, int64_t N, int64_t G, int64_t O, int64_t begin,
                 int64_t end) {
  const int64_t ldx = G * kI8Group;
  float t_scale[kI8Cols], t_b[kI8Cols], t_out[kI8MaxRows * kI8Cols];
  int32_t t_colsum[kI8Cols];
  for (int64_t p = begin; p < end; ++p) {
    const int8_t* w = W + p * G * kI8Cols * kI8Group;
    const int64_t c0 = p * kI8Cols, width = std::min(kI8Cols, O - c0);
    const float *sc = scale + c0, *bp = b + c0;
    const int32_t* cs = colsum + c0;
    if (width < kI8Cols) {
      for (int64_t c = 0; c < kI8Cols; ++c) {
        t_scale[c] = c < width ? sc[c] : 0.0f;
        t_b[c] = c < width ? bp[c] : 0.0f;
        t_colsum[c] = c < width ? cs[c] : 0;
      }
      sc = t_scale, bp = t_b, cs = t_colsum;
    }
    for (int64_t r = 0; r < N; r += kI8MaxRows) {
      const int rows = static_cast<int>(std::min<int64_t>(N - r, kI8MaxRows));
      if (width < kI8Cols) {
        panel(rows, xu + r * ldx, sx + r, w, sc, cs, bp, t_out, G, ldx, kI8Cols);
        for (int n = 0; n < rows; ++n)
          std::memcpy(out + (r + n) * O + c0, t_out + n * kI8Cols, width * sizeof(float));
      } else {
        panel(rows, xu + r * ldx, sx + r, w, sc, cs, bp, out + r * O + c0, G, ldx, O);
      }
    }
  }
}
}  // namespace

namespace {
// The forms of the product, worst first; a form runs only on a CPU that has it (`cpu_has`).
enum Form : int { kPortable, kAvx2, kVnni, kForms };
const char* const kFormNames[kForms] = {"portable", "avx2", "vnni"};

bool cpu_has(int form) { return form == kPortable || (form == kAvx2 && cpu_has_avx2()) || (form == kVnni && cpu_has_vnni()); }

int best_form() {
  static const int form = cpu_has(kVnni) ? kVnni : cpu_has(kAvx2) ? kAvx2 : kPortable;
  return form;
}

// "vnni", "avx2" or "portable" -> its Form, checked against this CPU; `what` names where the name came from
int parse_form(const std::string& name, const char* what) {
  for (int f = 0; f < kForms; ++f)
    if (name == kFormNames[f]) {
      TORCH_CHECK(cpu_has(f), what, " asks for the int8 product's ", name, " form, which this CPU cannot run; ",
                  "the best it runs is ", kFormNames[best_form()]);
      return f;
    }
  TORCH_CHECK(false, what, " must be vnni, avx2 or portable (or auto), not '", name, "'");
  return kPortable;
}
}  // namespace

int int8_form_code(const std::string& form, const char* what) {
  return form == "auto" ? best_form() : parse_form(form, what);
}

std::string decode_int8_form(const std::string& form) { return kFormNames[int8_form_code(form, "decode_int8_form")]; }

std::vector<std::string> decode_int8_forms() {
  std::vector<std::string> forms;
  for (int f = kForms - 1; f >= 0; --f)
    if (cpu_has(f)) forms.push_back(kFormNames[f]);
  return forms;
}

namespace {
// the product itself, for checked arguments: x (N, K), Wq (P, G, 64, 4), O columns, in `form`
at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& Wq, const float* sp, const int32_t* cp, const float* bp,
                       int64_t O, int form) {
  const int64_t N = x.size(0), K = x.size(1), G = Wq.size(1);
  const auto xc = x.to(at::kFloat).contiguous();
  auto out = at::empty({N, O}, xc.options());
  if (N == 0 || O == 0) return out;
  const int64_t Kp = G * kI8Group;
  std::vector<uint8_t> xu(N * Kp);
  std::vector<float> sx(N);
  const float* xp = xc.data_ptr<float>();
  void (*quantize)(const float*, uint8_t*, float*, int64_t, int64_t) = quantize_row;
  PanelFn panel = int8_panel_rows;
#ifdef CP_HAVE_VNNI_PATH
  if (form == kVnni) quantize = quantize_row_vnni, panel = int8_panel_rows_vnni;
#endif
#ifdef CP_HAVE_AVX2_PATH
  if (form == kAvx2) quantize = quantize_row_avx2, panel = int8_panel_rows_avx2;
#endif
  for (int64_t n = 0; n < N; ++n) quantize(xp + n * K, xu.data() + n * Kp, sx.data() + n, K, Kp);
  const int8_t* Wp = Wq.data_ptr<int8_t>();
  float* op = out.data_ptr<float>();
  // split panels over threads only where each gets at least ~512 KiB of W to stream
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 19) / (Kp * kI8Cols));
  at::parallel_for(0, Wq.size(0), grain, [&](int64_t begin, int64_t end) {
    int8_panels(panel, xu.data(), sx.data(), Wp, sp, cp, bp, op, N, G, O, begin, end);
  });
  return out;
}
}  // namespace

at::Tensor decode_linear_int8(const at::Tensor& x, const at::Tensor& Wq, const at::Tensor& scales,
                              const at::Tensor& colsums, const at::Tensor& b, const std::string& form) {
  TORCH_CHECK(x.dim() == 2 && Wq.dim() == 4 && Wq.scalar_type() == at::kChar && Wq.is_contiguous() &&
                  Wq.size(2) == kI8Cols && Wq.size(3) == kI8Group,
              "decode_linear_int8: x must be (N, K) and Wq contiguous int8 (ceil(O / ", kI8Cols, "), ceil(K / ",
              kI8Group, "), ", kI8Cols, ", ", kI8Group, "); see imagegen.ops.int8.pack_int8");
  const int64_t K = x.size(1), G = Wq.size(1), O = scales.numel();
  TORCH_CHECK((K + kI8Group - 1) / kI8Group == G && G * kI8Group <= 65536 &&
                  Wq.size(0) == (O + kI8Cols - 1) / kI8Cols && scales.scalar_type() == at::kFloat &&
                  scales.is_contiguous() && colsums.scalar_type() == at::kInt && colsums.is_contiguous() &&
                  colsums.numel() == O && b.scalar_type() == at::kFloat && b.is_contiguous() && b.numel() == O,
              "decode_linear_int8: Wq (", Wq.sizes(), ") must match x's K = ", K, " (at most 65536) and O = ", O,
              " (scales' length), with float32 scales, int32 colsums and a float32 bias of O each");
  return int8_linear(x, Wq, scales.data_ptr<float>(), colsums.data_ptr<int32_t>(), b.data_ptr<float>(), O,
                     int8_form_code(form, "decode_linear_int8's form"));
}

// decode_step's form (imagegen.ops.int8.step_form): Wq as above and one float32 (3, O) tensor in the
// bias slot holding the bias, the scales and the column sums (their int32 bits, copied as they are).
at::Tensor decode_linear_int8_step(const at::Tensor& x, const at::Tensor& Wq, const at::Tensor& extra, int form) {
  const int64_t O = extra.dim() == 2 ? extra.size(1) : -1;
  TORCH_CHECK(x.dim() == 2 && Wq.dim() == 4 && Wq.scalar_type() == at::kChar && Wq.is_contiguous() &&
                  Wq.size(2) == kI8Cols && Wq.size(3) == kI8Group && Wq.size(1) == (x.size(1) + kI8Group - 1) / kI8Group &&
                  Wq.size(1) * kI8Group <= 65536 &&
                  extra.scalar_type() == at::kFloat && extra.is_contiguous() && extra.size(0) == 3 &&
                  Wq.size(0) == (O + kI8Cols - 1) / kI8Cols,
              "decode_linear: int8 weights must be pack_int8's Wq for x's K with a float32 (3, O) bias, scales and "
              "column sums; see imagegen.ops.int8.step_form");
  const float* e = extra.data_ptr<float>();
  return int8_linear(x, Wq, e + O, reinterpret_cast<const int32_t*>(e + 2 * O), e, O, form);
}

// The exact GELU on float32 vectors (gelu): gelu(x) = x Phi(x), Phi the standard normal distribution
// function, (1 + erf(x / sqrt 2)) / 2 (torch's GELU, approximate='none'). Within 1e-7 of it (9.6e-8
// at worst) over every float32 x (checked exhaustively: docs/notes/speed.md, "GELU"). torch's own
// float32 GELU calls an out-of-line exp per vector and divides; this one is polynomials and one
// inline power of two, about half its time (decode_step.cpp's GELU of the feed-forward rows).
//   |x| < sqrt 2:   Phi(x) = 1/2 + x P(x^2)
//   beyond:         Phi(-|x|) = 2^Q(|x|) (the tail, to relative accuracy), Phi(|x|) = 1 - Phi(-|x|)
//   |x| > kTailEnd: Phi(-|x|) < 2^-25, so Phi(|x|) rounds to 1 and gelu(-|x|) is 0 within 1e-7
//                   (torch's float32 GELU is 0 there too: its erf rounds to -1)
// NaN gives NaN, +inf +inf, -inf -0 (the limit; torch gives NaN for both infinities in float32).
#pragma once

#include "vec.h"

#include <cstdint>

namespace {

// minimax polynomials in Horner form (fitted on dense grids, Lawson reweighting, coefficients rounded to float32)
constexpr float kGeluSmall[] = {0.398942262f, -0.0664898306f, 0.00997036695f,  // P(u), u = x^2 <= 2: relative
                                -0.00118048815f, 0.000108665932f, -6.2224085e-06f};  // error 4e-8
constexpr float kGeluTail[] = {-1.00385475f, -1.13994241f, -0.472114682f,  // Q(a), sqrt 2 <= a <= kTailEnd: the
                               -0.0452092662f, 0.00532999961f, -0.000293390389f};  // error of 2^Q under 8e-9
constexpr float kExp2[] = {1.00000012f, 0.693146944f, 0.240221202f,  // 2^f, |f| <= 1/2: relative error 8e-8
                           0.0555071346f, 0.00967549812f, 0.00132763246f};
constexpr float kGeluTailEnd = 5.54371738f;  // 3.92 sqrt 2: Phi(-kTailEnd) = 1.7e-8

template <typename V, int n>
inline __attribute__((always_inline)) V horner(V t, const float (&c)[n]) {
  V p = t * c[n - 1] + c[n - 2];
  for (int i = n - 3; i >= 0; --i) p = p * t + c[i];
  return p;
}

// 2^y for y in [-126, 0]: 2^f (f = y - n, n the nearest integer) times 2^n made from n's bits
template <typename V>
inline __attribute__((always_inline)) V exp2_normal(V y) {
  using I = decltype(y < y);                       // the int32 vector of V's width
  constexpr float kRound = 0x1.8p23f;              // y + kRound holds the nearest integer n in its low bits
  const V k = y + kRound;
  const V f = y - (k - kRound);
  I bits;
  __builtin_memcpy(&bits, &k, sizeof bits);
  bits = (bits << 23) + (127 << 23);               // n in the exponent field: 2^n (n >= -126)
  V scale;
  __builtin_memcpy(&scale, &bits, sizeof scale);
  return horner(f, kExp2) * scale;
}

// gelu of every lane of x (a 64-byte or sweep vector of float)
template <typename V>
inline __attribute__((always_inline)) V gelu(V x) {
  using I = decltype(x < x);
  I bits;
  __builtin_memcpy(&bits, &x, sizeof bits);
  bits &= 0x7fffffff;
  V a;                                             // |x| (NaN stays NaN)
  __builtin_memcpy(&a, &bits, sizeof a);
  const V end = V{} + kGeluTailEnd;
  const V h = exp2_normal(horner(a < end ? a : end, kGeluTail));  // Phi(-|x|), |x| clamped for 2^Q's range
  const V xh = x * h;
  V tail = x > 0.0f ? x - xh : xh;                 // x Phi(x) = x - x Phi(-x): one rounding of a value near x
  tail = a > end ? (x > 0.0f ? x : -V{}) : tail;   // Phi(-|x|) = 0 (and no inf * 0 = NaN)
  return a < 1.41421356f ? x * (0.5f + x * horner(x * x, kGeluSmall)) : tail;
}

}  // namespace

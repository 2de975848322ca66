// The exact GELU on float32 vectors (gelu): gelu(x) = x Phi(x), Phi the standard normal distribution
// function, (1 + erf(x / sqrt 2)) / 2 (torch's GELU, approximate='none'), as
//   gelu(x) = x Phi(-|x|) for x <= 0,  x - x Phi(-|x|) for x > 0,  Phi(-|x|) = 2^Q(|x|)
// with Q a polynomial and 2^ computed inline. Within 2.6e-7 of the exact value over every finite float32
// (checked exhaustively with AVX-512 and AVX2 vectors; the rounding of an output near 4 alone is up to
// 2.4e-7; torch's own float32 GELU is 1.2e-6 off): docs/notes/speed.md, "decode_step's own GELU". torch's
// float32 erf takes an exp and a division a vector; this one is faster (docs/notes/code-measurements.md).
// Q is fitted for |x| <= 5.544, where Phi(-|x|) is above 2^-26; beyond, it falls monotonically to -inf,
// so gelu(x) is x for large x, and 0 for very negative x (torch's float32 GELU is so there too: its erf
// rounds to -1 and 1). NaN gives NaN, +inf +inf, -inf -0 (the limit; torch's float32 GELU gives NaN for
// both infinities).
#pragma once

#include "vec.h"

#include <cstdint>

namespace {

// minimax polynomials in Horner form (fitted on dense grids by Lawson's reweighting, rounded to float32)
constexpr float kGeluTail[] = {-0.99999994f, -1.15110695f, -0.459193051f,  // Q(a) = log2 Phi(-a), 0 <= a <= 5.544,
                               -0.0525464229f, 0.00714277383f, -0.000202476964f,  // weighted so that the error of
                               -0.000157278497f, 3.29678114e-05f, -2.27584769e-06f};  // max(a, 1) 2^Q stays under 2e-8
constexpr float kExp2[] = {1.00000012f, 0.693146944f, 0.240221202f,  // 2^f, |f| <= 1/2: relative error 8e-8
                           0.0555071346f, 0.00967549812f, 0.00132763246f};

template <typename V, int n>
inline __attribute__((always_inline)) V horner(V t, const float (&c)[n]) {
  V p = t * c[n - 1] + c[n - 2];
  for (int i = n - 3; i >= 0; --i) p = p * t + c[i];
  return p;
}

// 2^y for y <= 0 (NaN stays NaN): 2^f (f = y - n, n the nearest integer) times 2^n made from n's bits;
// 0 for y below -126.5 (n = -127 makes the scale's bits 0)
template <typename V>
inline __attribute__((always_inline)) V exp2_negative(V y) {
  using I = decltype(y < y);                       // the int32 vector of V's width
  constexpr float kRound = 0x1.8p23f;              // y + kRound holds the nearest integer n in its low bits
  y = y < -127.0f ? V{} - 127.0f : y;
  const V k = y + kRound;
  const V f = y - (k - kRound);
  I bits;
  __builtin_memcpy(&bits, &k, sizeof bits);
  bits = (bits << 23) + (127 << 23);               // n in the exponent field: 2^n, or 0 for n = -127
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
  const V h = exp2_negative(horner(a, kGeluTail)); // Phi(-|x|); 0 from |x| = 10.2 (Q falls to -inf beyond its fit)
  const V clamped = x > 64.0f ? V{} + 64.0f : (x < -64.0f ? V{} - 64.0f : x);  // where h = 0: 0, not inf * 0
  const V xh = clamped * h;
  return x > 0.0f ? x - xh : xh;                   // x Phi(x) = x - x Phi(-x): one rounding of a value near x
}

}  // namespace

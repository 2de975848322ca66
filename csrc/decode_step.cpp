// One decoding position of a whole linear PixelTransformer on the CPU in one call (decode_step),
// the attention of each block through fused_attention.cpp's attention_forward_cpu with its state,
// the small-batch products of decoding (decode_linear: float32 W in panels, bfloat16 W) and the
// step's residual add fused with the next LayerNorm (add_layer_norm_rows). The tensors it takes are
// named in cpu_kernel.h (DecodeLayer, DecodeHead).

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/add.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/layer_norm.h>
#include <ATen/ops/relu.h>
#include <c10/util/BFloat16.h>

#include "cpu_kernel.h"
#include "gelu.h"
#include "vec.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace {

// ---- small-batch bfloat16 products for decoding --------------------------------------------
// out (N, O) = b + x W for a few rows x (N, K) float32 and W (K, O), b (O) bfloat16: each row of W
// is widened to float32 in registers (bfloat16 is float32's upper half) and accumulated in float32,
// out rounded to bfloat16 (nearest even). At batch 1 the product only streams W, and reading
// bfloat16 halves that; torch's bfloat16 matmul (oneDNN) gains little there on this CPU (without AMX).
// Columns go kLinCols at a time so that every widened W row serves all N rows from registers.
constexpr int kLinCols = 64;     // 4 vectors of 16 floats
constexpr int kLinMaxRows = 4;   // rows handled together; more go through torch's matmul

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

// ---- small-batch float32 products for decoding ---------------------------------------------
// out (N, O) = b + x W for a few rows x (N, K) and float32 W in panels (`imagegen.ops.layout.
// panels`): W's columns in blocks of kPanel, each block's K rows contiguous, (O / kPanel, K, kPanel).
// A block's N x kPanel outputs stay in registers while its rows stream past, so one pass reads W
// from start to end at memory speed, faster than torch's addmm at batch 1 (docs/notes/code-measurements.md).
// kPanel is kPanelVecs sweep vectors (vec.h's svec_t): 4 x 16 floats with
// AVX-512's 32 registers, 2 x 8 with AVX2's 16 (4 rows x 2 accumulators and their inputs).
constexpr int kPanelVecs = CP_SWEEP_BYTES == 64 ? 4 : 2;
constexpr int64_t kPanel = kPanelVecs * kSweep<float>;

template <int NR>
inline __attribute__((always_inline)) void linear_f32_panel(const float* x, const float* w, const float* b,
                                                            float* out, int64_t K, int64_t O) {
  using V = svec_t<float>;
  constexpr int64_t L = kSweep<float>;
  V acc[NR][kPanelVecs];
  for (int j = 0; j < kPanelVecs; ++j) {
    const V bias = sload(b + L * j);
    for (int n = 0; n < NR; ++n) acc[n][j] = bias;
  }
  for (int64_t k = 0; k < K; ++k, w += kPanel) {
    V wk[kPanelVecs];
    for (int j = 0; j < kPanelVecs; ++j) wk[j] = sload(w + L * j);
    for (int n = 0; n < NR; ++n) {
      const float xk = x[n * K + k];
      for (int j = 0; j < kPanelVecs; ++j) acc[n][j] += xk * wk[j];
    }
  }
  for (int n = 0; n < NR; ++n)
    for (int j = 0; j < kPanelVecs; ++j) sstore(out + n * O + L * j, acc[n][j]);
}

// panels [begin, end) for all N rows, kLinMaxRows rows per pass over a panel
CP_MULTIVERSION void linear_f32_panels(const float* x, const float* W, const float* b, float* out, int64_t N,
                                       int64_t K, int64_t O, int64_t begin, int64_t end) {
  for (int64_t p = begin; p < end; ++p) {
    const float* w = W + p * K * kPanel;
    for (int64_t r = 0; r < N; r += kLinMaxRows) {
      const float* xr = x + r * K;
      float* o = out + r * O + p * kPanel;
      switch (smaller(N - r, kLinMaxRows)) {
        case 1: linear_f32_panel<1>(xr, w, b + p * kPanel, o, K, O); break;
        case 2: linear_f32_panel<2>(xr, w, b + p * kPanel, o, K, O); break;
        case 3: linear_f32_panel<3>(xr, w, b + p * kPanel, o, K, O); break;
        default: linear_f32_panel<4>(xr, w, b + p * kPanel, o, K, O); break;
      }
    }
  }
}

// ---- residual add and LayerNorm of the decoding step ----------------------------------------
// Rows [n0, n1) of h (N, D) float32: h += y (the last block's output in the products' dtype T,
// bfloat16 or float32; none when y is null), then out = LayerNorm(h) * w + b in T, with the mean
// and the (biased) variance summed in float32 vectors. One pass per row where torch would run an
// add, a LayerNorm and (for bfloat16) a copy, whose fixed costs count at batch 1
// (docs/notes/code-measurements.md).
inline __attribute__((always_inline)) vec_t<float> load_f32(const c10::BFloat16* p) { return widen_bf16(p); }
inline __attribute__((always_inline)) vec_t<float> load_f32(const float* p) { return load(p); }

template <typename T>
inline __attribute__((always_inline)) void add_layer_norm_body(float* h, const T* y, const float* w, const float* b,
                                                               T* out, int64_t n0, int64_t n1, int64_t D, float eps) {
  using V = vec_t<float>;
  constexpr int64_t B = kBlock<float>;
  const int64_t Dv = D / B * B;
  for (int64_t n = n0; n < n1; ++n) {
    float* hr = h + n * D;
    if (y) {
      const T* yr = y + n * D;
      for (int64_t i = 0; i < Dv; i += B) store(hr + i, load(hr + i) + load_f32(yr + i));
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
    T* o = out + n * D;
    for (int64_t i = 0; i < D; ++i) o[i] = static_cast<T>((hr[i] - mean) * rstd * w[i] + b[i]);
  }
}

CP_MULTIVERSION void add_layer_norm_rows(float* h, const c10::BFloat16* y, const float* w, const float* b,
                                         c10::BFloat16* out, int64_t n0, int64_t n1, int64_t D, float eps) {
  add_layer_norm_body(h, y, w, b, out, n0, n1, D, eps);
}
CP_MULTIVERSION void add_layer_norm_rows(float* h, const float* y, const float* w, const float* b, float* out,
                                         int64_t n0, int64_t n1, int64_t D, float eps) {
  add_layer_norm_body(h, y, w, b, out, n0, n1, D, eps);
}

// ---- GELU of the feed-forward rows -----------------------------------------------------------
// x[i] = gelu(x[i]) for n float32 values (gelu.h): whole sweep vectors, then the rest through one
// zero-padded vector.
CP_MULTIVERSION void gelu_values(float* x, int64_t n) {
  constexpr int64_t L = kSweep<float>;
  int64_t i = 0;
  for (; i + L <= n; i += L) sstore(x + i, gelu(sload(x + i)));
  if (i < n) {
    float rest[L] = {};
    for (int64_t j = i; j < n; ++j) rest[j - i] = x[j];
    sstore(rest, gelu(sload(rest)));
    for (int64_t j = i; j < n; ++j) x[j] = rest[j - i];
  }
}
}  // namespace

// The features of x (..., E), q and k together as views of the projection, for a block whose map is not elu
// (which the fused attention applies itself): "relu", or "favor" with its scaled draw W = E^-1/4 omega (E, F,
// Favor.scaled_draw, made once per state), by the ops of imagegen/attention/feature_maps.py's Relu and
// Favor.forward in their order -> (..., F) in x's dtype, float32 for bfloat16 (the module's step computes
// features so).
at::Tensor step_features(const at::Tensor& x, const std::string& map, const at::Tensor& W) {
  const auto xf = x.scalar_type() == at::kDouble ? x : x.to(at::kFloat);
  if (map == "relu") return at::relu(xf);
  TORCH_CHECK(map == "favor" && W.dim() == 2 && W.size(0) == x.size(-1) && W.scalar_type() == xf.scalar_type(),
              "decode_step: features must be elu, relu or favor (with W = E^-1/4 omega, (E, F) in the features' "
              "dtype), not ", map);
  const int64_t E = x.size(-1), F = W.size(1);
  const double c = std::pow(static_cast<double>(E), -0.25);
  const auto rows = xf.reshape({-1, E});
  const auto b = rows.mul(rows).sum(-1, true).mul(-0.5 * c * c).sub(0.5 * std::log(static_cast<double>(F)));
  auto sizes = x.sizes().vec();
  sizes.back() = F;
  return at::addmm(b, rows, W).exp_().view(sizes);
}

// torch's exact GELU (approximate='none') of x in place: contiguous float32 CPU x through gelu_values
// (gelu.h: within 2.6e-7 of the exact value, faster than torch's), rows split over threads;
// other x through at::gelu_. -> x.
at::Tensor gelu_in_place(at::Tensor x) {
  if (x.scalar_type() != at::kFloat || !x.is_contiguous() || !x.device().is_cpu() || x.numel() == 0)
    return at::gelu_(x);
#if defined(__x86_64__) && !defined(__AVX2__)
  // the portable build's baseline clone (no AVX2) runs slower than torch's (docs/notes/code-measurements.md)
  if (!__builtin_cpu_supports("avx2")) return at::gelu_(x);
#endif
  const int64_t D = x.dim() ? x.size(-1) : 1, rows = x.numel() / D;
  float* p = x.data_ptr<float>();
  // split rows over threads only where each gets at least ~16K values
  at::parallel_for(0, rows, std::max<int64_t>(1, (int64_t{1} << 14) / D), [&](int64_t r0, int64_t r1) {
    gelu_values(p + r0 * D, (r1 - r0) * D);
  });
  return x;
}

// b + x W through oneDNN with W prepacked for it (`imagegen.ops.layout.pack`: torch.ops.mkldnn.
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

// b + x W for x (N, K) and float32 W in panels (O / kPanel, K, kPanel) (see linear_f32_panels).
at::Tensor panel_linear(const at::Tensor& x, const at::Tensor& W, const at::Tensor& b) {
  const int64_t N = x.size(0), K = W.size(1), O = W.size(0) * kPanel;
  TORCH_CHECK(W.scalar_type() == at::kFloat && W.size(2) == kPanel && W.is_contiguous() &&
                  b.scalar_type() == at::kFloat && b.is_contiguous() && b.numel() == O && x.dim() == 2 &&
                  x.size(1) == K,
              "decode_linear: panel weights must be contiguous float32 (O / ", kPanel, ", K, ", kPanel,
              ") with an O-long float32 bias and x (N, K); see imagegen.ops.layout.panels");
  const auto xc = x.to(at::kFloat).contiguous();
  auto out = at::empty({N, O}, W.options());
  const float *xp = xc.data_ptr<float>(), *Wp = W.data_ptr<float>(), *bp = b.data_ptr<float>();
  float* op = out.data_ptr<float>();
  // split panels over threads only where each gets at least ~512 KiB of W to stream
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 17) / (K * kPanel));
  at::parallel_for(0, W.size(0), grain, [&](int64_t begin, int64_t end) {
    linear_f32_panels(xp, Wp, bp, op, N, K, O, begin, end);
  });
  return out;
}

int64_t decode_panel_width() { return kPanel; }

// b + x W for x (N, K) of any floating dtype and W (K, O), b (O) of one dtype -> (N, O) of W's
// dtype, as torch.addmm(b, x.to(W.dtype), W): through oneDNN for a prepacked W (see packed_linear),
// through linear_f32_panels for float32 W in panels (see panel_linear), through int8_linear.cpp for
// int8 W in its step form (float32 out; int8_form: the product's form, int8_form_code's), through
// linear_bf16_range for bfloat16 W, a few rows and O a multiple of kLinCols, else through torch.
namespace {
at::Tensor step_linear(const at::Tensor& x, const at::Tensor& W, const at::Tensor& b, int int8_form) {
  if (W.is_mkldnn()) return packed_linear(x, W, b);
  if (W.dim() == 4 && W.scalar_type() == at::kChar) return decode_linear_int8_step(x, W, b, int8_form);
  if (W.dim() == 3) return panel_linear(x, W, b);
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
}  // namespace

at::Tensor decode_linear(const at::Tensor& x, const at::Tensor& W, const at::Tensor& b, const std::string& int8_form) {
  return step_linear(x, W, b, int8_form_code(int8_form, "decode_linear's int8_form"));
}

// One decoding position of a whole PixelTransformer whose every layer is linear attention on
// this kernel: the loop of PixelTransformer.step in one call, which saves the Python and module
// overhead of some ninety small ops per position (most of the batch-1 time). h (N, D): the
// embedded input token. layers: per block the DecodeLayer tensors (cpu_kernel.h: LayerNorm 1,
// q, k, v projection, output projection, LayerNorm 2, feed-forward in and out, decoding state),
// Dense weights stored (in, out), prepacked for oneDNN (see packed_linear) or in panels (see
// panel_linear). head: the DecodeHead tensors (LayerNorm, projection). -> distribution parameters
// (N, P); the states advance in place. features: the blocks' feature map, "elu" (the model's; the
// attention applies it), or "relu" or "favor" (step_features, then the attention with phi the identity).
// With h float32 and the products float32 or bfloat16 (bfloat16 decoding: the blocks' Dense weights
// bfloat16), each block output (in the products' dtype) is added to h and the next LayerNorm computed
// in one pass (add_layer_norm_rows), its output in the products' dtype; with bfloat16 the attention
// reads bfloat16 q, k, v into its float32 state. Other dtypes (float64, the tests' reference) run
// torch's add, LayerNorm and addmm.
at::Tensor decode_step_cpu(at::Tensor h, const std::vector<std::vector<at::Tensor>>& layers,
                           const std::vector<at::Tensor>& head, int64_t n_heads, double ln_eps, double eps,
                           const std::string& features, const std::string& int8_form) {
  using Layer = DecodeLayer;
  using Head = DecodeHead;
  TORCH_CHECK(h.dim() == 2 && head.size() == Head::count && n_heads > 0 && h.size(1) % n_heads == 0 &&
                  !layers.empty(),
              "decode_step: h must be (N, D) with D divisible by n_heads, layers not empty and head hold ",
              int(Head::count), " tensors");
  const int64_t N = h.size(0), D = h.size(1), E = D / n_heads;
  for (const auto& w : layers)
    TORCH_CHECK(w.size() == Layer::count, "decode_step: each layer takes ", int(Layer::count), " tensors");
  // the products' dtype: that of their weights and biases, or int8 weights (int8_linear.cpp's step form)
  // with float32 biases (and scales), which take and return float32
  const auto weights = layers.front()[Layer::qkv_weight].scalar_type();
  const auto dtype = weights == at::kChar ? at::kFloat : weights;
  // (int8 products may keep some float32 or bfloat16: Dense.int8_keeps; a weight may then be int8, float32 or
  // bfloat16, its bias float32 or bfloat16; a bfloat16 product's output runs the GELU in bfloat16, as the forward)
  const bool int8 = weights == at::kChar;
  const int form = int8_form_code(int8_form, "decode_step's int8_form");
  for (const auto& w : layers)
    for (const auto j : Layer::products) {
      const bool bias = j == Layer::qkv_bias || j == Layer::out_bias || j == Layer::ff1_bias || j == Layer::ff2_bias;
      const auto got = w[j].scalar_type();
      const bool kept = int8 && (got == at::kFloat || got == at::kBFloat16 || (!bias && got == at::kChar));
      TORCH_CHECK(got == (bias ? dtype : weights) || kept,
                  "decode_step: every block's Dense weights must share one dtype (int8 may mix with float32 and "
                  "bfloat16), and their biases too");
    }
  const bool mapped = features != "elu";
  auto attention = [&](const at::Tensor& x, const std::vector<at::Tensor>& w) {  // LayerNorm'd x -> (N, D)
    auto qkv = step_linear(x, w[Layer::qkv_weight], w[Layer::qkv_bias], form).view({N, 3, n_heads, 1, E});
    auto q = qkv.select(1, 0), k = qkv.select(1, 1), v = qkv.select(1, 2);
    if (mapped) {  // the features of q and k in one call, and v in their dtype, as the module's step has them
      const auto qk = step_features(qkv.narrow(1, 0, 2), features, w[Layer::features]);  // (N, 2, H, 1, F)
      q = qk.select(1, 0), k = qk.select(1, 1), v = v.to(qk.scalar_type());
    }
    return std::get<0>(attention_forward_cpu(q, k, v, eps, w[Layer::state], mapped)).reshape({N, D});
  };
  if (h.scalar_type() == at::kFloat && (dtype == at::kBFloat16 || dtype == at::kFloat)) {
    h = h.contiguous().clone();                     // the float32 residual stream, updated in place
    at::Tensor y;                                   // the last block output not yet added to h
    auto add_norm = [&](const at::Tensor& w, const at::Tensor& b) {  // h += y; -> LayerNorm(h) in dtype
      TORCH_CHECK(w.scalar_type() == at::kFloat && b.scalar_type() == at::kFloat && w.is_contiguous() &&
                      b.is_contiguous() && (!y.defined() || (y.scalar_type() == dtype && y.is_contiguous())),
                  "decode_step: LayerNorm parameters must be contiguous float32");
      auto out = at::empty({N, D}, h.options().dtype(dtype));
      auto rows = [&](auto zero) {                  // zero: a value of the products' C++ type
        using T = decltype(zero);
        const T* yp = y.defined() ? y.data_ptr<T>() : nullptr;
        at::parallel_for(0, N, 64, [&](int64_t n0, int64_t n1) {
          add_layer_norm_rows(h.data_ptr<float>(), yp, w.data_ptr<float>(), b.data_ptr<float>(), out.data_ptr<T>(),
                              n0, n1, D, static_cast<float>(ln_eps));
        });
      };
      if (dtype == at::kFloat) rows(0.0f);
      else rows(c10::BFloat16(0.0f));
      return out;
    };
    for (const auto& w : layers) {
      y = step_linear(attention(add_norm(w[Layer::ln1_weight], w[Layer::ln1_bias]), w), w[Layer::out_weight],
                      w[Layer::out_bias], form);                                              // attention out W + b
      auto f = step_linear(add_norm(w[Layer::ln2_weight], w[Layer::ln2_bias]), w[Layer::ff1_weight],
                           w[Layer::ff1_bias], form);
      y = step_linear(gelu_in_place(f), w[Layer::ff2_weight], w[Layer::ff2_bias], form);          // GELU(ff1) W + b
    }
    h.add_(y);
  } else {
    TORCH_CHECK(dtype == h.scalar_type(), "decode_step: the products must be bfloat16 or h's dtype");
    auto residual = [&](const at::Tensor& x, const at::Tensor& W, const at::Tensor& b) {  // h + x W + b
      return at::addmm(h, x, W).add_(b);                                                  // one addmm into h
    };
    for (const auto& w : layers) {
      h = residual(attention(at::layer_norm(h, {D}, w[Layer::ln1_weight], w[Layer::ln1_bias], ln_eps), w),
                   w[Layer::out_weight], w[Layer::out_bias]);
      auto f = step_linear(at::layer_norm(h, {D}, w[Layer::ln2_weight], w[Layer::ln2_bias], ln_eps),
                           w[Layer::ff1_weight], w[Layer::ff1_bias], form);
      h = residual(gelu_in_place(f), w[Layer::ff2_weight], w[Layer::ff2_bias]);
    }
  }
  return at::addmm(head[Head::proj_bias], at::layer_norm(h, {D}, head[Head::ln_f_weight], head[Head::ln_f_bias], ln_eps),
                   head[Head::proj_weight]);
}

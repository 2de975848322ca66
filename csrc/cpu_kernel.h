// The CPU kernel's entry points, one source per job, bound to Python in bindings.cpp:
//   numerator.cpp        the causal product (numerator) forward and backward
//   fused_attention.cpp  the normalised elu+1 attention fused, forward (and decoding) and backward;
//                        also on features of another map (mapped)
//   decode_step.cpp      one decoding position of a whole linear PixelTransformer, with its
//                        bfloat16 products, residual add + LayerNorm and GELU (gelu.h)
//   int8_linear.cpp      the int8 products of decoding and evaluation (AVX512-VNNI or AVX2 where the CPU has it)
//   draw.cpp             the sampler's draw: the logistic mixture's probabilities, guidance, the inverse-CDF draw
//   allocator.cpp        torch's CPU allocator replaced by one whose freed blocks malloc reuses
// The shared vector helpers are in vec.h, the GELU's vector form in gelu.h; the shape checks shared
// with the CUDA source in qkv_checks.h.
#pragma once

#include <ATen/core/Tensor.h>

#include "qkv_checks.h"

#include <iterator>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

inline void check_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  TORCH_CHECK(q.device().is_cpu() && k.device().is_cpu() && v.device().is_cpu(),
              "causal_product (CPU kernel): q, k, v must be CPU tensors");
  check_qkv_shapes(q, k, v);
  TORCH_CHECK(q.scalar_type() == at::kFloat || q.scalar_type() == at::kDouble || q.scalar_type() == at::kBFloat16,
              "causal_product (CPU kernel): float32, float64 or bfloat16 only, got ", q.scalar_type());
}

// ---- numerator.cpp
at::Tensor causal_product_forward(at::Tensor q, at::Tensor k, at::Tensor v);
std::tuple<at::Tensor, at::Tensor, at::Tensor> causal_product_backward(at::Tensor q, at::Tensor k, at::Tensor v,
                                                                       at::Tensor grad_out);

// ---- fused_attention.cpp
std::tuple<at::Tensor, at::Tensor> attention_forward_cpu(at::Tensor q, at::Tensor k, at::Tensor v, double eps,
                                                         std::optional<at::Tensor> state, bool mapped = false);
at::Tensor attention_state(const at::Tensor& like, int64_t BH, int64_t E, int64_t M);
void attention_backward_cpu(at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor out, at::Tensor inv,
                            at::Tensor grad_out, at::Tensor gq, at::Tensor gk, at::Tensor gv, bool mapped);

// ---- decode_step.cpp
// The tensors decode_step takes, by name, in order: per block (DECODE_LAYER_WEIGHTS) and for the
// head (DECODE_HEAD_WEIGHTS). Each list makes the enum that decode_step.cpp indexes with
// (DecodeLayer::qkv_weight, ...) and the names bindings.cpp exports (decode_layer_weights,
// decode_head_weights), which tests/test_ops.py compares with the fields of imagegen.ops.kernel's
// DecodeLayer and DecodeHead, the named tuples PixelTransformer.kernel_weights builds.
// The products' weights and biases (qkv, out, ff1, ff2: DecodeLayer::products) are in the products'
// dtype, bfloat16 for bfloat16 decoding (prepacked for oneDNN at larger batches: see packed_linear),
// or int8 weights in int8_linear.cpp's step form with float32 biases (int8 decoding, 1-4 rows);
// the LayerNorms' are in the parameters' dtype; state is the block's fused attention state
// (attention_state), advanced in place; features: what the block's feature map reads (favor's
// scaled draw E^-1/4 omega (E, F) in the features' dtype; an empty tensor for elu, which the attention
// applies, and relu).
#define DECODE_LAYER_WEIGHTS(X)                     \
  X(ln1_weight) X(ln1_bias)   /* LayerNorm 1 */       \
  X(qkv_weight) X(qkv_bias)   /* q, k, v projection */ \
  X(out_weight) X(out_bias)   /* output projection */  \
  X(ln2_weight) X(ln2_bias)   /* LayerNorm 2 */       \
  X(ff1_weight) X(ff1_bias)   /* feed-forward in */   \
  X(ff2_weight) X(ff2_bias)   /* feed-forward out */  \
  X(state) X(features)
#define DECODE_HEAD_WEIGHTS(X) X(ln_f_weight) X(ln_f_bias) X(proj_weight) X(proj_bias)

#define DECODE_ENUM_ITEM(name) name,
#define DECODE_NAME_ITEM(name) #name,
struct DecodeLayer {
  enum Weight : int { DECODE_LAYER_WEIGHTS(DECODE_ENUM_ITEM) count };
  static constexpr const char* names[] = {DECODE_LAYER_WEIGHTS(DECODE_NAME_ITEM)};
  // the products' weights and biases: one dtype, that of the products
  static constexpr Weight products[] = {qkv_weight, qkv_bias, out_weight, out_bias,
                                        ff1_weight, ff1_bias, ff2_weight, ff2_bias};
};
struct DecodeHead {
  enum Weight : int { DECODE_HEAD_WEIGHTS(DECODE_ENUM_ITEM) count };
  static constexpr const char* names[] = {DECODE_HEAD_WEIGHTS(DECODE_NAME_ITEM)};
};
#undef DECODE_ENUM_ITEM
#undef DECODE_NAME_ITEM
static_assert(std::size(DecodeLayer::names) == DecodeLayer::count && std::size(DecodeHead::names) == DecodeHead::count);

// int8_form: the form of int8_linear.cpp's product for int8 weights in its step form ("auto": the best here)
at::Tensor decode_linear(const at::Tensor& x, const at::Tensor& W, const at::Tensor& b,
                         const std::string& int8_form = "auto");
int64_t decode_panel_width();
at::Tensor decode_step_cpu(at::Tensor h, const std::vector<std::vector<at::Tensor>>& layers,
                           const std::vector<at::Tensor>& head, int64_t n_heads, double ln_eps, double eps,
                           const std::string& features = "elu", const std::string& int8_form = "auto");
// torch's exact GELU of x in place (float32: gelu.h's vector form, within 2.6e-7 of it) -> x
at::Tensor gelu_in_place(at::Tensor x);

// ---- int8_linear.cpp
// b + x W for a few float32 rows x (N, K) and W packed by imagegen.ops.int8.pack_int8: Wq int8
// (ceil(O / 64), ceil(K / 4), 64, 4), scales (O) float32, colsums (O) int32; form "auto" (the best
// this CPU runs), or "vnni", "avx2", "portable" (the tests compare them; a lesser form stands in for a lesser CPU).
at::Tensor decode_linear_int8(const at::Tensor& x, const at::Tensor& Wq, const at::Tensor& scales,
                              const at::Tensor& colsums, const at::Tensor& b, const std::string& form);
std::string decode_int8_form(const std::string& form = "auto");   // the form `form` names here, checked
std::vector<std::string> decode_int8_forms();    // the forms this CPU runs, best first
// a form's name ("auto": the best here) -> its code for decode_linear_int8_step; `what` names the argument in errors
int int8_form_code(const std::string& form, const char* what);
// the same product in decode_step's form: extra float32 (3, O) = the bias, the scales and the column
// sums' int32 bits (imagegen.ops.int8.step_form); decode_linear takes it for 4-d int8 weights
at::Tensor decode_linear_int8_step(const at::Tensor& x, const at::Tensor& Wq, const at::Tensor& extra, int form);

// ---- draw.cpp
// params (N, 3K) float32 (K logits, K means, K log-scales) -> p (N, 256): LogisticMixture.probs
at::Tensor mixture_probs(const at::Tensor& params);
// p_c, p_u (N, 256) float32, guidance G, bound -> (N, 256): heads.guided_probs (the bound applies for G > 1)
at::Tensor guided_probs(const at::Tensor& pc, const at::Tensor& pu, double guidance, double bound);
// probs (N, 256), u (N) float32 -> bytes (N) uint8: the inverse-CDF draw of heads.sample
at::Tensor inverse_cdf(const at::Tensor& probs, const at::Tensor& u);

// ---- allocator.cpp
// Make torch allocate CPU tensors through malloc(n + 64), aligned inside the block (see allocator.cpp);
// true when it is torch's CPU allocator afterwards.
bool use_recycling_allocator();

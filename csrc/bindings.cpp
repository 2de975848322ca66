// The Python module of the CPU kernel (the functions of cpu_kernel.h) and the names of the tensors
// decode_step takes, which imagegen.ops.kernel's DecodeLayer and DecodeHead must list in the same order.

#include <torch/csrc/utils/pybind.h>
#include <pybind11/stl.h>

#include "cpu_kernel.h"


namespace {
template <size_t n>
pybind11::tuple names(const char* const (&list)[n]) {
  pybind11::tuple out(n);
  for (size_t i = 0; i < n; ++i) out[i] = pybind11::str(list[i]);
  return out;
}
}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Causal linear attention numerator (CPU): out_i = sum_{j<=i} (q_i . k_j) v_j";
  m.def("forward", &causal_product_forward, "forward(q, k, v) -> out; q, k (N,H,L,E), v (N,H,L,M)");
  m.def("backward", &causal_product_backward,
        "backward(q, k, v, grad_out) -> (grad_q, grad_k, grad_v)");
  m.def("attention_forward", &attention_forward_cpu, pybind11::arg("q"), pybind11::arg("k"), pybind11::arg("v"),
        pybind11::arg("eps"), pybind11::arg("state") = pybind11::none(), pybind11::arg("mapped") = false,
        "attention_forward(q, k, v, eps, state=None, mapped=False) -> (out, inv): normalised elu+1 attention on "
        "raw q, k (mapped: on features q, k of another map)");
  m.def("attention_state", &attention_state, "attention_state(like, N*H, E, M) -> zero decoding state");
  m.def("attention_backward", &attention_backward_cpu, pybind11::arg("q"), pybind11::arg("k"), pybind11::arg("v"),
        pybind11::arg("out"), pybind11::arg("inv"), pybind11::arg("grad_out"), pybind11::arg("grad_q"),
        pybind11::arg("grad_k"), pybind11::arg("grad_v"), pybind11::arg("mapped") = false,
        "attention_backward(q, k, v, out, inv, grad_out, grad_q, grad_k, grad_v, mapped=False): writes the gradients");
  m.def("decode_linear", &decode_linear, pybind11::arg("x"), pybind11::arg("W"), pybind11::arg("b"),
        pybind11::arg("int8_form") = "auto",
        "decode_linear(x, W, b, int8_form='auto') -> b + x W in W's dtype (bfloat16 W, few rows: widened and summed "
        "in float32; float32 W (O / P, K, P) in panels of P = decode_panel_width() columns; int8 W in its step form: "
        "float32, in int8_form: auto (the best here), vnni, avx2 or portable)");
  m.def("decode_linear_int8", &decode_linear_int8, pybind11::arg("x"), pybind11::arg("Wq"), pybind11::arg("scales"),
        pybind11::arg("colsums"), pybind11::arg("b"), pybind11::arg("form") = "auto",
        "decode_linear_int8(x, Wq, scales, colsums, b, form='auto') -> (N, O) float32: b + x W, x quantized per row "
        "to 8 bits, W packed by imagegen.ops.int8.pack_int8; form: auto, vnni, avx2 or portable");
  m.def("decode_int8_form", &decode_int8_form, pybind11::arg("form") = "auto",
        "decode_int8_form(form='auto') -> the form of decode_linear_int8 that `form` names here (auto: the best this "
        "CPU runs); a form this CPU cannot run raises");
  m.def("decode_int8_forms", &decode_int8_forms, "the forms of decode_linear_int8 this CPU runs, best first");
  m.def("decode_panel_width", &decode_panel_width, "the columns per panel of decode_linear's float32 panels");
  m.def("decode_step", &decode_step_cpu, pybind11::arg("h"), pybind11::arg("layers"), pybind11::arg("head"),
        pybind11::arg("n_heads"), pybind11::arg("ln_eps"), pybind11::arg("eps"), pybind11::arg("features") = "elu",
        pybind11::arg("int8_form") = "auto",
        "decode_step(h, layers, head, n_heads, ln_eps, eps, features='elu', int8_form='auto') -> params: one position "
        "of a linear PixelTransformer; layers: per block the tensors named by decode_layer_weights, head: those named "
        "by decode_head_weights; features: the blocks' feature map (elu, relu or favor); int8_form: as decode_linear's");
  m.def("mixture_probs", &mixture_probs,
        "mixture_probs(params) -> p (N, 256): the discretized logistic mixture of params (N, 3K) float32, as "
        "imagegen.model.heads.LogisticMixture.probs");
  m.def("guided_probs", &guided_probs,
        "guided_probs(p_c, p_u, guidance, bound) -> p (N, 256): classifier-free guidance of float32 (N, 256) "
        "probabilities, as imagegen.model.heads.guided_probs");
  m.def("inverse_cdf", &inverse_cdf,
        "inverse_cdf(probs, u) -> bytes (N,) uint8: for each row of probs (N, 256) float32, the first value whose "
        "running sum reaches u * the row's total, as imagegen.model.heads.sample");
  m.def("gelu_", &gelu_in_place,
        "gelu_(x) -> x: torch's exact GELU (approximate='none') in place; contiguous float32 x through the "
        "kernel's vector form (csrc/gelu.h, within 2.6e-7 of it), other x through torch");
  m.def("use_recycling_allocator", &use_recycling_allocator,
        "use_recycling_allocator() -> bool: torch's CPU tensors from malloc(n + 64), aligned inside the block, "
        "so that malloc reuses freed blocks for tensors of the same size (allocator.cpp)");
  m.attr("decode_layer_weights") = names(DecodeLayer::names);
  m.attr("decode_head_weights") = names(DecodeHead::names);
}

// Causal product on CUDA, forward and backward ("Transformers are RNNs", Algorithm 1).
//
// Shapes: q, k (N, H, L, E) feature-mapped; v (N, H, L, M); out (N, H, L, M).
// Everything is one recurrent primitive, the causal dot
//     out_t = sum_{j<=t} (a_t . b_j) c_j      (reverse: sum over j >= t)
// with a, b (BH, L, D) and c, out (BH, L, C), run with a D x C state S = sum b_j c_j^T:
//     forward  out    = causal_dot(q, k, v)
//     backward grad_q = causal_dot(g, v, k)              (S = sum_{j<=t} v_j k_j^T)
//              grad_k = causal_dot(v, g, q, reverse)     (S = sum_{j>=t} g_j q_j^T)
//              grad_v = causal_dot(k, q, g, reverse)     (S = sum_{j>=t} q_j g_j^T)
//
// Kernel layout: one block per (n*h, tile of <= 32 state columns). Each column is owned
// by a group of kGroup = 8 adjacent lanes, each lane keeping D / 8 rows of that column
// of S in registers (float). The block streams over time in tiles of T steps staged in
// shared memory (double buffered: the next tile is loaded into registers while the
// current one is computed). Per step a lane updates its rows, forms a partial dot with
// a_t, and the 8 lanes reduce with warp shuffles. Inputs float32/float16/bfloat16,
// accumulation float32. D and C up to kMaxDim = 256.

// Light headers (not torch/extension.h): this file needs tensors, dispatch and pybind only.
#include <ATen/DeviceGuard.h>
#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <torch/csrc/utils/pybind.h>

#include "qkv_checks.h"

#include <tuple>

namespace {

constexpr int kThreads = 256;                // threads per block
constexpr int kGroup = 8;                    // lanes sharing one state column
constexpr int kMaxCols = kThreads / kGroup;  // 32 state columns per block
constexpr int kMaxDim = 256;                 // largest D (= E or M) supported

// Time steps per shared-memory tile; keeps the four double buffers under 48 KiB.
constexpr int tile_steps(int rows_per_lane) { return rows_per_lane <= 4 ? 32 : (rows_per_lane <= 16 ? 16 : 8); }

// a, b (BH, L, D); c, out (BH, L, C). R = rows of S per lane, D <= R * kGroup.
// Grid: BH * n_col_tiles blocks; block x handles columns [m0, m0 + ncols) of head x / n_col_tiles.
template <typename scalar_t, int R>
__global__ void __launch_bounds__(kThreads) causal_dot_kernel(
    const scalar_t* __restrict__ a, const scalar_t* __restrict__ b, const scalar_t* __restrict__ c,
    scalar_t* __restrict__ out, int L, int D, int C, int cols_per_block, int n_col_tiles, bool reverse) {
  constexpr int T = tile_steps(R);
  constexpr int DMAX = R * kGroup;
  constexpr int PF_AB = (T * DMAX + kThreads - 1) / kThreads;     // prefetch registers for a, b
  constexpr int PF_C = (T * kMaxCols + kThreads - 1) / kThreads;  // ... and for c
  __shared__ float a_s[2][T * DMAX], b_s[2][T * DMAX];            // (T, D) per buffer
  __shared__ float c_s[2][T * kMaxCols], o_s[2][T * kMaxCols];    // (T, ncols) per buffer

  const int tid = threadIdx.x, lane_row = tid % kGroup, col = tid / kGroup;
  const int64_t bh = blockIdx.x / n_col_tiles;
  const int m0 = (blockIdx.x % n_col_tiles) * cols_per_block;
  const int ncols = min(cols_per_block, C - m0);
  const bool owns_col = col < ncols;
  a += bh * L * D;
  b += bh * L * D;
  c += bh * L * C;
  out += bh * L * C;

  const int n_tiles = (L + T - 1) / T;
  scalar_t ra[PF_AB], rb[PF_AB], rc[PF_C];

  // global -> registers: rows [t0, t0 + tl) of a, b (contiguous) and the block's columns of c
  auto fetch = [&](int tile) {
    const int t0 = tile * T, tl = min(T, L - t0);
#pragma unroll
    for (int r = 0; r < PF_AB; ++r) {
      const int i = tid + r * kThreads;
      if (i < tl * D) { ra[r] = a[(int64_t)t0 * D + i]; rb[r] = b[(int64_t)t0 * D + i]; }
    }
#pragma unroll
    for (int r = 0; r < PF_C; ++r) {
      const int i = tid + r * kThreads;
      if (i < tl * ncols) rc[r] = c[(int64_t)(t0 + i / ncols) * C + m0 + i % ncols];
    }
  };
  // registers -> shared buffer, as float
  auto stash = [&](int tile, int buf) {
    const int tl = min(T, L - tile * T);
#pragma unroll
    for (int r = 0; r < PF_AB; ++r) {
      const int i = tid + r * kThreads;
      if (i < tl * D) { a_s[buf][i] = static_cast<float>(ra[r]); b_s[buf][i] = static_cast<float>(rb[r]); }
    }
#pragma unroll
    for (int r = 0; r < PF_C; ++r) {
      const int i = tid + r * kThreads;
      if (i < tl * ncols) c_s[buf][i] = static_cast<float>(rc[r]);
    }
  };

  float S[R];  // S[row = lane_row + j * kGroup, col]
#pragma unroll
  for (int j = 0; j < R; ++j) S[j] = 0.f;

  int tile = reverse ? n_tiles - 1 : 0;
  fetch(tile);
  stash(tile, 0);
  __syncthreads();
  for (int it = 0; it < n_tiles; ++it) {
    const int buf = it & 1, t0 = tile * T, tl = min(T, L - t0);
    const int next = reverse ? tile - 1 : tile + 1;
    const bool has_next = it + 1 < n_tiles;
    if (has_next) fetch(next);  // loads in flight while this tile is computed

    for (int s = 0; s < tl; ++s) {
      const int t = reverse ? tl - 1 - s : s;
      const float* a_t = a_s[buf] + t * D;
      const float* b_t = b_s[buf] + t * D;
      const float c_t = owns_col ? c_s[buf][t * ncols + col] : 0.f;
      float p = 0.f;
#pragma unroll
      for (int j = 0; j < R; ++j) {
        const int d = lane_row + j * kGroup;
        if (d < D) {
          S[j] = fmaf(b_t[d], c_t, S[j]);  // S += b_t c_t^T (this lane's rows of one column)
          p = fmaf(a_t[d], S[j], p);       // partial a_t . S[:, col]
        }
      }
#pragma unroll
      for (int off = kGroup / 2; off > 0; off >>= 1) p += __shfl_xor_sync(0xffffffffu, p, off);
      if (lane_row == 0 && owns_col) o_s[buf][t * ncols + col] = p;
    }

    if (has_next) stash(next, buf ^ 1);
    __syncthreads();  // o_s[buf] complete, buffer buf ^ 1 ready for the next tile
    for (int i = tid; i < tl * ncols; i += kThreads)
      out[(int64_t)(t0 + i / ncols) * C + m0 + i % ncols] = static_cast<scalar_t>(o_s[buf][i]);
    tile = next;
  }
}

template <typename scalar_t, int R>
void launch_rows(const at::Tensor& a, const at::Tensor& b, const at::Tensor& c, at::Tensor& out, bool reverse,
                 int64_t blocks, int n_col_tiles, int cols) {
  const int L = a.size(2), D = a.size(3), C = c.size(3);
  causal_dot_kernel<scalar_t, R><<<static_cast<unsigned>(blocks), kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      a.data_ptr<scalar_t>(), b.data_ptr<scalar_t>(), c.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(),
      L, D, C, cols, n_col_tiles, reverse);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Pick the rows-per-lane instantiation R = ceil(D / kGroup) rounded up to a power of two.
template <typename scalar_t>
void launch(const at::Tensor& a, const at::Tensor& b, const at::Tensor& c, at::Tensor& out, bool reverse,
            int64_t blocks, int n_col_tiles, int cols) {
  const int64_t D = a.size(3);
  if (D <= 8) launch_rows<scalar_t, 1>(a, b, c, out, reverse, blocks, n_col_tiles, cols);
  else if (D <= 16) launch_rows<scalar_t, 2>(a, b, c, out, reverse, blocks, n_col_tiles, cols);
  else if (D <= 32) launch_rows<scalar_t, 4>(a, b, c, out, reverse, blocks, n_col_tiles, cols);
  else if (D <= 64) launch_rows<scalar_t, 8>(a, b, c, out, reverse, blocks, n_col_tiles, cols);
  else if (D <= 128) launch_rows<scalar_t, 16>(a, b, c, out, reverse, blocks, n_col_tiles, cols);
  else launch_rows<scalar_t, 32>(a, b, c, out, reverse, blocks, n_col_tiles, cols);
}

// out (N, H, L, C) = causal_dot(a, b, c); a, b (N, H, L, D), c (N, H, L, C), all contiguous.
at::Tensor causal_dot(const at::Tensor& a, const at::Tensor& b, const at::Tensor& c, bool reverse) {
  auto out = at::empty_like(c);
  const int64_t BH = a.size(0) * a.size(1), D = a.size(3), C = c.size(3);
  if (out.numel() == 0 || D == 0) return out.zero_();
  const int n_col_tiles = (C + kMaxCols - 1) / kMaxCols;
  const int cols = (C + n_col_tiles - 1) / n_col_tiles;  // balanced column tiles
  const int64_t blocks = BH * n_col_tiles;
  TORCH_CHECK(blocks < (int64_t(1) << 31), "causal_product (CUDA kernel): too many heads, N * H = ", BH);
#define CP_LAUNCH [&] { launch<scalar_t>(a, b, c, out, reverse, blocks, n_col_tiles, cols); }
  AT_DISPATCH_SWITCH(a.scalar_type(), "causal_product_cuda", AT_DISPATCH_CASE(at::kFloat, CP_LAUNCH)
                     AT_DISPATCH_CASE(at::kHalf, CP_LAUNCH) AT_DISPATCH_CASE(at::kBFloat16, CP_LAUNCH));
#undef CP_LAUNCH
  return out;
}

void check_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  TORCH_CHECK(q.is_cuda() && k.is_cuda() && v.is_cuda(), "causal_product (CUDA kernel): q, k, v must be CUDA tensors");
  TORCH_CHECK(q.device() == k.device() && q.device() == v.device(), "causal_product: q, k, v must be on one device");
  check_qkv_shapes(q, k, v);
  TORCH_CHECK(q.scalar_type() == at::kFloat || q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16,
              "causal_product (CUDA kernel): float32, float16 or bfloat16 only, got ", q.scalar_type(),
              "; use impl='chunked'");
  TORCH_CHECK(q.size(3) <= kMaxDim && v.size(3) <= kMaxDim, "causal_product (CUDA kernel): head dims E, M <= ",
              kMaxDim, " supported, got E=", q.size(3), ", M=", v.size(3), "; use impl='chunked'");
  TORCH_CHECK(q.size(2) < (int64_t(1) << 31) / kMaxDim, "causal_product (CUDA kernel): sequence too long");
}

}  // namespace

// q, k (N, H, L, E), v (N, H, L, M) -> out (N, H, L, M)
at::Tensor causal_product_forward(at::Tensor q, at::Tensor k, at::Tensor v) {
  check_inputs(q, k, v);
  const at::cuda::OptionalCUDAGuard device_guard(device_of(q));
  return causal_dot(q.contiguous(), k.contiguous(), v.contiguous(), /*reverse=*/false);
}

// q, k (N, H, L, E), v, grad_out (N, H, L, M) -> (grad_q, grad_k, grad_v)
std::tuple<at::Tensor, at::Tensor, at::Tensor> causal_product_backward(at::Tensor q, at::Tensor k, at::Tensor v,
                                                                       at::Tensor grad_out) {
  check_inputs(q, k, v);
  TORCH_CHECK(grad_out.sizes() == v.sizes() && grad_out.scalar_type() == v.scalar_type() &&
                  grad_out.device() == v.device(),
              "causal_product backward: grad_out must match v in shape, dtype and device");
  const at::cuda::OptionalCUDAGuard device_guard(device_of(q));
  q = q.contiguous(); k = k.contiguous(); v = v.contiguous();
  auto g = grad_out.contiguous();
  auto gq = causal_dot(g, v, k, /*reverse=*/false);  // (N, H, L, E)
  auto gk = causal_dot(v, g, q, /*reverse=*/true);   // (N, H, L, E)
  auto gv = causal_dot(k, q, g, /*reverse=*/true);   // (N, H, L, M)
  return {gq, gk, gv};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Causal linear attention numerator (CUDA): out_i = sum_{j<=i} (q_i . k_j) v_j";
  m.def("forward", &causal_product_forward, "forward(q, k, v) -> out; q, k (N,H,L,E), v (N,H,L,M)");
  m.def("backward", &causal_product_backward, "backward(q, k, v, grad_out) -> (grad_q, grad_k, grad_v)");
}

#!/usr/bin/env bash
# Compile-check the CUDA causal product (csrc/causal_product_cuda.cu) to an object file
# with nvcc against torch's headers; needs no GPU and no CUDA build of torch.
#   csrc/compile_check.sh            (env: NVCC, PYTHON, CUDA_ARCH=90, CXX_STD=c++20)
# CXX_STD defaults to what torch.utils.cpp_extension passes to nvcc for torch 2.13 (c++20;
# its headers use C++20 features, with c++17 nvcc and gcc print many warnings).
# Exits 0 with a one-line skip message when nvcc is absent, non-zero when compiling fails.
set -euo pipefail

src="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/causal_product_cuda.cu"
nvcc="${NVCC:-$(command -v nvcc || true)}"
if [[ -z "$nvcc" && -n "${CUDA_HOME:-}" && -x "$CUDA_HOME/bin/nvcc" ]]; then nvcc="$CUDA_HOME/bin/nvcc"; fi
if [[ -z "$nvcc" ]]; then
  echo "compile_check: nvcc not found (set NVCC or CUDA_HOME); skipping the CUDA compile check"
  exit 0
fi
python="${PYTHON:-$(command -v python || command -v python3)}"
arch="${CUDA_ARCH:-90}"
std="${CXX_STD:-c++20}"

# Include paths and the C++ ABI flag of the installed torch, plus the Python headers.
mapfile -t torch_flags < <("$python" - <<'PY'
import os
import sysconfig
import torch
from torch.utils.cpp_extension import include_paths
for p in include_paths() + [sysconfig.get_paths()["include"]]:
    print(f"-I{p}")
print(f"-D_GLIBCXX_USE_CXX11_ABI={int(torch.compiled_with_cxx11_abi())}")
# A CPU-only torch ships c10/cuda headers without the CMake-generated cuda_cmake_macros.h;
# that file only sets export macros, which an object-file check does not need.
if not any(os.path.isfile(os.path.join(p, "c10/cuda/impl/cuda_cmake_macros.h")) for p in include_paths()):
    print("-DC10_CUDA_NO_CMAKE_CONFIGURE_FILE")
PY
)

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cmd=("$nvcc" -c "$src" -o "$tmp/causal_product_cuda.o" "-std=${std}"
     "-gencode=arch=compute_${arch},code=sm_${arch}" -Xcompiler -fPIC
     -DTORCH_EXTENSION_NAME=causal_product_cuda -DTORCH_API_INCLUDE_EXTENSION_H
     -D__CUDA_NO_HALF_OPERATORS__ -D__CUDA_NO_HALF_CONVERSIONS__
     -D__CUDA_NO_BFLOAT16_CONVERSIONS__ -D__CUDA_NO_HALF2_OPERATORS__
     --expt-relaxed-constexpr "${torch_flags[@]}" ${NVCC_EXTRA_FLAGS:-})
echo "compile_check: $("$nvcc" --version | tail -n 1)"
echo "compile_check: ${cmd[*]}"
start=$SECONDS
if ! "${cmd[@]}"; then
  echo "compile_check: FAILED to compile $src" >&2
  exit 1
fi
echo "compile_check: OK, $(stat -c %s "$tmp/causal_product_cuda.o") byte object for sm_${arch} in $((SECONDS - start)) s"

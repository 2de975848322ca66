"""Compile the Triton kernels for NVIDIA GPUs on a machine without one (Triton's compiler and its
bundled ptxas make cubins anywhere): every kernel `triton_linear.plan` launches, for head dims
E = M in --dims and inputs of --dtypes, checking that each fits in SHARED_LIMIT of shared memory.

    python -m imagegen.ops.triton_compile [--arch 80 90] [--dims 16 32 64 128] [--dtypes float32 float16 bfloat16]
                                          [--mapped]   (the kernels for features of other maps: phi the identity)

One line per kernel; exit status 1 when any fails to compile or needs too much shared memory.
Run it with TRITON_INTERPRET unset (interpreted kernels cannot be compiled). It shows that the
kernels compile, not that they run: launches specialise some integer arguments (strides of 1,
multiples of 16) beyond the plain i32 signature compiled here.
"""
import argparse
import os
import sys
import time

import torch

from ..dtypes import dtype_name
from .triton_linear import plan

SHARED_LIMIT = 99 * 1024  # bytes per block an sm_86 / sm_89 GPU allows (the least of sm_80 and later)
POINTERS = {torch.float32: "*fp32", torch.float16: "*fp16", torch.bfloat16: "*bf16"}


def signature(fn, constexprs, dtype):
    """Argument types of kernel fn for inputs of dtype: the saved 1 / den and d loss / d den are float32."""
    def kind(name):
        if name in constexprs:
            return "constexpr"
        if name in ("inv_ptr", "gd_ptr"):
            return "*fp32"
        if name.endswith("_ptr"):
            return POINTERS[dtype]
        return "fp32" if name == "eps" else "i32"
    return {name: kind(name) for name in fn.arg_names}


def compile_one(name, constexprs, warps, dtype, arch):
    """The compiled kernel `name` for sm_{arch}; raises what Triton raises."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from . import triton_kernels
    fn = getattr(triton_kernels, name)
    source = ASTSource(fn=fn, signature=signature(fn, constexprs, dtype), constexprs=constexprs)
    return triton.compile(source, target=GPUTarget("cuda", arch, 32), options={"num_warps": warps})


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, nargs="+", default=[80, 90])
    parser.add_argument("--dims", type=int, nargs="+", default=[16, 32, 64, 128])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "float16", "bfloat16"],
                        choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--mapped", action="store_true", help="compile the MAPPED variants (phi the identity)")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "") not in ("", "0"):
        sys.exit("triton_compile: unset TRITON_INTERPRET (interpreted kernels cannot be compiled)")
    failures = 0
    for arch in args.arch:
        for dtype in (getattr(torch, d) for d in args.dtypes):
            for dim in args.dims:
                for launch, (name, constexprs, warps) in plan(dim, dim, dtype, mapped=args.mapped).items():
                    what = f"sm_{arch} {dtype_name(dtype):8s} E=M={dim:<3d} {launch:7s}" + " mapped" * args.mapped
                    start = time.perf_counter()
                    try:
                        shared = compile_one(name, constexprs, warps, dtype, arch).metadata.shared
                    except Exception as exc:  # a compile error names the kernel line
                        failures += 1
                        print(f"{what} FAILED: {(str(exc).strip().splitlines() or [type(exc).__name__])[0]}")
                        continue
                    verdict = "ok" if shared <= SHARED_LIMIT else f"TOO MUCH (limit {SHARED_LIMIT // 1024} KiB)"
                    failures += shared > SHARED_LIMIT
                    print(f"{what} {shared / 1024:5.0f} KiB shared  {time.perf_counter() - start:4.1f} s  {verdict}",
                          flush=True)
    print(f"triton_compile: {'all compiled' if not failures else f'{failures} failed'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

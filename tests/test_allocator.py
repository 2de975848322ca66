"""The C++ kernel's CPU allocator (csrc/allocator.cpp), which ops.allocator.for_device gives torch: tensors
stay 64-byte aligned and behave as before, and a freed block is what the next tensor of its size gets."""
import os
import subprocess
import sys

import pytest

from fixtures import skip_without_cpu_kernel

CODE = """
import io, torch
from imagegen.ops import load_kernel
assert load_kernel("cpu").use_recycling_allocator()
x = torch.arange(1000.0)
assert x.data_ptr() % 64 == 0 and x.sum().item() == 499500.0
assert torch.zeros(0).numel() == 0 and torch.empty(0, 5).shape == (0, 5)
x.resize_(5000)                                           # a storage grown through the allocator
assert x[:1000].sum().item() == 499500.0
buf = io.BytesIO(); torch.save(x[:10], buf); buf.seek(0)
assert torch.load(buf, weights_only=True).tolist() == list(range(10))
assert torch.from_numpy(x.numpy()[:3]).tolist() == [0.0, 1.0, 2.0]
ptrs = set()
for i in range(8):                                         # as the numerator's outputs at 8,192 and 16,384
    ptrs.add((torch.ones(8 << 20).data_ptr(), torch.ones(16 << 20).data_ptr()))
print(len(ptrs))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the reuse rests on glibc's malloc")
def test_recycling_allocator_keeps_tensors_working_and_reuses_blocks():
    from imagegen.ops import kernel_error
    if kernel_error("cpu") is not None:
        skip_without_cpu_kernel("the allocator is in the C++ kernel")
    env = {**os.environ, "IMAGEGEN_PROBE": "0"}
    code = "from imagegen.tuning.allocator import keep_freed_memory; keep_freed_memory()\n" + CODE
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1] == "1"                        # the same two blocks every time

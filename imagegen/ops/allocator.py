"""Memory for running models on the CPU, set up in one place: `for_device`, which every command
(commands.cli.resolve_device) and imagegen.load call once their device is known."""
from ..tuning.allocator import keep_freed_memory
from .build import recycle_freed_blocks


def for_device(device):
    """On the CPU (a torch.device), make large tensors reuse freed memory rather than fault in fresh
    pages at every call: glibc's malloc keeps what is freed (`keep_freed_memory`), and torch allocates
    through the C++ kernel's allocator (`build.recycle_freed_blocks`; torch's posix_memalign blocks,
    once freed, were too small for the next tensor of the same size). Without both, large outputs fault in
    fresh pages at every call (docs/notes/code-measurements.md). True when both are in place."""
    if device.type != "cpu" or not keep_freed_memory():
        return False
    return recycle_freed_blocks()

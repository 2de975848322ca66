import os
import sys
from pathlib import Path

import pytest
import torch

# Without a GPU the Triton kernels run on CPU tensors in Triton's interpreter (tests/test_triton.py);
# triton decides that when it is first imported, so it is set here, before any test module imports it.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.insert(0, str(Path(__file__).parent))
from fixtures import write_cifar, write_mnist  # noqa: E402

# Tests never reach the network: a dataset download (data.download defaults to true) goes to a
# closed local port and fails at once with the offline sentence; tests/test_download.py serves files.
os.environ["IMAGEGEN_DATA_MIRROR"] = "http://127.0.0.1:9/"

# Tests never time anything to choose: `auto` follows the rules (CPU flags, the kernel's head-dim
# rule), so that results do not depend on the machine's load; tests/test_probe.py turns probes on
# with mocked timings and a cache folder of its own.
os.environ["IMAGEGEN_PROBE"] = "0"


@pytest.fixture(autouse=True)
def kernel_compiles_again():
    """imagegen-sample's prebuilt_only() is a process-wide switch: a command run in-process
    (tests/commands.call) must not leave the C++ kernel's compile off for the tests after it."""
    yield
    from imagegen.ops import kernel
    kernel._compile[0] = True


@pytest.fixture(scope="session")
def mnist_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("mnist")
    write_mnist(root)
    return root


@pytest.fixture(scope="session")
def cifar_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("cifar")
    write_cifar(root)
    return root

import contextlib
import os
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import settings

# The property tests (tests/test_data_fuzz.py) draw fresh examples on each run here, so that
# runs keep exploring; in CI (.ci/run sets CI=true, as CI services do) they draw a fixed
# sequence, so that a CI result can be reproduced, and fails only for a change in the code.
settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

# Without a GPU the Triton kernels run on CPU tensors in Triton's interpreter (tests/test_triton.py);
# triton decides that when it is first imported, so it is set here, before any test module imports it.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.insert(0, str(Path(__file__).parent))
sys.path.append(str(Path(__file__).parent.parent))     # tools/ (research scripts beside the package), after imagegen's
from fixtures import ci_requires, write_cifar, write_mnist  # noqa: E402

# Tests never reach the network: every URL but a local one (tests/test_download.py serves files on
# 127.0.0.1) goes through a proxy at a closed local port, in this process and in the commands it starts,
# so that a dataset download (data.download defaults to true) fails at once with the offline sentence.
os.environ.update(http_proxy="http://127.0.0.1:9", https_proxy="http://127.0.0.1:9", no_proxy="127.0.0.1,localhost")
for name in ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY", "all_proxy"):
    os.environ.pop(name, None)

# Tests never time anything to choose: `auto` follows the rules (CPU flags, the kernel's head-dim
# rule), so that results do not depend on the machine's load; tests/test_probe.py turns probes on
# with mocked timings and a cache folder of its own.
os.environ["IMAGEGEN_PROBE"] = "0"


@pytest.fixture(autouse=True)
def kernel_compiles_again():
    """imagegen-sample's prebuilt_only() is a process-wide switch: a command run in-process
    (tests/commands.call) must not leave the C++ kernel's compile off for the tests after it."""
    yield
    from imagegen.ops import build
    build.switches.compile = True


@pytest.fixture
def probes_on(monkeypatch, tmp_path):
    """Probes on (the suite runs with them off), with a verdict cache of this test's own; yields its path."""
    from torch.utils.cpp_extension import get_default_build_root
    # torch's extension root follows XDG_CACHE_HOME: keep the kernel's build where it is
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root())
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("IMAGEGEN_PROBE", raising=False)
    monkeypatch.setattr("imagegen.tuning.probe._verdicts", {})
    monkeypatch.setattr("imagegen.tuning.probe.load_now", lambda: 0.0)    # an idle machine, unless a test says
    yield tmp_path / "cache" / "imagegen" / "probes.json"


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


@pytest.fixture
def one_thread():
    """One torch thread for the test (small products: torch's OpenMP team waits out a busy core many times
    over); a module opts in with pytestmark = pytest.mark.usefixtures("one_thread")."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """Headless Debian Chromium driven by Playwright (skipped where missing, failed instead when
    IMAGEGEN_CI_REQUIRE names the browser, as in CI)."""
    from imagegen.benchmarks.browser import CHROMIUM, FLAGS
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None
    if sync_playwright is None or not os.path.exists(CHROMIUM):
        why = f"{CHROMIUM} or the playwright package is missing (apt-get install chromium; pip install -e .[dev])"
        if ci_requires("browser"):
            pytest.fail(why + ", and IMAGEGEN_CI_REQUIRE requires it")
        pytest.skip(why)
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(str(tmp_path_factory.mktemp("chromium-profile")),
                                                       executable_path=CHROMIUM, headless=True, args=FLAGS)
        yield context
        context.close()


@pytest.fixture
def serve():
    """serve(folder) -> base URL of a static server on 127.0.0.1 for that folder (the exported page's tests)."""
    from imagegen.benchmarks.browser import serve as serve_folder
    with contextlib.ExitStack() as stack:
        yield lambda folder: stack.enter_context(serve_folder(folder))


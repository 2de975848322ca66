import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from fixtures import write_cifar, write_mnist  # noqa: E402


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

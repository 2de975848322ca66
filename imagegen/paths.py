"""Where the Hydra configs (conf/) and the C++ sources (csrc/) are.

In the repository they are top-level folders beside the package; a wheel ships them inside it,
as imagegen/conf and imagegen/csrc (package-dir mapping in pyproject.toml). `data_dir` takes
the copy inside the package when there is one (pip install . or from a git URL), else the
source tree's (a checkout run in place, or pip install -e .).
"""
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent


def data_dir(name):
    """The folder `name` ("conf" or "csrc"): inside the installed package, else in the source tree."""
    inside = PACKAGE / name
    return inside if inside.is_dir() else PACKAGE.parent / name

"""The wheel's contents as pyproject.toml declares them: every subpackage of imagegen, every file of
conf/ and csrc/ (shipped inside the package as imagegen/conf and imagegen/csrc), the browser page.
.ci/wheel_check.sh builds the wheel, installs it and trains with it."""
import fnmatch
from pathlib import Path

import pytest

from imagegen.commands.cli import CONF_DIR
from imagegen.ops.build import CSRC
from imagegen.paths import data_dir

tomllib = pytest.importorskip("tomllib")  # Python 3.11+
ROOT = Path(__file__).resolve().parents[1]
SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def source_dir(package):
    """The folder of the source tree that `package` is built from (package-dir mapping)."""
    mapping = SETUPTOOLS["package-dir"]
    for prefix in sorted(mapping, key=len, reverse=True):
        if package == prefix or package.startswith(prefix + "."):
            return ROOT / mapping[prefix] / Path(*package[len(prefix):].split(".")[1:])
    return ROOT / Path(*package.split("."))


def test_every_subpackage_and_data_folder_is_listed():
    code = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "imagegen").rglob("__init__.py")}
    data = {".".join(("imagegen", *d.relative_to(ROOT).parts)) for top in ("conf", "csrc")
            for d in [ROOT / top, *(ROOT / top).rglob("*")] if d.is_dir() and d.name != "__pycache__"}
    assert set(SETUPTOOLS["packages"]) == code | data | {"imagegen.checkpoints"}   # shipped models: its top level only


def test_every_config_and_source_file_is_package_data():
    shipped = set()
    for package, globs in SETUPTOOLS["package-data"].items():
        folder = source_dir(package)
        shipped |= {f for f in folder.iterdir() if f.is_file() and any(fnmatch.fnmatch(f.name, g) for g in globs)}
    files = {f for top in ("conf", "csrc") for f in (ROOT / top).rglob("*")
             if f.is_file() and "__pycache__" not in f.parts}
    models = {f for f in (ROOT / "checkpoints").iterdir() if f.is_file() and f.name != ".gitkeep"}   # runs are folders
    page = {f for f in (ROOT / "imagegen" / "web").iterdir() if f.is_file() and f.suffix != ".py"}   # the browser page
    assert files | models | page == shipped, sorted(map(str, (files | models | page) ^ shipped))


def test_source_tree_run_finds_the_repository_folders():
    assert CONF_DIR == data_dir("conf") == ROOT / "conf" and CSRC == ROOT / "csrc"
    assert (CONF_DIR / "train.yaml").is_file() and (CSRC / "numerator.cpp").is_file()

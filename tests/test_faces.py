"""Each package face (imagegen/__init__.py and every subpackage's __init__.py) names its public names in
`__all__`: every name it re-exports, each of which resolves; a face that re-exports nothing lists its
public modules, each of which exists."""
import ast
import importlib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "imagegen"
FACES = sorted(PACKAGE.rglob("__init__.py"))


def declared(tree):
    """The names of `__all__ = [...]` in a module's body, or None."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return ast.literal_eval(node.value)
    return None


@pytest.mark.parametrize("face", FACES, ids=lambda p: str(p.parent.relative_to(PACKAGE.parent)))
def test_each_face_lists_its_public_names(face):
    tree = ast.parse(face.read_text())
    names = declared(tree)
    assert names is not None, f"{face}: no __all__"
    assert len(set(names)) == len(names), f"{face}: a name twice in __all__"
    reexported = {a.asname or a.name for node in tree.body if isinstance(node, ast.ImportFrom) and node.level
                  for a in node.names if not (a.asname or a.name).startswith("_")}
    assert reexported <= set(names), f"{face}: re-exported but not in __all__: {sorted(reexported - set(names))}"
    module = importlib.import_module(".".join(face.parent.relative_to(PACKAGE.parent).parts))
    for name in names:
        assert hasattr(module, name) or (face.parent / f"{name}.py").is_file(), f"{face}: {name} is not there"

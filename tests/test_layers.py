"""Import circles among imagegen's modules, read from the source with `ast` (nothing is imported).

Every import counts: at module level and inside functions (an import inside a function that reaches
back up is still a circle, only a hidden one). `python tests/test_layers.py` prints the circles of the
whole package; the test holds the packages already cleaned to none.
"""
import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "imagegen"
CLEAN = ("imagegen.data", "imagegen.store")     # packages no circle may pass through


def modules(root=PACKAGE):
    """{dotted module name: its file} of every .py file under root (a package's is its __init__.py)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports(name, path, known):
    """The imagegen modules that module `name` (at `path`) imports anywhere in its body."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(base + ([node.module] if node.module else []))
            else:
                base = node.module
            # `from X import y`: y is a module when X.y is one, else a name defined in X
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:       # `import imagegen.a.b.c` of a name: its module
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def graph():
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def tangles(g):
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(max(10000, sys.getrecursionlimit()))
    for v in sorted(g):
        if v not in index:
            visit(v)
    return sorted(out)


def circles(g, limit=100000):
    """Every elementary circle [a, b, ..., a] (each once, starting at its smallest module), up to limit."""
    out = []
    for start in sorted(g):
        path, blocked = [start], {start}

        def walk(v):
            for w in sorted(g[v]):
                if len(out) >= limit:
                    return
                if w == start:
                    out.append(path + [start])
                elif w > start and w not in blocked:
                    path.append(w)
                    blocked.add(w)
                    walk(w)
                    blocked.discard(w)
                    path.pop()
        walk(start)
    return out


def in_clean(module):
    return any(module == p or module.startswith(p + ".") for p in CLEAN)


def test_no_circle_passes_through_the_clean_packages():
    g = graph()
    bad = [c for c in circles(g) if any(in_clean(m) for m in c)]
    assert not bad, "import circles through " + ", ".join(CLEAN) + ":\n" + "\n".join(" -> ".join(c) for c in bad)


def test_the_graph_sees_imports_inside_functions():
    g = graph()
    assert "imagegen.data.source" in g["imagegen.commands.prepare"]          # a module-level `from ..data import`
    assert "imagegen.api" in g["imagegen"]                                    # an import inside load()


if __name__ == "__main__":
    g = graph()
    found = circles(g)
    for c in found:
        print(" -> ".join(m.removeprefix("imagegen.") for m in c))
    tangled = tangles(g)
    print(f"{len(found)} circles among {len(g)} modules, in {len(tangled)} tangles "
          f"({', '.join(str(len(t)) for t in tangled) or 'none'} modules each); "
          f"{sum(any(in_clean(m) for m in c) for c in found)} pass through {', '.join(CLEAN)}")

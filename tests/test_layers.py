"""imagegen's import graph, read from the source with `ast` (nothing is imported): no circles, and
every import points down the layers of LAYERS.

Every import counts: at module level and inside functions (an import inside a function that reaches
back up is still a circle, only a hidden one). `python tests/test_layers.py` prints the graph's
numbers, its circles and its imports that run up a layer.
"""
import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "imagegen"
# The layers, bottom first: a unit (a top-level module or package of imagegen) may import units of
# lower layers only; units of one layer do not import each other (the package face, "", is the top).
LAYERS = [
    ["errors", "paths"],
    ["say", "lock", "files", "dtypes", "config"],      # say escapes untrusted text with errors.printable
    ["tuning", "plots"],        # machine facts and choosing by measurement; figures (written through files)
    ["memory", "world"],
    ["ops"],
    ["attention"],
    ["model"],
    ["precision"],
    ["data"],
    ["store"],
    ["bits_per_dim"],
    ["sampling"],
    ["training"],
    ["web"],
    ["benchmarks"],
    ["api"],
    ["commands"],
    [""],
]
LAYER = {unit: i for i, units in enumerate(LAYERS) for unit in units}


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


def unit(module):
    """imagegen.ops.kernel -> 'ops'; imagegen -> ''."""
    return module.split(".")[1] if "." in module else ""


def upward(g):
    """[(importer, imported)]: the imports that do not point to a lower layer (or within one unit)."""
    return sorted((a, b) for a, bs in g.items() for b in bs
                  if unit(a) != unit(b) and not LAYER[unit(b)] < LAYER[unit(a)])


def test_every_unit_has_a_layer():
    assert not {unit(m) for m in graph()} - set(LAYER), "add the new units to LAYERS"


def test_no_import_circle():
    found = circles(graph())
    assert not found, "import circles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_imports_point_down_the_layers():
    up = upward(graph())
    assert not up, "imports that do not point down LAYERS:\n" + "\n".join(f"{a} -> {b}" for a, b in up)


def test_the_graph_sees_imports_inside_functions():
    g = graph()
    assert "imagegen.data.source" in g["imagegen.commands.prepare"]          # a module-level `from ..data import`
    assert "imagegen.api" in g["imagegen"]                                    # an import inside load()


def reached(g, start):
    """Every module that `start` imports, directly or through others."""
    seen, todo = set(), [start]
    while todo:
        for w in g[todo.pop()] - seen:
            seen.add(w)
            todo.append(w)
    return seen


def test_benchmarks_hold_only_what_imagegen_bench_runs():
    g = graph()
    held = {m for m in g if m.startswith("imagegen.benchmarks.")} - {"imagegen.benchmarks"}
    paper = {"imagegen.benchmarks.paper_tables"}        # the paper's comparison: several mode=paper runs side by side
    assert held - reached(g, "imagegen.commands.bench") == paper, "move research tools to tools/"


def test_the_package_never_imports_the_research_tools():
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                assert not any(n == "tools" or n.startswith("tools.") for n in names), name


def test_the_model_holds_no_policy():
    """model/ imports nothing that decides how it runs: no machine facts or probes (tuning), no precision,
    no int8 selection (ops.int8): sampling's plan (sampling/plan.py) makes those choices."""
    g = graph()
    imported = {b for a, bs in g.items() if unit(a) == "model" for b in bs}
    assert not {m for m in imported if unit(m) in ("tuning", "precision") or m == "imagegen.ops.int8"}
    source = (PACKAGE / "model" / "transformer.py").read_text()
    assert "int8_keeps(" not in source and "forced_product(" not in source     # nor marks or forces int8 itself


if __name__ == "__main__":
    g = graph()
    found = circles(g)
    for c in found:
        print(" -> ".join(m.removeprefix("imagegen.") for m in c))
    up = upward(g)
    for a, b in up:
        print(f"up: {a} -> {b}")
    tangled = tangles(g)
    print(f"{len(g)} modules, {sum(map(len, g.values()))} imports; {len(found)} circles in {len(tangled)} tangles "
          f"({', '.join(str(len(t)) for t in tangled) or 'none'} modules each); {len(up)} imports up a layer")

"""The package's layers, read from the source: each imports only
downwards, and no import, lazy ones included, makes a circle
(docs/architecture.md#layers-the-python-package)."""
import ast
import os

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "clamor")

# what each layer may import, besides itself
ALLOWED = {
    "memory": {"errors", "_native"},
    "runtime": {"memory", "errors", "_native"},
    "demo": {"memory", "runtime", "errors", "_native", "__init__"},
    "dask": {"memory", "runtime", "errors", "_native"},   # (the public names, as a user)
    "errors": set(),
    "_native": {"errors", "_build"},
}


def modules():
    out = {}
    for dirpath, _, files in os.walk(ROOT):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, os.path.dirname(ROOT))[:-3].replace(os.sep, ".")
                out[rel.removesuffix(".__init__")] = path
    return out


def imports(name, path):
    """Every clamor module ``name`` imports, at the top or inside a function."""
    tree = ast.parse(open(path).read())
    pkg = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("clamor"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                base = base[:len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.startswith("clamor"):
                known = modules()
                subs = {f"{mod}.{a.name}" for a in node.names}
                found.update(subs & set(known))
                if subs - set(known):       # a name defined in mod itself, not a submodule
                    found.add(mod)
    known = modules()
    return {m for m in found if m in known and m != name}


def layer(mod):
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_each_layer_imports_only_downwards():
    wrong = []
    for name, path in modules().items():
        here = layer(name)
        if here not in ALLOWED:      # the top: __init__, cli, worker, __main__, _build
            continue
        for m in imports(name, path):
            if layer(m) != here and layer(m) not in ALLOWED[here]:
                wrong.append(f"{name} imports {m}")
    assert wrong == []


def test_no_import_circle():
    graph = {name: imports(name, path) for name, path in modules().items()}
    # a package imports what its __init__ names; a module importing its own package is not a circle
    state, circles = {}, []

    def visit(n, stack):
        state[n] = "open"
        for m in graph.get(n, ()):
            if m in n.split(".") or n.startswith(m + "."):
                continue
            if state.get(m) == "open":
                circles.append(stack[stack.index(m):] + [m] if m in stack else [n, m])
            elif m not in state:
                visit(m, stack + [m])
        state[n] = "done"

    for n in graph:
        if n not in state:
            visit(n, [n])
    assert circles == []


def test_the_checker_sees_lazy_and_relative_imports():
    """The reader itself, on a module known to import lazily."""
    found = imports("clamor.runtime.worker", os.path.join(ROOT, "runtime", "worker.py"))
    assert "clamor.runtime.executor" in found          # inside join()
    assert "clamor.memory.region" in found             # from ..memory import region

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


# Private by name, but layers of their own: the compiled module, its one
# importer and the cffi builder (each package reaches the core through _native).
CORE = {"_native", "_build", "_clamor"}


def _private(name):
    return name.startswith("_") and not name.startswith("__")


def private_uses(name, path):
    """Private names (a leading underscore: a module or an attribute) that
    module ``name`` takes from another package of clamor, at the top or
    inside a function: ``from ..runtime._x import y``, ``from ..memory.m
    import _y``, ``m._y`` on a module ``m`` imported from elsewhere."""
    tree = ast.parse(open(path).read())
    pkg = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    known = modules()
    out, alias = [], {}

    def foreign(target):
        return layer(target) != layer(name)

    def hidden(dotted):
        parts = dotted.split(".")[1:]
        return [p for i, p in enumerate(parts) if _private(p) and not (i == 0 and p in CORE)]

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")
                mod = ".".join(base[:len(base) - node.level + 1] + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if not mod.startswith("clamor"):
                continue
            for a in node.names:
                full = f"{mod}.{a.name}"
                if full in known:
                    alias[a.asname or a.name] = full
                if foreign(full if full in known else mod) and hidden(full):
                    out.append(f"{name} imports {full}")
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("clamor") and foreign(a.name) and hidden(a.name):
                    out.append(f"{name} imports {a.name}")
                if a.name in known and a.asname:
                    alias[a.asname] = a.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in alias:
            target = alias[node.value.id]
            if foreign(target) and _private(node.attr):
                out.append(f"{name} uses {target}.{node.attr} (line {node.lineno})")
    return out


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


def test_no_package_takes_another_ones_private_names():
    """Across packages (clamor.X to clamor.Y, X not Y) only public names:
    clamor.dask uses the runtime and memory as a user would, and what it
    needs has a public name in its home module."""
    wrong = []
    for name, path in modules().items():
        wrong += private_uses(name, path)
    assert wrong == []


def test_the_checker_sees_private_imports_and_attributes(tmp_path):
    """The reader itself, on a module written to break the rule each way."""
    src = tmp_path / "m.py"
    src.write_text("from ..runtime import serialize\n"
                   "from ..runtime._hidden import x\n"
                   "from ..memory.refs import _y, ArrayRef\n"
                   "from . import _own\n"
                   "def f():\n"
                   "    from .._native import lib\n"
                   "    return serialize._z(lib)\n")
    found = private_uses("clamor.dask.m", str(src))
    assert found == ["clamor.dask.m imports clamor.runtime._hidden.x", "clamor.dask.m imports clamor.memory.refs._y",
                     "clamor.dask.m uses clamor.runtime.serialize._z (line 7)"], found

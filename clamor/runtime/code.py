"""The user's own modules, shipped to workers that were not forked.

A forked worker has every module the driver imported.  A spawned or remote
one imports by name what a task's pickle names: the installed packages
it has itself (its images are checked at joining), and the user's own
modules (a script's helper module, a package under the working
directory), which it may not have, or not as the driver has them.

DESIGN.  The driver ships the source of its own modules that a stage's
payload needs with it (serialize.dumps_task: the modules of what the
payload pickled by name, their packages, and the user's modules their
globals hold, transitively; a module imported only inside a function is
not seen, and fails on the worker naming it): a module is the user's when it was
loaded from a ``.py`` file outside the standard library, the installed
packages and clamor, and no installed distribution provides it (an
editable install is installed: the worker must have it, and the image
check at joining says so).  The shipment rides in front of the stage in the same
pickle, so it is installed before the stage's functions are loaded, and it
travels only where payloads do: over the authenticated control plane.  A
worker serves shipped modules from memory through a finder at the front of
``sys.meta_path`` (nothing is written to its disk), so a module on its own
disk under the same name never shadows the driver's.  A module the driver
imported since, or reloaded (``importlib.reload``: what the driver runs
changed), is read again and reaches every worker with the next stage,
workers that join later included; a worker reloads a module it had
imported whose source changed.  Source rather than pickling by value
(cloudpickle's ``register_pickle_by_value``): the worker imports the
module by name, so its classes are the same objects in every task,
module-level state is built once per worker, not sent with every stage,
and region instances of its classes can be relocated (their type is found
by import, clamor/memory/portable.py).
"""
import hashlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import linecache
import logging
import os
import pickle
import site
import sys
import sysconfig
import threading
import types
import zlib

from ..memory import images

log = logging.getLogger("clamor")

__all__ = ["shipment", "install", "user_modules"]

_lock = threading.Lock()


# ---- driver ----------------------------------------------------------------------

def _system_roots():
    roots = set()
    paths = sysconfig.get_paths()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        if paths.get(key):
            roots.add(os.path.realpath(paths[key]))
    for p in list(getattr(site, "getsitepackages", lambda: [])()) + [site.getusersitepackages()]:
        roots.add(os.path.realpath(p))
    for prefix in {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}:
        roots.add(os.path.realpath(os.path.join(prefix, "lib")))
    roots.add(os.path.realpath(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))   # clamor
    return tuple(sorted(r.rstrip(os.sep) + os.sep for r in roots))


_roots = None
_kept = {}      # module name -> (spec it was read under, is_package, file, source bytes)
_verdict = {}   # module name -> (spec, file or None): whether it is the user's


def _own_file(name, mod):
    """The module's source file if it is one of the user's own, else None."""
    global _roots
    spec = getattr(mod, "__spec__", None)
    seen = _verdict.get(name)
    if seen is not None and seen[0] is spec:
        return seen[1]
    path = getattr(mod, "__file__", None)
    own = None
    if (name != "__main__" and spec is not None and isinstance(path, str) and path.endswith(".py")
            and isinstance(getattr(spec, "loader", None), importlib.machinery.SourceFileLoader)):
        if _roots is None:
            _roots = _system_roots()
        real = os.path.realpath(path)
        rel = name.replace(".", os.sep) + (os.sep + "__init__.py" if os.path.basename(path) == "__init__.py" else ".py")
        if (not real.startswith(_roots) and real.endswith(os.sep + rel) and os.path.isfile(real)
                and not images.installed(name.partition(".")[0])):
            own = real
    _verdict[name] = (spec, own)
    return own


def user_modules():
    """The names of the driver's own modules that would be shipped now."""
    return sorted(n for n, m in list(sys.modules.items()) if m is not None and _own_file(n, m))


class _Shipment:
    """The driver's own modules, as a stage's payload carries them: pickled
    as a call of ``install`` on the worker."""

    __slots__ = ("digest", "blob")

    def __init__(self, digest, blob):
        self.digest, self.blob = digest, blob

    def __reduce__(self):
        return install, (self.digest, self.blob)


_last = {}         # forked_only -> (key of what was shipped last, its _Shipment)
_fork_specs = {}   # module name -> the spec of the module a forked worker inherited first


def note_fork():
    """Driver, before it forks a worker: the worker inherits the user's
    modules as they are now."""
    with _lock:
        for name, mod in list(sys.modules.items()):
            if mod is not None and name not in _fork_specs and _own_file(name, mod):
                _fork_specs[name] = id(mod.__spec__)


def _needed(used):
    """The user's modules among ``used`` (module names a payload pickled
    by name), with their packages and, transitively, the user's modules
    their globals hold (``import util``, ``from util import f``): what a
    worker imports to load the payload."""
    todo = [n for n in used if isinstance(n, str)]
    out = set()
    while todo:
        name = todo.pop()
        mod = sys.modules.get(name)
        if name in out or mod is None or not _own_file(name, mod):
            continue
        out.add(name)
        parts = name.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)))
        for v in list(vars(mod).values()):
            if isinstance(v, types.ModuleType):
                todo.append(v.__name__)
            else:
                m = getattr(v, "__module__", None) if isinstance(v, (types.FunctionType, type)) else None
                if isinstance(m, str) and m != name:
                    todo.append(m)
    return out


def shipment(used, forked_only=False):
    """The driver's own modules that a payload needs (``used``: the modules
    it pickled by name) as a ``_Shipment``, or None if none.
    ``forked_only`` (every worker was forked: they have every module, and
    import from the driver's disk what it imported since): only those the
    driver reloaded since it forked.  Reads a module's file when the module
    is new here or was reloaded."""
    with _lock:
        mods = []
        for name in sorted(_needed(used)):
            mod = sys.modules.get(name)
            path = _own_file(name, mod)
            spec = mod.__spec__
            if forked_only and _fork_specs.get(name, id(spec)) == id(spec):
                continue
            kept = _kept.get(name)
            if kept is None or kept[0] is not spec:
                try:
                    with open(path, "rb") as f:
                        src = f.read()
                except OSError as err:
                    log.warning("cannot read the source of module %s to ship it to workers: %s", name, err)
                    continue
                kept = _kept[name] = (spec, os.path.basename(path) == "__init__.py", path, src)
            mods.append((name, kept[1], kept[2], kept[3], id(spec)))
        if not mods:
            return None
        mods.sort()
        key = tuple((m[0], m[4]) for m in mods)
        last = _last.get(forked_only)
        if last is not None and last[0] == key:
            return last[1]
        h = hashlib.sha256()
        for name, pkg, path, src, _ in mods:
            h.update(b"%s\0%d\0%s\0%d\0" % (name.encode(), pkg, path.encode(), len(src)) + src)
        blob = zlib.compress(pickle.dumps(mods, protocol=4), 6)
        _last[forked_only] = (key, _Shipment(h.hexdigest(), blob))
        return _last[forked_only][1]


# ---- worker ----------------------------------------------------------------------

class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves the driver's modules from memory, ahead of the worker's own
    path."""

    def __init__(self):
        self.mods = {}       # name -> (is_package, driver's file, source)
        self.last = None      # the shipment installed last (one that comes again changes nothing)

    def find_spec(self, name, path=None, target=None):
        m = self.mods.get(name)
        if m is None:
            return None
        spec = importlib.util.spec_from_loader(name, self, origin=m[1], is_package=m[0])
        spec.has_location = True   # tracebacks name the driver's file
        return spec

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        name = module.__spec__.name
        pkg, path, src = self.mods[name]
        module.__file__ = path
        if pkg:
            module.__path__ = []
        text = src.decode("utf-8", "replace")
        linecache.cache[path] = (len(text), None, text.splitlines(True), path)
        exec(compile(src, path, "exec", dont_inherit=True), module.__dict__)

    def get_source(self, name):
        return self.mods[name][2].decode("utf-8", "replace")


_finder = None
_forked = [False]


def note_forked():
    """A forked worker: the modules it has are the driver's own objects."""
    _forked[0] = True


def _read(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except (OSError, TypeError):
        return None


def install(digest, blob):
    """Worker: take the driver's modules (a stage's payload calls this as
    it is loaded); reload those imported here whose source changed."""
    global _finder
    with _lock:
        if _finder is None:
            _finder = _Finder()
        if digest == _finder.last:
            return None
        mods = pickle.loads(zlib.decompress(blob))
        old = dict(_finder.mods)
        # (each payload carries the modules it needs: the finder keeps
        # every module it was given, the newest source of each)
        _finder.mods.update((n, (p, f, s)) for n, p, f, s, _ in mods)
        _finder.last = digest
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)
        # What this worker imported of them before and must load again (its
        # classes may be the targets of relocated region objects: never
        # without cause): from an older shipment, if the source changed; as
        # inherited at the fork, if the driver reloaded it since (another
        # spec); from this worker's own disk, if the file differs.
        stale = []
        for n, p, f, s, spec_id in mods:
            mod = sys.modules.get(n)
            spec = getattr(mod, "__spec__", None)
            if mod is None or spec is None:
                continue
            if spec.loader is _finder and n in old:
                again = old[n][2] != s
            elif _forked[0]:
                again = id(spec) != spec_id
            else:
                again = _read(getattr(mod, "__file__", None)) != s
            if again:
                stale.append(mod)
    importlib.invalidate_caches()
    for mod in stale:
        importlib.reload(mod)
    return None

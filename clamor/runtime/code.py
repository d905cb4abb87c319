"""The user's own modules, shipped to workers that were not forked.

A forked worker has every module the driver imported.  A spawned or remote
one imports by name what a task's pickle names: the installed packages
it has itself (its images are checked at joining), and the user's own
modules (a script's helper module, a package under the working
directory), which it may not have, or not as the driver has them.

DESIGN.  The driver ships the source of its own modules with every
stage's payload (serialize.dumps_task): a module is the user's when it was
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


_last = [None, None]   # (key of what was shipped last, its _Shipment)


def shipment():
    """The driver's own modules as a ``_Shipment``, or None if it has none.
    Reads a module's file when the module is new here or was reloaded."""
    with _lock:
        mods = []
        for name, mod in list(sys.modules.items()):
            if mod is None:
                continue
            path = _own_file(name, mod)
            if path is None:
                continue
            spec = mod.__spec__
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
        if _last[0] == key:
            return _last[1]
        h = hashlib.sha256()
        for name, pkg, path, src, _ in mods:
            h.update(b"%s\0%d\0%s\0%d\0" % (name.encode(), pkg, path.encode(), len(src)) + src)
        blob = zlib.compress(pickle.dumps(mods, protocol=4), 6)
        _last[0], _last[1] = key, _Shipment(h.hexdigest(), blob)
        return _last[1]


# ---- worker ----------------------------------------------------------------------

class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves the driver's modules from memory, ahead of the worker's own
    path."""

    def __init__(self):
        self.mods = {}     # name -> (is_package, driver's file, source)
        self.digest = None

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
        if _finder.digest == digest:
            return None
        mods = pickle.loads(zlib.decompress(blob))
        old = _finder.mods
        _finder.mods = {n: (p, f, s) for n, p, f, s, _ in mods}
        _finder.digest = digest
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

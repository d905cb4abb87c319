"""Relocation targets (portable.py): what lies outside the region that a
region object may point at, and a worker not forked from the driver has
too, at its own address.  The driver numbers each target once for its
life (``Targets``): an image (the executable, libpython, an extension
module, a shared library), a symbol a worker imports by name, a constant
it makes equal and keeps, clamor's numpy allocator.  A worker binds each
number to its own address before a task reads a page whose relocation
list names it (``bind``).
"""
import bisect
import ctypes
import datetime
import importlib
import os
import pickle
import sys
import types

import numpy as np

from .. import errors
from .._native import ffi, lib
from . import _pyshare, classkeys, images
from .hooks import HANDLER

NotShareable = errors.NotShareable

_CONST_SCALARS = (int, float, complex, str, bytes)


_NAMES = {}     # path -> portable name (naming costs a look at sys.path and the file system)


def loaded_images():
    """[(portable name, path, base, lo, hi)] of this process's ELF objects."""
    cap = 1024
    while True:
        buf = ffi.new("struct clamor_image[]", cap)
        n = lib.clamor_py_images(buf, cap)
        if n <= cap:
            break
        cap = n + 64
    out = []
    for i in range(n):
        raw = ffi.string(buf[i].name).decode(errors="surrogateescape")
        if not raw.startswith("/") and raw:
            continue    # the vDSO: no file
        named = _NAMES.get(raw)
        if named is None:
            path = os.path.realpath("/proc/self/exe" if not raw else raw)
            named = _NAMES[raw] = (images.portable_name(path), path)
        out.append((*named, int(buf[i].base), int(buf[i].lo), int(buf[i].hi)))
    return out


_MODULE_FILES = {}   # realpath of an extension module's file -> its name (grows as modules load)


def _module_of_file(path):
    if path not in _MODULE_FILES:
        for name, m in list(sys.modules.items()):
            f = getattr(m, "__file__", None)
            if f and f.endswith(".so") and name not in _MODULE_FILES.values():
                _MODULE_FILES.setdefault(os.path.realpath(f), name)
    return _MODULE_FILES.get(path)


def _lookup(module, qualname):
    obj = importlib.import_module(module)
    for part in qualname.split(".") if qualname else ():
        obj = getattr(obj, part)
    return obj


def _is_const(o, depth=0):
    if type(o) in _CONST_SCALARS:
        return True
    if type(o) is slice and depth < 8:     # (pandas keeps them in its block placements)
        return all(x is None or _is_const(x, depth + 1) for x in (o.start, o.stop, o.step))
    if type(o) in (tuple, frozenset) and depth < 8 and len(o) <= 64:
        return all(_is_const(x, depth + 1) for x in o)
    return False


class Targets:
    """The driver's relocation targets: id -> (spec, driver address)."""

    def __init__(self):
        self.specs = [("null",)]
        self.addrs = [0]
        self.by_addr = {}       # object address -> id
        self.keep = []          # the objects: alive while numbered, so an address never names two
        self.by_image = {}      # portable name -> id
        self.images = []        # (lo, hi, id), this walk's
        self._starts = []
        self._ranges = None

    def _new(self, spec, addr, obj=None):
        tid = len(self.specs)
        self.specs.append(spec)
        self.addrs.append(addr)
        if obj is not None:
            self.by_addr[addr] = tid
            self.keep.append(obj)
            self._ranges = None
        return tid

    def refresh_images(self):
        imgs = []
        for name, path, base, lo, hi in loaded_images():
            tid = self.by_image.get(name)
            if tid is None or self.addrs[tid] != base:
                # (the module is looked for once: a library a module pulled in has none)
                tid = self.by_image[name] = self._new(("image", name, _module_of_file(path), base), base)
            imgs.append((lo, hi, tid))
        self.images = sorted(imgs)
        self._starts = [lo for lo, _, _ in self.images]
        self._ranges = None
        if HANDLER and HANDLER not in self.by_addr and not self.in_image(HANDLER):
            # every region array names clamor's numpy allocator (not a gc referent)
            self._new(("handler", HANDLER), HANDLER, ctypes.cast(HANDLER, ctypes.py_object).value)

    def image_pairs(self):
        """The images' hulls for the C walk: (sorted [lo, hi) pairs, count)."""
        return ffi.new("uintptr_t[]", [x for lo, hi, _ in self.images for x in (lo, hi)] or [0]), len(self.images)

    def in_image(self, addr):
        i = bisect.bisect_right(self._starts, addr) - 1
        return i >= 0 and addr < self.images[i][1]

    def ranges(self):
        """Sorted target ranges for clamor_py_match: (lo[], hi[], id[], n)."""
        if self._ranges is None:
            rs = sorted(self.images + [(a, a + 1, t) for a, t in self.by_addr.items()])
            clean = []
            for r in rs:      # (an object inside an image's hull is covered by the image)
                if clean and r[0] < clean[-1][1]:
                    continue
                clean.append(r)
            n = len(clean)
            self._ranges = (ffi.new("uintptr_t[]", [r[0] for r in clean] or [0]),
                            ffi.new("uintptr_t[]", [r[1] for r in clean] or [0]),
                            ffi.new("uint32_t[]", [r[2] for r in clean] or [0]), n)
        return self._ranges

    def class_keys(self, cls):
        """The "classkeys" target of class ``cls``, whose keys table is
        frozen for workers not forked (csrc/pyclasskeys.c): each worker
        makes its own class's table name the same attributes at the same
        places (``classkeys.adopt``) before a task reads an instance laid
        out over it.  Its number, or None (``cls`` is no symbol target, or
        its table is not frozen so)."""
        if self.classify(cls) is not None:
            return None
        names = []
        keys = lib.clamor_py_frozen_names(id(cls), id(names))
        if not keys:
            return None
        spec = ("classkeys", cls.__module__, cls.__qualname__, tuple(names), keys)
        tid = self.by_addr.get(keys)
        if tid is not None and self.specs[tid] == spec:
            return tid
        # (by the table's address: a region word that points at it, were
        # one listed, would name the worker's table)
        return self._new(spec, keys, cls)

    def classify(self, o):
        """Number ``o`` (outside the region) as a target; None if an image
        covers it, else the reason it is not portable."""
        a = id(o)
        if a in self.by_addr or self.in_image(a):
            return None
        if a == HANDLER:
            self._new(("handler", a), a, o)
            return None
        if isinstance(o, types.ModuleType):
            try:
                ok = importlib.import_module(o.__name__) is o
            except Exception:
                ok = False
            if not ok:
                return f"module {o.__name__!r} cannot be imported by name"
            self._new(("symbol", o.__name__, "", a), a, o)
            return None
        if isinstance(o, (type, types.FunctionType, types.BuiltinFunctionType)):
            mod = getattr(o, "__module__", None)
            if mod is None and isinstance(getattr(o, "__self__", None), types.ModuleType):
                mod = o.__self__.__name__
            qual = getattr(o, "__qualname__", None)
            what = f"{'class' if isinstance(o, type) else 'function'} {mod}.{qual}"
            if mod in (None, "__main__") or not qual or "<locals>" in qual:
                return f"{what} cannot be imported by a worker (define it in a module the workers can import)"
            try:
                found = _lookup(mod, qual) is o
            except Exception:
                found = False
            if not found:
                return f"{what} is not what importing {mod} and looking up {qual} gives"
            self._new(("symbol", mod, qual, a), a, o)
            return None
        if o is datetime.timezone.utc:       # (each process has its own, found by name)
            self._new(("symbol", "datetime", "timezone.utc", a), a, o)
            return None
        if type(o) is str:
            self._new(("str", o, a), a, o)
            return None
        if _is_const(o):
            self._new(("const", pickle.dumps(o, protocol=pickle.HIGHEST_PROTOCOL), a), a, o)
            return None
        if type(o) is np.dtype:
            try:
                builtin = np.dtype(o.str) is o
            except TypeError:
                builtin = False
            if builtin:
                self._new(("dtype", o.str, a), a, o)
                return None
            return "a dtype made at run time outside the region: make it inside clamor.heap()"
        return (f"a {'mutable ' if not _is_const(o) else ''}{type(o).__name__} outside the region, which a worker "
                f"not forked from the driver cannot have: build it inside clamor.heap()")


# ---- worker --------------------------------------------------------------------------

_bound = {}     # id -> the object a target resolved to (kept alive here)


def enable():
    """Ask for relocations with every page this worker fetches."""
    lib.clamor_reloc_enable(1)


def bind(specs):
    """Resolve and bind targets [(id, spec)] in this worker.  NotShareable
    if one cannot be had here (an image not loaded, a symbol not found)."""
    imgs = None
    for tid, spec in specs:
        if tid in _bound:
            continue
        kind = spec[0]
        if kind == "image":
            _, name, module, dbase = spec
            if module:
                try:
                    importlib.import_module(module)
                except Exception as err:
                    raise NotShareable(f"a region object points into {module}, which this worker cannot import: "
                                       f"{err}") from err
            imgs = imgs if imgs is not None and not module else {n: b for n, _, b, _, _ in loaded_images()}
            local = imgs.get(name)
            if local is None:
                path = images.local_path(name)
                if path is not None:
                    try:
                        ctypes.CDLL(path)
                    except OSError:
                        pass
                    imgs = {n: b for n, _, b, _, _ in loaded_images()}
                    local = imgs.get(name)
            if local is None:
                raise NotShareable(f"a region object points into {name.removeprefix('rel:')}, which this worker "
                                   f"has not loaded and cannot load")
            obj, daddr, laddr = None, dbase, local
        elif kind == "symbol":
            _, module, qual, daddr = spec
            try:
                obj = _lookup(module, qual)
            except Exception as err:
                raise NotShareable(f"a region object refers to {module}{'.' + qual if qual else ''}, which this "
                                   f"worker cannot import: {type(err).__name__}: {err}") from err
            laddr = id(obj)
        elif kind == "str":
            obj, daddr = sys.intern(spec[1]), spec[2]
            laddr = id(obj)
        elif kind == "const":
            obj, daddr = pickle.loads(spec[1]), spec[2]
            laddr = id(obj)
        elif kind == "dtype":
            obj, daddr = np.dtype(spec[1]), spec[2]
            laddr = id(obj)
        elif kind == "classkeys":
            _, module, qual, names, daddr = spec
            try:
                obj = _lookup(module, qual)
            except Exception as err:
                raise NotShareable(f"a region object is an instance of {module}.{qual}, which this worker cannot "
                                   f"import: {type(err).__name__}: {err}") from err
            laddr = classkeys.adopt(obj, names)
        elif kind == "handler":
            obj, daddr, laddr = None, spec[1], HANDLER
        elif kind == "vtable":
            _, module, qual, daddr = spec
            try:
                obj = _lookup(module, qual)
            except Exception as err:
                raise NotShareable(f"a region object uses the C methods of {module}.{qual}, which this worker "
                                   f"cannot import: {type(err).__name__}: {err}") from err
            laddr = _pyshare.vtable_of(obj)
            if not laddr:
                raise NotShareable(f"{module}.{qual} has no table of C methods on this worker")
        else:
            raise errors.ProtocolError(f"unknown relocation target kind {kind!r}")
        rc = lib.clamor_reloc_bind(tid, daddr, laddr)
        if rc:
            from .._native import check as _check
            _check(rc, "clamor_reloc_bind")
        _bound[tid] = obj


def unbind_all():
    """Forget every target bound here (the region was closed, which
    unbound them in C): the next driver numbers its targets from 1 again."""
    _bound.clear()

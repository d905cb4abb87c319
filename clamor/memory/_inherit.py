"""What the workers inherited at the last fork, and the objects outside
the region share()'s walk accepts because every worker has them (see
``clamor.memory.walk``).

``_inherited`` is rebound by ``note_fork``: read it as
``_inherit._inherited``, never imported by name.
"""
import gc
import types

import numpy as np

from .._native import ffi, lib
from ._kinds import _HEAPTYPE, _STATIC, data_only

LONG_MIN = -(1 << 63)   # clamor_py_snapshot: out of memory

_inherited = None  # _Snapshot of the objects alive at the last fork


class _Snapshot:
    """The addresses of the objects alive at a fork (sorted), each with a
    fingerprint of what a reader sees of it then (csrc/pyfinger.c): an
    address alone cannot tell the object the workers inherited from one
    made later at the same address, after the first was freed."""

    def __init__(self, ids, fps):
        self.ids, self.fps, self.n = ids, fps, len(ids)
        self._ids = ffi.cast("uint64_t *", ids.ctypes.data)
        self._fps = ffi.cast("uint64_t *", fps.ctypes.data)

    def __len__(self):
        return self.n

    def has(self, addr):
        """Was an object at ``addr`` at the fork?"""
        return bool(lib.clamor_py_snapshot_has(addr, self._ids, self.n))

    def same(self, o):
        """1: ``o`` reads as the object the workers inherited at its
        address; 0: nothing was there; -1: another object, or this one
        changed since."""
        return lib.clamor_py_inherited(id(o), self._ids, self._fps, self.n)


def note_fork():
    """Remember what the workers about to be forked will inherit."""
    global _inherited
    _inherited = None
    lib.clamor_py_frozen_accept(0)      # (until the fork: classkeys.accept)
    objs = gc.get_objects()
    cap = 4 * len(objs) + 4096
    while True:
        raw = np.empty(cap, dtype=np.uint64)
        n = lib.clamor_py_snapshot(id(objs), ffi.cast("uint64_t *", raw.ctypes.data), len(raw))
        if n == LONG_MIN:
            raise MemoryError("no memory for the snapshot of the objects the workers inherit")
        if n >= 0:
            break
        cap = -n + 4096    # (objects made since the last try may be reached too)
    # each address once; sorted for the lookups (no object is made in
    # between that could be missed: objs holds them all)
    ids = np.sort(raw[:n])
    del raw
    fps = np.empty_like(ids)
    # every object is alive while ``objs`` holds it or the objects that
    # refer to it; the call runs no Python code
    lib.clamor_py_fingerprints(ffi.cast("uint64_t *", ids.ctypes.data), ffi.cast("uint64_t *", fps.ctypes.data),
                               len(ids))
    del objs
    _inherited = _Snapshot(ids, fps)


def _ok_outside(o):
    if isinstance(o, (type, types.FunctionType, types.CodeType)):
        # a static (C) type is in every process of the image; a class,
        # function or code object made after the fork is not
        static = isinstance(o, type) and not (o.__flags__ & _HEAPTYPE)
        return static or _inherited is None or _inherited.has(id(o))
    if isinstance(o, _STATIC) or o is None or o is True or o is False or o is Ellipsis or o is NotImplemented:
        return True
    if type(o) is int and -5 <= o <= 256:
        return True
    if type(o) is str and (not o or (len(o) == 1 and ord(o) < 256)):
        return True  # the empty string and the Latin-1 characters are singletons
    return _inherited is not None and _inherited.same(o) == 1


def _vouched_by_words(o):
    """Was ``o`` accepted outside the region by its fingerprint at the fork
    (not as a type, function, module or singleton every process has)?"""
    return not isinstance(o, _STATIC) and not data_only(o) and _inherited is not None and \
        _inherited.same(o) == 1


def _replaced(o):
    """Is ``o`` at the address of an object the workers inherited, but not
    that object as they have it?"""
    return _inherited is not None and _inherited.same(o) == -1

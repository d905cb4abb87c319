"""Words of region objects that a page version shows workers as zero.

Some words of a region object point at what the driver's process made for
it after the Cluster forked, outside the region: its list of weak
references (which starts in its body) once the driver made a weak
reference to it outside ``heap()``, and an array's cached buffer
description once the driver exported its buffer (a Cython memoryview).  A
forked worker would follow the driver's pointer into its own memory, and
write through it (``weakref.ref``; pandas' ``take``).  The walks (share()
and the check before a stage) note such objects here; each page version
then shows those words zero (``csrc/pyhide.c``,
clamor_py_version_begin_hiding), which is always right for a worker: it
never frees a region object, and makes its own references and
descriptions.  Workers not forked relocate the same words to zero
(``portable``).  Entries are addresses with the type seen there; one that
no longer holds such an object is forgotten at the next version.
"""
import numpy as np

from .._native import ffi, lib

_noted = {}     # address -> address of the type the walk saw there


def note(o):
    """Remember ``o`` (a region object the walk reached) if it has words to
    hide."""
    if lib.clamor_py_hides(id(o)):
        _noted[id(o)] = id(type(o))


def version_begin(version):
    """clamor_version_begin(version) with the noted words shown zero to it;
    returns its result code."""
    n = len(_noted)
    objs = np.fromiter(_noted.keys(), np.uint64, n)
    types = np.fromiter(_noted.values(), np.uint64, n)
    state = np.zeros(n, np.int8)
    rc = lib.clamor_py_version_begin_hiding(version, ffi.cast("const uint64_t *", objs.ctypes.data),
                                            ffi.cast("const uint64_t *", types.ctypes.data),
                                            ffi.cast("int8_t *", state.ctypes.data), n)
    for a in objs[state == 0].tolist():
        del _noted[a]
    return rc


def noted():
    """How many objects are noted now."""
    return len(_noted)

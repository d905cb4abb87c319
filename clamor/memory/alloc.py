"""Allocation in the region: raw blocks and numpy arrays.

The driver allocates; workers read.  Raw blocks follow malloc semantics and
are named by their address.  ``empty``/``zeros``/``full``/``array`` return
ndarrays whose buffer lives in the region and is freed when the array (and
every view of it) is gone.
"""
import errno
import operator
import os

import numpy as np

from .. import errors
from . import region
from .._native import check, error, ffi, lib

_MAX = (1 << 63) - 1
_ALLOC_CLASSES = {errno.EINVAL: errors.InvalidSize, errno.ENOMEM: errors.RegionExhausted}


def _size(n, what="size"):
    if isinstance(n, bool):
        raise errors.InvalidSize(f"{what} must be an int, not bool")
    try:
        n = operator.index(n)
    except TypeError:
        raise errors.InvalidSize(f"{what} must be an int, not {type(n).__name__}") from None
    if n < 0:
        raise errors.InvalidSize(f"{what} must be >= 0, not {n}")
    if n > _MAX:
        raise errors.InvalidSize(f"{what} {n} is larger than any region")
    return n


def _addr(p):
    return int(ffi.cast("uintptr_t", p))


def _fail(what):
    rc = ffi.errno or errno.ENOMEM
    raise error(rc, what, _ALLOC_CLASSES)


def alloc(nbytes, align=16, atomic=False):
    """Allocate ``nbytes`` in the region; returns the address (an int).

    ``align`` must be a power of two.  ``atomic``: the block will never
    hold a pointer (plain data), so ``share()`` never scans it.  Maps the region with its defaults if
    this process has none yet.  Raises InvalidSize (negative, non-integer or
    huge size, bad alignment), RegionExhausted (no room: a MemoryError),
    NotDriver (in a worker); the allocation functions below alike.
    """
    nbytes, align = _size(nbytes), _size(align, "align")
    if align == 0 or align & (align - 1):
        raise errors.InvalidSize(f"align must be a power of two, not {align}")
    region.ensure()
    ffi.errno = 0
    if atomic:
        p = lib.clamor_malloc_atomic(nbytes) if align <= 16 else lib.clamor_aligned_alloc_atomic(align, nbytes)
    else:
        p = lib.clamor_malloc(nbytes) if align <= 16 else lib.clamor_aligned_alloc(align, nbytes)
    if p == ffi.NULL:
        _fail(f"alloc({nbytes})")
    return _addr(p)


def calloc(n, size):
    """Allocate ``n * size`` zeroed bytes; returns the address (errors as
    ``alloc``; an overflowing product is InvalidSize or RegionExhausted)."""
    n, size = _size(n, "n"), _size(size)
    region.ensure()
    ffi.errno = 0
    p = lib.clamor_calloc(n, size)
    if p == ffi.NULL:
        _fail(f"calloc({n}, {size})")
    return _addr(p)


def _ptr(addr):
    try:
        addr = operator.index(addr)
    except TypeError:
        raise errors.InvalidPointer(f"an address is an int, not {type(addr).__name__}") from None
    if addr < 0 or addr >= 1 << 64:
        raise errors.InvalidPointer(f"{addr:#x} is not an address")
    return ffi.cast("void *", addr)


def free(addr):
    """Free a block from ``alloc``.  Freeing a foreign or freed address raises
    InvalidPointer and leaves the heap as it was.  ``free(0)`` does nothing."""
    check(lib.clamor_free_checked(_ptr(addr)), "free",
          {errno.EINVAL: errors.InvalidPointer, errno.EPERM: errors.NotDriver})


def realloc(addr, nbytes):
    """Resize a block; returns its (possibly new) address.  ``realloc(0, n)``
    allocates; the block is left as it was on failure.  InvalidPointer for
    an address that is not a live block; otherwise errors as ``alloc``."""
    p, nbytes = _ptr(addr), _size(nbytes)
    region.ensure()
    if nbytes == 0:
        free(addr)
        return 0
    ffi.errno = 0
    q = lib.clamor_realloc(p, nbytes)
    if q == ffi.NULL:
        rc = ffi.errno or errno.ENOMEM
        raise error(rc, f"realloc({addr:#x}, {nbytes})",
                    {errno.EINVAL: errors.InvalidPointer, errno.ENOMEM: errors.RegionExhausted})
    return _addr(q)


def usable_size(addr):
    """Bytes usable at ``addr``; 0 if it is not a live block."""
    return int(lib.clamor_usable_size(_ptr(addr)))


def heap_stats():
    """The region allocator's bytes: ``allocated`` (live blocks) and
    ``footprint`` (pages it has in use, free lists included)."""
    return {"allocated": int(lib.clamor_heap_allocated()), "footprint": int(lib.clamor_heap_footprint())}


# ---- numpy ---------------------------------------------------------------------

def _plain(dtype):
    if dtype.hasobject:
        raise errors.ConfigError("arrays of Python objects cannot live in the region as plain data")
    return dtype


def _owned(cptr):
    gen = region.generation()

    def release(p):
        if region.generation() == gen:  # else the block died with its region
            lib.clamor_free_checked(p)

    return ffi.gc(cptr, release)


def _shape(shape):
    """A shape as a tuple of checked dimensions: an int (numpy's too) or a
    sequence of them."""
    try:
        shape = (operator.index(shape),)
    except TypeError:
        shape = tuple(shape)
    return tuple(_size(s, "dimension") for s in shape)


def view(addr, dtype, shape, strides=None, owned=False):
    """An ndarray over region memory at ``addr`` (no copy).  With ``owned``,
    the block is freed when the last view of it is gone.  Every byte the
    view can reach must lie in this process's region (InvalidPointer)."""
    dtype = _plain(np.dtype(dtype))
    shape = _shape(shape)
    addr = int(ffi.cast("uintptr_t", _ptr(addr)))
    count = 1
    for s in shape:
        count *= s
    lo = hi = addr
    if strides is None:
        hi = addr + count * dtype.itemsize
    else:
        strides = tuple(operator.index(st) for st in strides)
        if len(strides) != len(shape):
            raise errors.InvalidSize(f"{len(strides)} strides for {len(shape)} dimensions")
        if count:
            lo += sum((s - 1) * st for s, st in zip(shape, strides) if st < 0)
            hi += sum((s - 1) * st for s, st in zip(shape, strides) if st > 0) + dtype.itemsize
    if count and not region.contains(lo, hi - lo):
        raise errors.InvalidPointer(f"a view of [{lo:#x}, {hi:#x}) reaches outside this process's region")
    if owned and lo < addr:
        raise errors.InvalidPointer("an owned view starts at its block: negative strides would reach below it")
    cptr = ffi.cast("char *", addr)
    if owned:
        cptr = _owned(cptr)
    if strides is None:
        buf = ffi.buffer(cptr, hi - lo)  # keeps cptr (and its finalizer) alive
        # a subarray dtype adds its dimensions, as in np.empty(shape, dtype)
        return np.frombuffer(buf, dtype=dtype, count=count).reshape(shape + dtype.shape)
    buf = ffi.buffer(cptr - (addr - lo), hi - lo) if lo < addr else ffi.buffer(cptr, hi - lo)
    return np.ndarray(shape, dtype, buffer=buf, offset=addr - lo, strides=strides)


def empty(shape, dtype=float, align=64):
    """An uninitialised ndarray in the region; freed with its last view.
    ConfigError for an object dtype (Python objects cannot live there as
    plain data); otherwise errors as ``alloc``."""
    dtype = _plain(np.dtype(dtype))
    shape = _shape(shape)
    align = _size(align, "align")
    if align == 0 or align & (align - 1):
        raise errors.InvalidSize(f"align must be a power of two, not {align}")
    n = dtype.itemsize
    for s in shape:
        n *= s
    addr = alloc(max(n, 1), align=max(align, dtype.alignment, 16), atomic=True)
    return view(addr, dtype, shape, owned=True)


def zeros(shape, dtype=float):
    """A zero-filled ndarray in the region (errors as ``empty``)."""
    a = empty(shape, dtype)
    a.reshape(-1).view(np.uint8)[...] = 0  # every byte, struct padding too, as np.zeros
    return a


def full(shape, fill_value, dtype=None):
    """An ndarray in the region filled with ``fill_value`` (dtype: that of
    ``fill_value`` unless given; errors as ``empty``)."""
    if dtype is None:
        dtype = np.asarray(fill_value).dtype
    a = empty(shape, dtype)
    a[...] = fill_value
    return a


def in_region(a):
    """True if the ndarray's data lies in this process's region."""
    a = np.asarray(a)
    if a.nbytes == 0:
        return region.contains(a.__array_interface__["data"][0])
    return region.contains(a.__array_interface__["data"][0], a.nbytes)


def array(x, dtype=None):
    """A copy of ``x`` in the region (always copies)."""
    src = np.asarray(x, dtype=dtype)
    out = empty(src.shape, src.dtype)
    out[...] = src
    return out


def asarray(x, dtype=None):
    """``x`` itself if it is already a region array of that dtype, else a copy
    in the region."""
    if isinstance(x, np.ndarray) and (dtype is None or np.dtype(dtype) == x.dtype) and in_region(x):
        return x
    return array(x, dtype)


_C_API = ("clamor_malloc", "clamor_calloc", "clamor_realloc", "clamor_aligned_alloc", "clamor_free",
          "clamor_usable_size")


def c_api():
    """Addresses of clamor's C allocator functions, by name, for C code
    built apart from clamor (a ctypes or cffi library of your own): pass
    them in as function pointers.  Their prototypes are in ``clamor.h``
    (``clamor.get_include()``); the compiled module exports no symbols to
    link against.  Driver only, as allocation is."""
    return {name: int(ffi.cast("uintptr_t", ffi.addressof(lib, name))) for name in _C_API}


def get_include():
    """The directory that holds ``clamor.h``."""
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # clamor/
    for d in (os.path.join(pkg, "include"), os.path.join(os.path.dirname(pkg), "csrc")):
        if os.path.exists(os.path.join(d, "clamor.h")):
            return d
    raise errors.BuildError("clamor.h is not installed with this copy of clamor")

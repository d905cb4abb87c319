"""References to region data that travel instead of its bytes.

A reference names memory by its offset from the region base, so it stays
valid in a process that maps the region somewhere else (pointer-free data
such as a numpy array).  Data with internal pointers needs the common base,
which is the default everywhere.
"""
import numpy as np

from .. import errors
from . import region
from .alloc import view


def byte_bounds(a):
    """(lo, hi): the addresses of the bytes ``a`` spans (numpy's byte_bounds)."""
    if hasattr(np.lib, "array_utils"):
        return np.lib.array_utils.byte_bounds(a)
    return np.byte_bounds(a)  # pragma: no cover - numpy < 2


class Ref:
    """A raw region address, shipped as its offset: ``Ref(addr).addr`` on the
    receiving side is the same memory in that process's region."""

    __slots__ = ("offset", "nbytes")

    def __init__(self, addr, nbytes=0):
        for name, v in (("address", addr), ("nbytes", nbytes)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise errors.InvalidPointer(f"a Ref's {name} is a non-negative int, not {v!r}")
        if not region.contains(addr, max(nbytes, 1)):
            raise errors.InvalidPointer(f"{addr:#x} (+{nbytes}) is not inside this process's region")
        self.offset = addr - region.base()
        self.nbytes = nbytes

    @property
    def addr(self):
        if not region.size():
            raise errors.NoRegion("no region in this process to resolve the reference in")
        return region.base() + self.offset

    def __reduce__(self):
        return (_ref_at, (self.offset, self.nbytes))

    def __repr__(self):
        return f"clamor.Ref(offset={self.offset:#x}, nbytes={self.nbytes})"


def _ref_at(offset, nbytes):
    r = Ref.__new__(Ref)
    r.offset, r.nbytes = offset, nbytes
    return r


class ArrayRef:
    """A region ndarray shipped as offset + dtype + shape + strides."""

    __slots__ = ("offset", "data_offset", "span", "dtype", "shape", "strides", "writeable")

    def __init__(self, a):
        if a is None or isinstance(a, (float, complex, str, bytes, np.generic)):
            raise TypeError(f"clamor.ref takes a region ndarray or an address, not {type(a).__name__}")
        a = np.asarray(a)   # an array-like is never in the region: refused below
        if a.dtype.hasobject:
            raise errors.InvalidPointer("an array of Python objects holds pointers, not data: it cannot travel "
                                        "as a reference (ship the objects, built in clamor.heap(), instead)")
        lo, hi = byte_bounds(a)
        if not region.contains(lo, max(hi - lo, 1)):
            raise errors.InvalidPointer("the array's buffer is not inside the region; "
                                        "make it with clamor.empty/zeros/array")
        self.offset = lo - region.base()
        self.data_offset = a.__array_interface__["data"][0] - lo
        self.span = hi - lo
        # the dtype itself (it pickles exactly): its .descr loses alignment
        # padding and cannot describe overlapping fields
        self.dtype = a.dtype
        self.shape = a.shape
        self.strides = a.strides
        # a read-only view (broadcast_to, diagonal) stays read-only
        self.writeable = bool(a.flags.writeable)

    def get(self):
        """The array, in this process's region (no copy)."""
        base = region.base()
        if not region.size():
            raise errors.NoRegion("no region in this process to resolve the array in")
        flat = view(base + self.offset, np.uint8, (self.span,))
        out = np.ndarray(self.shape, np.dtype(self.dtype), buffer=flat, offset=self.data_offset,
                         strides=self.strides)
        if not getattr(self, "writeable", True):
            out.flags.writeable = False
        return out

    def __getstate__(self):
        return {k: getattr(self, k) for k in self.__slots__}

    def __setstate__(self, st):
        self.writeable = True   # (a reference pickled before the field existed)
        for k, v in st.items():
            setattr(self, k, v)

    def __repr__(self):
        return f"clamor.ArrayRef(offset={self.offset:#x}, dtype={self.dtype!r}, shape={self.shape})"


def ref(a):
    """A picklable reference to a region ndarray (or, for an int, address)."""
    if isinstance(a, int) and not isinstance(a, bool):
        return Ref(a)
    return ArrayRef(a)

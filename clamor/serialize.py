"""Serialization of closures and task payloads.

Functions and closures travel with cloudpickle.  A numpy array whose buffer
lives in the region travels as a reference (offset, dtype, shape, strides),
never as its bytes: the receiving worker faults in the pages it reads.  So a
closure that captures a 1 GiB region array pickles to a few hundred bytes.
A Python object that lives in the region (built under ``clamor.heap()``)
travels as its offset and is used in place by forked workers.
"""
import ctypes
import io
import pickle

import cloudpickle
import numpy as np

from . import region
from .refs import ArrayRef


def _from_ref(ref):
    return ref.get()


def _object_at(offset):
    """The Python object at region ``offset`` (a new reference).  Only for
    objects the driver built under clamor.heap(), in a process forked from
    it (their type pointers must be valid here)."""
    return ctypes.cast(region.base() + offset, ctypes.py_object).value


def _in_region(a):
    if not region.size():
        return False
    addr = a.__array_interface__["data"][0]
    return region.contains(addr, max(a.nbytes, 1))


class _Pickler(cloudpickle.CloudPickler):
    def reducer_override(self, obj):
        if type(obj) is np.ndarray and obj.nbytes and not obj.dtype.hasobject and _in_region(obj):
            return _from_ref, (ArrayRef(obj),)
        if region.size() and region.contains(id(obj)) and not isinstance(obj, type):
            # an object built under clamor.heap(): used in place on the worker
            return _object_at, (id(obj) - region.base(),)
        return super().reducer_override(obj)


def dumps(obj, protocol=pickle.HIGHEST_PROTOCOL):
    """cloudpickle ``obj``, shipping region arrays by reference."""
    buf = io.BytesIO()
    _Pickler(buf, protocol=protocol).dump(obj)
    return buf.getvalue()


loads = pickle.loads

"""Serialization of closures and task payloads.

Functions and closures travel with cloudpickle.  A numpy array whose buffer
lives in the region travels as a reference (offset, dtype, shape, strides),
never as its bytes: the receiving worker faults in the pages it reads.  So a
closure that captures a 1 GiB region array pickles to a few hundred bytes.
"""
import io
import pickle

import cloudpickle
import numpy as np

from . import region
from .refs import ArrayRef


def _from_ref(ref):
    return ref.get()


def _in_region(a):
    if not region.size():
        return False
    addr = a.__array_interface__["data"][0]
    return region.contains(addr, max(a.nbytes, 1))


class _Pickler(cloudpickle.CloudPickler):
    def reducer_override(self, obj):
        if type(obj) is np.ndarray and obj.nbytes and not obj.dtype.hasobject and _in_region(obj):
            return _from_ref, (ArrayRef(obj),)
        return super().reducer_override(obj)


def dumps(obj, protocol=pickle.HIGHEST_PROTOCOL):
    """cloudpickle ``obj``, shipping region arrays by reference."""
    buf = io.BytesIO()
    _Pickler(buf, protocol=protocol).dump(obj)
    return buf.getvalue()


loads = pickle.loads

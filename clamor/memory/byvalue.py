"""Region objects that travel by value: said once per object, counted.

A Cluster (and ``clamor.dask``) sends a region object that ``share()``
refuses by value, which computes the right answer but is the broadcast
clamor exists to avoid.  ``report`` warns (``ByValueWarning``) the first
time an object goes so, naming why and its pickled size, and counts it;
``counts()`` is what ``Cluster.stats()`` shows.
"""
import pickle
import threading
import warnings
import weakref

from ..errors import ByValueWarning
from . import region

_lock = threading.Lock()
_counts = {"objects": 0, "bytes": 0}
_told = weakref.WeakValueDictionary()   # id -> object, for those weakly referable
_told_ids = {}                          # id -> type, for the others and region objects (kept: a few per program)


def _size(obj):
    try:
        import cloudpickle
        return len(cloudpickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
    except Exception:   # (the payload's own pickling reports what cannot travel)
        return -1


def report(obj, reason, stacklevel=3, size=None):
    """``obj`` travels by value because of ``reason`` (a NotShareable's
    message): warn the first time for this object, and count it.  Returns
    whether this was the first time.  ``size``: the bytes it travels in,
    if the caller knows them (the Cluster gives its payload's); else it is
    pickled here, which a caller about to pickle it anyway can afford
    (pickling a region object can write it: numpy caches an array's buffer
    description in the array)."""
    key = id(obj)
    with _lock:
        try:
            if region.contains(key):
                # (a weak reference writes the object's list of them: a
                # pointer out of the region, which share() then refuses)
                raise TypeError("no weak reference to a region object")
            if _told.get(key) is obj:
                return False
            _told[key] = obj
        except TypeError:   # no weak references to it
            if _told_ids.get(key) is type(obj):
                return False
            _told_ids[key] = type(obj)
    if size is None:
        size = _size(obj)
    with _lock:
        _counts["objects"] += 1
        _counts["bytes"] += max(size, 0)
    what = f"{size:,} bytes pickled" if size >= 0 else "size unknown"
    warnings.warn(ByValueWarning(f"a region {type(obj).__name__} ({what}) travels by value, a copy in every task "
                                 f"that reads it, because workers cannot use it in place: {reason}"),
                  stacklevel=stacklevel)
    return True


def counts():
    """{"objects": region objects sent by value, "bytes": their pickled sizes}."""
    with _lock:
        return dict(_counts)

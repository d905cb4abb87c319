"""How region arrays travel through Dask: by reference, with the version
they were sent at, never by value.

Dask pickles a graph with ``pickle`` or ``cloudpickle``; both consult
``copyreg.dispatch_table``, so one entry for ``numpy.ndarray`` covers task
arguments, closures, ``dask.delayed`` and ``dask.bag`` alike.  An array
whose buffer lies in the region pickles as ``_global_array(ArrayRef,
version)``; any other array pickles as numpy itself would, out-of-band
buffers included (``_Buffer`` keeps protocol 5's zero-copy path and
stays loadable without clamor).

Where the reference is loaded decides what it becomes: an attached Dask
worker gets the array itself (a view of its region), any other process
(the scheduler, the driver) a ``GlobalArray`` that pickles back to the
same reference, so the version it was stamped with survives the
scheduler's re-pickling.
"""
import contextlib
import copyreg
import io
import logging
import pickle
import threading
import time

import cloudpickle
import numpy as np

from .. import errors
from ..memory import region
from ..memory.refs import ArrayRef, byte_bounds

log = logging.getLogger("clamor.dask")

_lock = threading.Lock()
# The version a region array is sent at: a callable, set while attached.
_stamp = [None]
_resolve = [False]    # True in an attached worker: references become arrays
_loaded = [0]         # GlobalArrays loaded in this process (the scheduler scans graphs once there are any)
_loaded_at = {}       # version -> when a GlobalArray of it was last loaded here
_saved = {}           # what attach() replaced, put back by uninstall()
# Per thread: ``values``, the depth of pickling by value (clamor/dask/_values.py:
# region arrays go by value too); ``tokenizing``, inside Dask's tokenizer.
local = threading.local()


class GlobalArray:
    """A region array in transit where no region resolves it: its
    reference and the version it was sent at.  Pickles to the same."""

    __slots__ = ("ref", "version")

    def __init__(self, ref, version):
        self.ref, self.version = ref, int(version)

    def __reduce__(self):
        return _global_array, (self.ref, self.version)

    def __repr__(self):
        return f"clamor.dask.GlobalArray({self.ref!r}, version={self.version})"


def _global_array(ref, version):
    if _resolve[0]:
        return ref.get()
    if getattr(local, "tokenizing", 0) and region.role() == "driver":
        # Dask's tokenizer loads what it pickled to check it: a KDTree's or a
        # model's __setstate__ needs the array itself, which the driver has
        # (a GlobalArray made it fail, and the token a random one)
        return ref.get()
    _loaded[0] += 1
    _loaded_at[version] = time.monotonic()
    return GlobalArray(ref, version)


class GlobalObject:
    """A Python object built under clamor.heap(), sent to Dask's tasks by
    reference (``clamor.dask.ref(obj)``); ``get()`` in a task gives the
    object itself, used in place on the worker (its pages relocated as
    they arrive: clamor.memory.portable).

    It resolves only in ``get()``, inside the task: a Dask worker keeps a
    queued task's arguments while it moves to other versions, and a
    reference to a region object held across a version change would be
    released against the driver's reference count, not its own."""

    __slots__ = ("offset", "version", "_obj", "__weakref__")

    def __init__(self, offset, version, obj=None):
        self.offset, self.version, self._obj = int(offset), version, obj

    def get(self):
        if self._obj is not None:      # the driver's own
            return self._obj
        if not _resolve[0]:
            raise errors.NotShareable("a clamor.dask.ref resolves in a task on an attached Dask worker (or in the "
                                      "driver), not here")
        return _object_here(self)

    def __reduce__(self):
        if self._obj is not None:
            ship = _ship[0]
            if ship is None:
                raise errors.NotShareable("clamor.dask is detached: a region object's reference cannot be sent")
            offset, version = ship(self._obj)
            return _global_object, (offset, version)
        return _global_object, (self.offset, self.version)

    def __dask_tokenize__(self):
        if self._obj is not None and _ship[0] is not None:
            return ("clamor-object",) + tuple(_ship[0](self._obj))
        return ("clamor-object", self.offset, self.version)

    def __repr__(self):
        return f"clamor.dask.GlobalObject(offset={self.offset:#x}, version={self.version})"


def _global_object(offset, version):
    _loaded[0] += 1
    if not _resolve[0]:
        _loaded_at[version] = time.monotonic()
    return GlobalObject(offset, version)


_ship = [None]          # driver: obj -> (offset, version), set while attached
_object_here = None     # worker: GlobalObject -> the object (set by the worker plugin)


def set_object_resolver(fn):
    global _object_here
    _object_here = fn


def set_shipper(fn):
    _ship[0] = fn


def _is_region_object(obj):
    size = region.size()
    return bool(size) and region.base() <= id(obj) < region.base() + size and type(obj) is not np.ndarray


def _holds_region(a):
    """Whether ndarray ``a``, not itself region data, keeps a region object
    alive where pickling does not look: its dtype, or along its ``.base``
    chain (a view of a copy whose dtype was made under heap())."""
    x = a
    while x is not None:
        if type(x) is np.ndarray:
            if _is_region_object(x.dtype) or (x is not a and in_region(x)):
                return True
            x = x.base
        else:
            return _is_region_object(x)
    return False


def _copy(a):
    """A copy of ndarray ``a`` that keeps nothing of the region alive (numpy
    gives a copy the same dtype object: an equal one made here if that one
    is a region object)."""
    if not _is_region_object(a.dtype):
        return np.array(a, copy=True)
    out = np.empty(a.shape, pickle.loads(pickle.dumps(a.dtype)))
    np.copyto(out, a, casting="no")
    return out


def in_region(a):
    """Whether ndarray ``a`` is data of this process's region."""
    if not a.nbytes or a.dtype.hasobject or not region.size():
        return False
    lo, hi = byte_bounds(a)
    return region.contains(lo, max(hi - lo, 1))


class _Buffer:
    """numpy's protocol-5 buffer of an ordinary array, for a reducer that
    does not know the pickler's protocol: a PickleBuffer (out of band if the
    pickler takes them) from protocol 5 on, a copy of the bytes below."""

    __slots__ = ("pb",)

    def __init__(self, pb):
        self.pb = pb

    def __reduce_ex__(self, protocol):
        if protocol >= 5:
            return memoryview, (self.pb,)
        return bytearray, (bytes(self.pb.raw()),)


def _version(stamp):
    """The version a region array pickled (or tokenized) now is sent at."""
    held = getattr(local, "held", None)
    if held is None:
        return stamp()
    if not held:
        held.append(stamp())
    return held[0]


@contextlib.contextmanager
def one_version():
    """Region arrays pickled or tokenized by this thread inside the block
    carry one version, the first's.  A pickler holds what it pickled, so a
    region object's reference count is up by one at the next array's
    stamp: stamped each, every array of a region object began a version,
    and the same object pickled twice (as Dask's tokenizer does to check
    a token) never gave the same bytes."""
    if getattr(local, "held", None) is not None:
        yield
        return
    local.held = []
    try:
        yield
    finally:
        local.held = None


def _reduce_ndarray(a):
    stamp = _stamp[0]
    if stamp is not None and not getattr(local, "values", 0) and in_region(a):
        return _global_array, (ArrayRef(a), _version(stamp))
    rv = a.__reduce_ex__(5)
    args = rv[1]
    if args and type(args[0]) is pickle.PickleBuffer:
        rv = (rv[0], (_Buffer(args[0]),) + tuple(args[1:])) + tuple(rv[2:])
    return rv


def _normalize(x):
    """dask's token of a region array: where it is and its version, not a
    hash of its bytes (which would read all of them on every submit)."""
    stamp = _stamp[0]
    if stamp is not None and in_region(x):
        r = ArrayRef(x)
        return ("clamor-global", r.offset, r.data_offset, r.span, repr(r.dtype), r.shape, r.strides,
                _version(stamp))
    return _saved["normalize"](x)


def install(stamp):
    """Send region arrays by reference, stamped with ``stamp()``."""
    from dask.tokenize import normalize_token

    with _lock:
        if "normalize" not in _saved:
            _saved["copyreg"] = copyreg.dispatch_table.get(np.ndarray)
            _saved["normalize"] = normalize_token.dispatch(np.ndarray)
            copyreg.pickle(np.ndarray, _reduce_ndarray)
            normalize_token.register(np.ndarray, _normalize)
        _stamp[0] = stamp


def uninstall():
    from dask.tokenize import normalize_token

    with _lock:
        _stamp[0] = None
        _ship[0] = None
        _resolve[0] = False
        if "normalize" in _saved:
            if _saved["copyreg"] is None:
                copyreg.dispatch_table.pop(np.ndarray, None)
            else:
                copyreg.dispatch_table[np.ndarray] = _saved["copyreg"]
            normalize_token.register(np.ndarray, _saved.pop("normalize"))
            _saved.pop("copyreg")


def resolve(on):
    """In an attached worker: references load as arrays."""
    _resolve[0] = bool(on)


def loaded():
    return _loaded[0]


def loaded_since(t):
    """Versions of GlobalArrays loaded here at or after monotonic time ``t``."""
    return {v for v, when in list(_loaded_at.items()) if when >= t}


class _Sink:
    def write(self, b):
        return len(b)


def _out_of_band(buf):
    return False


class _Scanner(cloudpickle.CloudPickler):
    """Walks what pickling would walk, writing nothing: the versions of the
    GlobalArrays reached, and whether a region array is reached."""

    def __init__(self, objects=True):
        super().__init__(_Sink(), protocol=5, buffer_callback=_out_of_band)
        self.versions = set()
        self.region = False
        self.objects = objects     # judge objects by their address (a worker's result)

    def persistent_id(self, obj):
        t = type(obj)
        if t is GlobalArray or t is GlobalObject:
            self.versions.add(obj.version)
            return 0
        if t is np.ndarray:
            if in_region(obj) or _holds_region(obj):
                self.region = True
            return 0
        if self.objects and _is_region_object(obj):
            self.region = True
            return 0
        return None


def _walk(pickler, obj):
    """``pickler.dump(obj)``, then forget what it saw.  A pickler's memo
    holds every object it pickled, and ``_Copier`` (its own method as its
    buffer callback) sits in a reference cycle, so its memo lived until the
    next collection: on a worker, references to region objects that
    outlived the task, released later against the driver's counts once the
    pages were fetched again (the object died here, onto CPython's free
    lists)."""
    try:
        pickler.dump(obj)
    finally:
        pickler.clear_memo()


def versions_in(obj):
    """The versions of the region arrays ``obj`` holds (a scheduler's view
    of a graph); None if it cannot be walked.  Objects are not judged by
    their address here: on the driver (whose process a LocalCluster's
    scheduler shares) an ordinary list can sit at a region address, one
    that a region list freed onto CPython's free list left, and taken for
    a region object it would not be walked (a graph's versions read as
    none, and its tasks ran at a stale version)."""
    s = _Scanner(objects=False)
    try:
        _walk(s, obj)
    except Exception as err:  # an object that does not pickle again
        log.warning("cannot look for region arrays in a task (%s: %s); it runs at the version of the others",
                    type(err).__name__, err)
        return None
    return s.versions


class _Copier(cloudpickle.CloudPickler):
    """Pickles a result with its region arrays replaced by copies (kept
    aside, in ``copies``) and its other buffers out of band."""

    def __init__(self, f):
        self.buffers, self.copies = [], []
        super().__init__(f, protocol=5, buffer_callback=self._keep)

    def _keep(self, buf):
        self.buffers.append(buf)
        return False

    def persistent_id(self, obj):
        if type(obj) is np.ndarray and in_region(obj):
            self.copies.append(_copy(obj))
            return len(self.copies) - 1
        return None   # (a region object, or an array viewing one, is pickled by value: it comes back a copy)


class _Restorer(pickle.Unpickler):
    def __init__(self, f, copies, buffers):
        super().__init__(f, buffers=buffers)
        self.copies = copies

    def persistent_load(self, pid):
        return self.copies[pid]


def detach_result(value):
    """A task's result as a value: region arrays and region objects in it
    become copies, read at the task's version (a view would be read later
    at whatever version its reader runs at, and a region object must not
    outlive its task on the worker).  Anything else is the same object."""
    if type(value) is np.ndarray:
        if in_region(value) or _holds_region(value):
            return _copy(value)
        return value
    if value is None or type(value) in (int, float, bool, str, bytes, complex):
        return value
    s = _Scanner()
    try:
        _walk(s, value)
    except Exception:
        return value   # (Dask keeps such a result in memory only; see docs/dask.md, limits)
    if not s.region:
        return value
    f = io.BytesIO()
    c = _Copier(f)
    _walk(c, value)
    return _Restorer(io.BytesIO(f.getvalue()), c.copies, c.buffers).load()

"""Region Python objects passed to Dask as they are: they travel by value,
as a Cluster sends an object its workers cannot use in place, and the
driver says so once per object (clamor.memory.byvalue).

Why by value, not an error.  Dask's tasks use a region object in place
only through ``clamor.dask.ref(obj)`` (see ``GlobalObject``).  One passed
as it is still has a right answer: the copy Dask would send of any other
object, read at submission.  An error would also fall on what the user
never meant as a global: a value taken out of one (a region list or str),
or a graph's own tuple that CPython's free lists placed at a region
address.  The warning names ``clamor.dask.ref``, once per object.

Where.  The client pickles a graph (a ``dask._expr.Expr``) in the calling
thread with ``distributed.protocol.pickle.dumps``; while attached, the
driver's graphs go through ``dumps`` here, whose picklers see every
object (``persistent_id``, which pickle calls for dicts and lists too):

- a region dict, list or set is reported, and pickled as Dask would (the
  region arrays it holds go by reference: loading a container reads none
  of their bytes, and the task reads them at its version);
- any other region object (an instance of a class, a Counter, a KDTree,
  a model) is reported, and pickled on its own, region arrays included,
  into bytes that load with ``pickle.loads``.  The scheduler loads a graph
  to order it, and a KDTree's or a model's ``__setstate__`` cannot take a
  reference instead of its arrays (it failed with "Error during
  deserialization of the task graph"); a worker loads a task outside
  the version gate, and a ``__setstate__`` that copies its arrays would
  read them at whatever version the worker holds.

Tokens.  Dask's token of such an object is the hash of those same bytes:
the same at every submit while the object is unchanged.  Dask's
tokenizer pickles other objects and loads them back to check the token
(``dask.tokenize._normalize_pickle``); a closure over a region object
loads as it pickled, since region arrays load as the arrays themselves
in the driver while it does (clamor/dask/_pickling.py).  (A failed load
made the token a random one, and with ``tokenize.ensure-deterministic``
it raised TokenizationError.)
"""
import gc
import hashlib
import io
import pickle
import sys
import types

import cloudpickle
import numpy as np

from ..memory import byvalue, region
from ..memory.walk import fields
from ._pickling import GlobalArray, GlobalObject, local, one_version

try:   # dask >= 2025.1: a graph is an expression
    from dask._expr import Expr as _Graph
except ImportError:  # pragma: no cover - an older dask: every pickle of the driver is judged
    _Graph = object

REASON = ("it was passed to Dask as it is: pass clamor.dask.ref(obj), and call .get() in the task, to use it in "
          "place")

_CONTAINERS = (dict, list, set, frozenset, bytearray)
# Values, and code: never reported.  A tuple or a float may be a graph's own,
# at a region address that CPython's free lists gave it; a function, a
# class or a module made in a block is the task, not data.
_QUIET = (str, bytes, int, float, complex, bool, tuple, type(None), range, slice, np.ndarray, np.dtype, np.generic,
          GlobalArray, GlobalObject, type, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
          types.CodeType, types.CellType, types.ModuleType)
_saved = {}


def _table_in_region(obj, lo, hi):
    """A dict or list from CPython's free list, reused outside a block, sits
    at a region address with its table outside; one built in a block has
    its table in the region (an empty one has none: nothing to report)."""
    return any(lo <= addr < hi for _, addr in fields(obj))


def _kind(obj, lo, hi):
    """None (pickled as it is, not reported), "container" (reported, pickled
    as it is) or "object" (reported, pickled on its own, by value)."""
    t = type(obj)
    if isinstance(obj, _QUIET):
        return None
    if t is dict or t is list:
        return "container" if _table_in_region(obj, lo, hi) else None
    if t in _CONTAINERS:
        return "container"
    return "object"


def by_value(obj):
    """``obj`` pickled with everything it holds by value, region arrays
    included (cloudpickle: its class may be one pickled by value)."""
    local.values = getattr(local, "values", 0) + 1
    try:
        return cloudpickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    finally:
        local.values -= 1


def _loaded(data):
    return pickle.loads(data)


_HERE = ("dask", "distributed", "tornado", "asyncio", "cloudpickle", "concurrent", "threading", "contextlib",
         "clamor", "toolz", "tlz")


def _user_stacklevel():
    """The stacklevel, for a warning raised by byvalue.report called from
    the frame that calls this, of the first frame outside Dask and clamor:
    the user's submit or compute."""
    f, n = sys._getframe(2), 0
    while f is not None:
        mod = f.f_globals.get("__name__", "")
        if mod.split(".")[0] not in _HERE and mod != "pickle":
            return 3 + n
        f, n = f.f_back, n + 1
    return 3


class _Judge:
    """What both graph picklers add: region objects reported and sent by
    value.  ``covered``: the ids of region objects reached from one
    reported already in this graph (reported once, as a whole)."""

    def _setup(self):
        self.lo = region.base()
        self.hi = self.lo + region.size()
        self.covered = set()

    def persistent_id(self, obj):
        if self.lo <= id(obj) < self.hi and id(obj) not in self.covered:
            kind = _kind(obj, self.lo, self.hi)
            if kind is not None:
                self._report(obj, kind)
        return None

    def _report(self, obj, kind):
        # said once the graph is pickled, with its size: pickling the object
        # again here, inside this pickling, made forked workers read another
        # object at a list slot in the Cluster's differential hunt
        self.covered.add(id(obj))
        if kind == "container":
            self._cover(obj)
        _pending().append(obj)

    def _cover(self, root):
        stack = [root]
        while stack:
            for r in gc.get_referents(stack.pop()):
                if self.lo <= id(r) < self.hi and id(r) not in self.covered:
                    self.covered.add(id(r))
                    if type(r) in _CONTAINERS or type(r) is tuple:
                        stack.append(r)

    def _object(self, obj):
        if self.lo <= id(obj) < self.hi and _kind(obj, self.lo, self.hi) == "object":
            return _loaded, (by_value(obj),)
        return None


class _Pickler(_Judge, pickle.Pickler):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._setup()

    def reducer_override(self, obj):
        rv = self._object(obj)
        return NotImplemented if rv is None else rv


class _CloudPickler(_Judge, cloudpickle.CloudPickler):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._setup()

    def reducer_override(self, obj):
        rv = self._object(obj)
        return super().reducer_override(obj) if rv is None else rv


def _by_value_modules(x):
    mod = getattr(sys.modules.get(getattr(x, "__module__", None) or ""), "__name__", None)
    return mod in cloudpickle.list_registry_pickle_by_value()


def dumps(x, *, buffer_callback=None, protocol=None):
    """distributed.protocol.pickle.dumps, for the driver's graphs: the same
    choice of pickle then cloudpickle, with region objects judged."""
    if not isinstance(x, _Graph) or not region.size():
        return _saved["dumps"](x, buffer_callback=buffer_callback, protocol=protocol)
    protocol = protocol or pickle.HIGHEST_PROTOCOL
    buffers = []
    kw = {"protocol": protocol}
    if protocol >= 5 and buffer_callback is not None:
        kw["buffer_callback"] = buffers.append

    def run(cls):
        buffers.clear()
        del _pending()[:]
        f = io.BytesIO()
        cls(f, **kw).dump(x)
        return f.getvalue()

    with one_version():
        try:
            try:
                out = run(_Pickler)
                if b"__main__" in out or _by_value_modules(x):
                    out = run(_CloudPickler)
            except Exception:
                out = run(_CloudPickler)
            size = len(out) + sum(memoryview(b).nbytes for b in buffers)
            for obj in _pending():
                byvalue.report(obj, REASON, stacklevel=_user_stacklevel(), size=size)
        finally:
            del _pending()[:]
    if buffer_callback is not None:
        for b in buffers:
            buffer_callback(b)
    return out


def _pending():
    """This thread's region objects the graph being pickled sends by value."""
    if not hasattr(local, "pending"):
        local.pending = []
    return local.pending


def _normalize_object(o):
    lo = region.base()
    hi = lo + region.size()
    if lo <= id(o) < hi and _kind(o, lo, hi) == "object":
        # its value, as it travels: a token with a version would begin one
        # at each submit, the object's reference counts being up meanwhile
        return "clamor-value", hashlib.sha1(by_value(o)).hexdigest()
    local.tokenizing = getattr(local, "tokenizing", 0) + 1
    try:
        with one_version():
            return _saved["normalize_object"](o)
    finally:
        local.tokenizing -= 1


def _swap(dispatch, old, new):
    """Put ``new`` wherever ``dispatch`` (a dask.utils.Dispatch) would call
    ``old``: for ``object``, and for the types it has looked up since and
    cached (functions, classes).  Returns ``old``."""
    dispatch.register(object, new)
    for cls, impl in list(dispatch._lookup.items()):
        if impl is old:
            dispatch._lookup[cls] = new
    return old


def install():
    """In the driver, while attached: graphs pickled here, tokens loaded
    with region arrays."""
    import distributed.protocol.pickle as dpickle
    from dask.tokenize import normalize_token

    if "dumps" not in _saved:
        _saved["dumps"] = dpickle.dumps
        _saved["normalize_object"] = _swap(normalize_token, normalize_token.dispatch(object), _normalize_object)
        dpickle.dumps = dumps


def uninstall():
    import distributed.protocol.pickle as dpickle
    from dask.tokenize import normalize_token

    if "dumps" in _saved:
        dpickle.dumps = _saved.pop("dumps")
        _swap(normalize_token, _normalize_object, _saved.pop("normalize_object"))


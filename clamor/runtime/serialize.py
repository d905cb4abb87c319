"""Serialization of closures and task payloads.

Functions and closures travel with cloudpickle.  A numpy array whose buffer
lives in the region travels as a reference (offset, dtype, shape, strides),
never as its bytes: the receiving worker faults in the pages it reads.  So a
closure that captures a 1 GiB region array pickles to a few hundred bytes.
A Python object that lives in the region (built under ``clamor.heap()``)
travels as its offset and is used in place by forked workers, once
``clamor.share()`` vouches for it; one that share() refuses travels by
value, as any other object does (the reason is logged at INFO level on the
``clamor.serialize`` logger; call ``clamor.share(obj)`` to see it).  For a
cluster with workers that were not forked, a region object goes by offset
only if it is also portable (``clamor.memory.portable``): those workers
relocate its pages.
"""
import ctypes
import gc
import io
import logging
import pickle
import struct
import sys
import types

import cloudpickle
import numpy as np

from .. import errors
from .._native import lib
from ..errors import NotShareable
from ..memory import byvalue, portable, region
from ..memory.refs import ArrayRef
from ..memory.share import vouch
from ..memory import walk
from ..memory.readtable import pages_array
from ..memory.walk import brought, conversions, pointer_extents
from . import code
from .collection import DataCollection

log = logging.getLogger("clamor.serialize")


def _from_ref(ref):
    return ref.get()


# False in a worker not forked from the driver (clamor/runtime/worker.py)
_in_place = [True]


def objects_in_place(allowed):
    """Whether this process may use the driver's region objects in place:
    one forked from the driver, or one that maps the region at the driver's
    address and relocates its pages (clamor.memory.portable)."""
    _in_place[0] = bool(allowed)


def object_at(offset):
    """The Python object at region ``offset`` (a new reference).  Only for
    objects the driver built under clamor.heap(), in a process forked from
    it (their type pointers must be valid here)."""
    if not _in_place[0]:
        raise NotShareable("a Python object built under clamor.heap() is used in place only by workers that map the "
                           "region at the driver's address, and this one was started with another --base; keep such "
                           "data in region arrays, which any worker reads")
    return ctypes.cast(region.base() + offset, ctypes.py_object).value


def _in_region(a):
    if not region.size():
        return False
    addr = a.__array_interface__["data"][0]
    return region.contains(addr, max(a.nbytes, 1))


# Region objects already checked by clamor.share(): id -> ((type, length),
# verdict, what it rests on).  A walk of a big structure costs, so it is not
# repeated for every stage.  It is repeated when the object grew or shrank,
# or the id names another object (type, length); when the driver changed a
# byte the walk read a pointer from (note_changed, before the Cluster's
# check of a stage and as it begins: a same-size change such as
# ``d[k] = obj``); and when a mutable object
# outside the region that the walk accepted as inherited no longer reads as
# the workers have it (at each use).  A refusal is kept until the length
# changes: the object travels by value meanwhile, which is always right.
_shared = {}
_portable = {}   # the same for the portable walk
_refused = []    # (object, reason): region objects the payload being made sends by value
# Code and collections travel by value even when a heap() block made them:
# a lambda, a closure or a collection written inside the block is the task,
# not data it reads.
_BY_VALUE = (type, np.ndarray, types.FunctionType, types.CodeType, types.CellType, types.MethodType,
             types.ModuleType, DataCollection)
_base, _end = 0, [0]


def _length(obj):
    try:
        return len(obj)
    except Exception:  # no length, or one that fails
        return -1


def _portable_check(obj):
    # (a seed the workers lack is the Cluster's to say, as an error)
    return portable.check(obj, seed=False)


def note_changed(pages):
    """As a stage begins: forget the verdicts that rest on region bytes
    among ``pages`` (the pages the driver changed) that read otherwise now
    (a library that set an attribute in a method since: it may point out of
    the region)."""
    if not len(pages) or not (_shared or _portable):
        return
    changed = pages_array(pages)
    for k in [k for k, (_, ok, reads, _obj) in _shared.items() if ok and reads is not None and not reads.note(changed)]:
        del _shared[k]
    for k in [k for k, (_, ok, reads, _obj) in _portable.items() if ok and reads is not None and reads.changed(changed)]:
        del _portable[k]


def check_stats():
    """What the checks before stages keep (process-wide): the verdicts
    remembered, the objects their walks visited, and the bytes of what
    they rest on (read tables, inherited objects named, and the relocation
    lists for workers not forked)."""
    entries = [e for known in (_shared, _portable) for e in known.values() if e[1] and e[2] is not None]
    # (a portable verdict rests on the read table its root's relocations
    # keep: one table, counted once)
    counted = {id(e[2].read) for e in entries if getattr(e[2], "read", None) is not None}
    reloc = portable.driver_nbytes(counted)
    kept = sum(e[2].nbytes() for e in entries) + reloc
    objects = sum(e[2].objects for e in entries)
    return {"verdicts": len(entries), "objects": objects, "bytes": kept, "relocation_bytes": reloc,
            "bytes_per_object": kept / objects if objects else 0.0}


def _forget_dead(known):
    """The portable walk's verdicts keep their object alive, so that no
    other object can take its address and its verdict (a KDTree freed after
    a stage and another built over it read as already checked: that walk
    rests on no bytes, so it was never repeated, and the spawned workers
    crashed in the new tree).  Those no one else holds any more go.
    (share()'s verdicts rest on the bytes they read, which a new object
    changes; holding their objects made forked workers fetch versions
    already collected.)"""
    for k in [k for k, e in known.items() if sys.getrefcount(e[3]) <= 2]:   # (the entry, the call)
        del known[k]


def _vouched(obj, known, check, begun=True):
    """Does ``check`` (share() for forked workers, its portable walk for the
    others) pass ``obj``, as remembered in ``known`` for the same object?
    An object it refuses travels by value, like any object outside the
    region, and the task computes what it would in one process.  (Often
    not the user's at all: a tuple or dict that CPython took from a free
    list holding region objects that died after a block.)"""
    sig = (type(obj), _length(obj))
    seen = known.get(id(obj))
    if seen is not None and seen[1] and getattr(seen[2], "stale", None) is not None and seen[0][0] is sig[0]:
        # a dict or list whose entries changed: only those are walked again
        # (walk.recheck; a dict that grew, too: its entries tell)
        if walk.recheck(obj, seen[2]) and seen[2].still_inherited():
            known[id(obj)] = (sig, True, seen[2], seen[3])
            return True
        del known[id(obj)]
        seen = None
    if seen is not None and seen[0] == sig and (seen[2] is None or seen[2].still_inherited()):
        return seen[1]
    rewrites = conversions[0]
    try:
        reads = check(obj)
    except NotShareable as err:
        _fresh_free_lists()
        log.info("a region %s travels by value: %s", type(obj).__name__, err)
        _refused.append((obj, str(err)))     # (said once the payload is made, with its size)
        known[id(obj)] = (sig, False, None, obj if known is _portable else None)
        return False
    if conversions[0] != rewrites and begun:
        # The walk gave instances dicts of their own (walk._own_keys): if a
        # stage began already (``begun``), its tasks read the pages as they
        # were.  By value this once; the next check finds nothing to
        # rewrite.  (Before the stage begins, Shipping.vouch's pickling, the
        # version that begins after shows the rewrite: by offset.  By value,
        # each region object in it would be checked on its own, one walk
        # and one look at this process's maps each: 24 s for a list of
        # 20,000 instances on 3.13.)
        log.info("a region %s travels by value once: its instances' dicts were rewritten as it shipped",
                 type(obj).__name__)
        return False
    _fresh_free_lists()
    known[id(obj)] = (sig, True, reads, obj if known is _portable else None)
    return True


_flushed_at = [None]     # the counters when the free lists were last emptied here


def _fresh_free_lists():
    """After a check (or before a dump): CPython's free lists hold no region
    object.  A check may drop region objects (an entry of a library's
    cache, a dict it replaced); a dead region list on the list free list
    became cloudpickle's next ``_cloudpickle_submodules`` list, which this
    pickler then sent by offset as if the user had shared it, and which
    the stage's version did not show as the driver had remade it (a worker
    died in ``_function_setstate``: updgen seed 7015).  Emptying the lists
    costs about a millisecond: only when region memory was freed, or a walk
    wrote, since the last time."""
    now = (lib.clamor_py_region_dropped(), conversions[0], brought[0])
    if now == _flushed_at[0]:
        return
    if lib.clamor_py_freelists_flush() < 0:
        raise errors.ClamorError("could not empty CPython's free lists of region objects")
    _flushed_at[0] = now


class _Pickler(cloudpickle.CloudPickler):
    in_place = None     # the first region object pickled by offset: (type name, its path if known)
    roots = None        # a list: every region object pickled by offset is appended
    forked = True       # some worker may be forked: check with share()
    portable = False    # some worker is not: check that it is portable

    modules = None      # a set: the modules of what is pickled by name (functions, classes, modules)
    version = None      # the stage whose version the tasks read, once it has begun

    def reducer_override(self, obj):
        if type(obj) is np.ndarray and obj.nbytes and not obj.dtype.hasobject and _in_region(obj):
            return _from_ref, (ArrayRef(obj),)
        if self.modules is not None:
            if isinstance(obj, types.ModuleType):
                self.modules.add(obj.__name__)
            elif isinstance(obj, (types.FunctionType, type)):
                self.modules.add(getattr(obj, "__module__", None))
        return super().reducer_override(obj)

    def persistent_id(self, obj):
        # Called for every object, containers included (reducer_override is
        # not called for dicts, lists and tuples): a Python object that lives
        # in the region, built under clamor.heap(), is used in place on the
        # worker, once clamor.share() found nothing outside the region
        # behind it.
        if _base and _base <= id(obj) < _end[0] and not isinstance(obj, _BY_VALUE):
            begun = self.version is not None
            if (self.forked and not _vouched(obj, _shared, vouch, begun)) or \
                    (self.portable and not _vouched(obj, _portable, _portable_check, begun)):
                return None
            if self.version is not None and _written_since(obj, self.version):
                log.debug("a region %s at %#x travels by value: written since stage %d began",
                          type(obj).__name__, id(obj), self.version)
                return None
            return self._by_offset(obj)
        return None

    def _by_offset(self, obj):
        if self.in_place is None:
            self.in_place = f"a region {type(obj).__name__} at {id(obj):#x}"
        if self.roots is not None:
            self.roots.append(obj)
        return ("clamor-object", id(obj) - _base)


class _Unpickler(pickle.Unpickler):
    def persistent_load(self, pid):
        if type(pid) is tuple and len(pid) == 2 and pid[0] == "clamor-object":
            return object_at(pid[1])
        raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")


def _written_since(obj, stage):
    """Was the region object ``obj`` written where its readers follow
    pointers (``walk.pointer_extents``) since ``stage`` began?  Its tasks
    read the bytes of then, and an object made at that address since is
    another object to them.  CPython makes such objects outside any block
    from its free lists, which may hold region objects that died since the
    last time they were emptied (a dict a library's ``__reduce__`` made
    while the payload was pickled: a worker read the dict that had lain
    there, a cache entry the same ``__reduce__`` had just dropped).  (A str
    or bytes is never made again at a region address outside a block, and
    its cached hash may be set since: only their tables are compared.)"""
    body = not isinstance(obj, (str, bytes))
    return any(region.differs_since(lo, n, stage) for lo, n, *_ in pointer_extents(obj, body=body) if n)


def dumps(obj, protocol=pickle.HIGHEST_PROTOCOL, objects=None, roots=None, forked=True, portable=False,
          modules=None, version=None):
    """cloudpickle ``obj``, shipping region arrays by reference.  If
    ``objects`` is a list, a description of the first region object sent
    by offset (used in place) is appended to it; if ``roots`` is a list,
    every such object.  ``forked``: some worker may be forked (region
    objects are checked with share(), and go by value if refused);
    ``portable``: some worker was not forked (they are checked to be
    portable, and go by value if not).  ``version``: the stage, begun
    already, whose version the tasks read; a region object written since
    then goes by value (``_written_since``)."""
    global _base
    _base = region.base() if region.size() else 0
    _end[0] = _base + region.size()
    buf = io.BytesIO()
    p = _Pickler(buf, protocol=protocol)
    p.roots, p.forked, p.portable, p.modules, p.version = roots, forked, portable, modules, version
    del _refused[:]
    collecting = gc.isenabled()
    try:
        if _base:
            _fresh_free_lists()
            gc.disable()    # (a collection in the dump would free region garbage onto the free lists)
        p.dump(obj)
        for refused, reason in _refused:
            byvalue.report(refused, reason, stacklevel=4, size=buf.tell())
    finally:
        del _refused[:]
        if collecting:
            gc.enable()
    if objects is not None and p.in_place is not None:
        objects.append(p.in_place)
    return buf.getvalue()


class _WithCode:
    """A payload's bytes with the driver's own modules it needs in front
    (clamor/runtime/code.py): they are installed on the worker before the
    payload is loaded."""

    __slots__ = ("ship", "data")

    def __init__(self, ship, data):
        self.ship, self.data = ship, data

    def __reduce__(self):
        return _payload, (self.ship, self.data)


def _payload(_installed, data):
    return loads(data)


def dumps_task(obj, objects=None, roots=None, forked=True, portable=False, version=None):
    """``dumps`` of a stage's payload, with the driver's own modules in
    front of it (for forked workers only those reloaded since the fork);
    what cannot travel is named in a NotSerializable error
    (the pickler's own error is its cause)."""
    _forget_dead(_portable)    # (once a stage, not for every task's data)
    used = set()
    try:
        data = dumps(obj, objects=objects, roots=roots, forked=forked, portable=portable, modules=used,
                     version=version)
        ship = code.shipment(used, forked_only=not portable)
        return data if ship is None else pickle.dumps(_WithCode(ship, data), protocol=pickle.HIGHEST_PROTOCOL)
    except errors.ClamorError:
        raise  # NotShareable says what it found itself
    except Exception as err:  # pickle raises TypeError, PicklingError, AttributeError, ...
        raise errors.NotSerializable(f"the stage's functions cannot be shipped to the workers: "
                                     f"{type(err).__name__}: {err}") from err


def loads(data):
    return _Unpickler(io.BytesIO(data)).load()


# A worker's running counters, sent with every report as twelve
# little-endian uint64s: integers need no pickle.
COUNTERS = ("faults", "bytes_fetched", "bytes_from_peers", "served", "redirects", "direct", "fallbacks", "timeouts",
            "mapped", "wire", "diff_wire", "diff_pages")
_COUNTERS = struct.Struct("<12Q")


def pack_counters(counters):
    """The counters' frame, from a dict with the COUNTERS keys."""
    return _COUNTERS.pack(*(int(counters[k]) for k in COUNTERS))


def unpack_counters(frame):
    """The dict a counters' frame holds; ProtocolError if it is not one."""
    if not isinstance(frame, (bytes, bytearray, memoryview)) or len(frame) != _COUNTERS.size:
        raise errors.ProtocolError(f"a counters frame holds {_COUNTERS.size} bytes, not "
                                   f"{len(frame) if hasattr(frame, '__len__') else frame!r}")
    return dict(zip(COUNTERS, _COUNTERS.unpack(frame)))


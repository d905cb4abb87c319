"""Bring into the region what a region object points at outside it.

A library often makes part of an object after the heap() block that built
it: a cache it fills on first use (pandas' block numbers, networkx's
adjacency views), an attribute a method sets (an int, a str).  Those live
outside the region, and a worker would read the driver's private memory
there.  When no one but the region object can see such an object, a copy
made in the region can take its place, and nothing tells the difference:
``share()`` (and the Cluster's check before a stage) does that, then walks
the copy.

A candidate is held by exactly one slot of a region object (its reference
count says so: one reference from the slot), sits in a slot the walk can
write back (a dict's value, a list's item, a settable attribute of an
extension object), and is of a kind whose copy reads the same: an
immutable constant (str, bytes, int, float, complex, and tuples and
frozensets of those), a numpy array (not of objects), a dict, list or set
(shallow: their items are walked, and brought in in turn), a dead weak
reference (pandas keeps lists of them), a live weak reference to a region
object (networkx's views hold their graph weakly), or an instance of a class
(``copy.copy``).  Anything else, or anything someone else
holds, is refused as before.
"""
import collections
import copy
import sys
import types
import weakref

import numpy as np

from . import classkeys, region
from .. import errors
from .._native import lib

_CONST = (str, bytes, int, float, complex)


def _const(o, depth=0):
    t = type(o)
    if t in _CONST:
        return True
    if t in (tuple, frozenset) and depth < 8:
        return all(_const(x, depth + 1) for x in o)
    return False


def copyable(o):
    """Can ``o`` be replaced by a copy made in the region?"""
    if isinstance(o, bool) or o is None:
        return False
    if _const(o):
        return True
    t = type(o)
    if t is np.ndarray:
        return not o.dtype.hasobject and o.base is None
    if t in (dict, list, set, weakref.ReferenceType):
        return True
    if isinstance(o, (type, types.ModuleType, types.FunctionType, types.CodeType, types.MethodType)):
        return False
    from ._pyshare import is_class
    return is_class(t) and not isinstance(o, BaseException)


def sole(o, walker_refs):
    """Does only one slot hold ``o``, besides the ``walker_refs`` references
    the caller's frame holds?"""
    return sys.getrefcount(o) - 1 - walker_refs == 1


def slot(parent, o):
    """A function that stores its argument where ``parent`` holds ``o``, or
    None: a dict's value, a list's item, an instance dict's value, a
    settable attribute of an extension object."""
    if isinstance(parent, dict):
        for k, v in dict.items(parent):
            if v is o:
                return lambda c, k=k: dict.__setitem__(parent, k, c)
        return None
    if isinstance(parent, list):
        for i, v in enumerate(list.__iter__(parent)):
            if v is o:
                return lambda c, i=i: list.__setitem__(parent, i, c)
        return None
    if isinstance(parent, (tuple, frozenset, set, np.ndarray, type)):
        return None
    if (classkeys.frozen(parent) or classkeys.keyed(parent)) and \
            lib.clamor_py_instance_replace(id(parent), id(o), id(o)):
        # (no dict made, its values table holds o: that slot, not __dict__,
        # which would make a dict outside the region; frozen at the fork, or
        # for workers not forked)
        def store(c):
            if not lib.clamor_py_instance_replace(id(parent), id(o), id(c)):
                raise errors.NotShareable(f"a {type(parent).__name__}'s attribute changed while it was brought in")
        return store
    if classkeys.frozen(parent):
        # (CPython 3.13 visits an instance's values, kept after its body,
        # not the dict over them: its region dict, there already, holds o)
        d = parent.__dict__
        for k, v in dict.items(d):
            if v is o:
                return lambda c, k=k: dict.__setitem__(d, k, c)
    for klass in type(parent).__mro__:
        for name, desc in vars(klass).items():
            if isinstance(desc, (types.GetSetDescriptorType, types.MemberDescriptorType)) and name != "__dict__":
                try:
                    if desc.__get__(parent, type(parent)) is o:
                        return lambda c, desc=desc: desc.__set__(parent, c)
                except Exception:  # (an attribute not set, a getter that fails)
                    continue
    return None


# Attributes that hold a library's cache of values it makes again when
# asked: pandas' ``cache_readonly`` (an index's hash table engine, its
# inferred type, ...).
CACHE_NAMES = frozenset({"_cache"})


class Drop:
    """Delete a cache's entry (the library makes it again on first use)."""
    __slots__ = ("d", "k")

    def __init__(self, d, k):
        self.d, self.k = d, k

    def __call__(self):
        dict.pop(self.d, self.k, None)


class Warm:
    """Make a library's lookup state now, inside the block, where a worker
    would make its own from the whole object: a pandas Index's hash table
    (its engine), built on the first lookup from every key.  A worker that
    builds it reads every page of the index; one that finds it in the
    region reads the few buckets a lookup probes."""
    __slots__ = ("o",)

    def __init__(self, o):
        self.o = o

    def __call__(self):
        try:
            self.o.get_loc(self.o[0])
        except Exception:  # (a key pandas cannot look up: the engine is left as it is)
            pass


def warms(t):
    """Can an instance of class ``t`` be ``warmable``?"""
    pd = sys.modules.get("pandas")
    return pd is not None and issubclass(t, pd.Index)


def warmable(o):
    """Is ``o`` a pandas Index (not a RangeIndex or MultiIndex, which
    look up without a table) whose hash table is not made yet?  An index
    past pandas' size threshold searches its sorted values instead, once
    its engine exists."""
    pd = sys.modules.get("pandas")
    if pd is None or not isinstance(o, pd.Index) or isinstance(o, (pd.RangeIndex, pd.MultiIndex)):
        return False
    cache = getattr(o, "_cache", None)
    if type(cache) is not dict or not len(o):
        return False
    engine = cache.get("_engine")
    if engine is None:
        return True
    return getattr(engine, "mapping", 0) is None and getattr(engine, "over_size_threshold", True) is False


class Rekey:
    """A dict some of whose constant keys are to be copied in."""
    __slots__ = ("d",)

    def __init__(self, d):
        self.d = d


def rekeyable(parent, o):
    """Is ``o`` a constant key of the dict ``parent``, whose keys can be
    made again in order (a dict, a defaultdict, a class derived from dict
    in Python such as Counter; not an OrderedDict, whose order lives in C
    nodes of its own)?  Equal constants are interchangeable as keys."""
    if not isinstance(parent, dict) or not _const(o):
        return False
    from ._pyshare import is_class
    t = type(parent)
    solid = next(b for b in t.__mro__ if not is_class(b))
    if solid not in (dict, collections.defaultdict):
        return False
    return any(k is o for k in dict.keys(parent))


def rekey(pairs):
    """Inside a heap() block: give each dict of ``pairs`` [(dict, key)] a
    copy of each key listed, keeping the order of its items (the dict is
    refilled in place: its identity stays)."""
    by_dict = {}
    for d, k in pairs:
        by_dict.setdefault(id(d), (d, {}))[1][id(k)] = k
    for d, keys in by_dict.values():
        items = list(dict.items(d))
        fresh = [(_copy_const(k) if id(k) in keys else k, v) for k, v in items]
        dict.clear(d)
        dict.update(d, fresh)


def _copy_const(o):
    t = type(o)
    if t is str:
        return (o + "\0")[:-1] if len(o) > 1 else o
    if t is bytes:
        return (o + b"\0")[:-1] if len(o) > 1 else o
    if t is int:
        return int.from_bytes(o.to_bytes((o.bit_length() + 8) // 8 or 1, "little", signed=True), "little",
                              signed=True)
    if t is float:
        return float.fromhex(o.hex())
    if t is complex:
        return complex(float.fromhex(o.real.hex()), float.fromhex(o.imag.hex()))
    return t(_copy_const(x) for x in o)


def dict_outside(o):
    """Before the block that will ``copy_in(o)``: give an instance of a
    class its dict now, outside the region, if it has none yet.  Copying it
    reads ``o.__dict__``, which makes a dict on first use (on CPython 3.13,
    always for an instance whose values lie after its body): made in the
    block, the original would hold a region dict, which the block's end
    gives a copy made outside (clamor/memory/hooks.py, _rehome), one more
    holder of everything in it."""
    t = type(o)
    if _const(o) or t in (np.ndarray, dict, list, set, weakref.ReferenceType):
        return
    try:
        object.__getattribute__(o, "__dict__")
    except AttributeError:      # (a class with slots only)
        pass


def copy_in(o):
    """A copy of ``o`` (``copyable``), made by the caller inside a heap()
    block."""
    if _const(o):
        return _copy_const(o)
    t = type(o)
    if t is np.ndarray:
        c = np.array(o, copy=True, order="K")
        c.flags.writeable = o.flags.writeable
        return c
    if t is dict:
        return dict(o)
    if t is list:
        return list(o)
    if t is set:
        return set(o)
    if t is weakref.ReferenceType:
        target = o()
        if target is None:     # a dead one (pandas' lists of views): another dead one
            holder = _Dead()
            dead = weakref.ref(holder)
            del holder
            return dead
        if not region.contains(id(target), 1):
            return o     # (its referent is outside: the walk refuses that)
        # weakref.ref(target) would hand back this one (a referent has one
        # basic reference): a new one is made in C, beside it in the list
        out = []
        del target
        if lib.clamor_py_weakref_copy(id(o), id(out)) < 0:
            raise RuntimeError("could not copy a weak reference into the region")
        return out[0]
    return copy.copy(o)


class _Dead:
    """What a dead weak reference made in the region referred to."""


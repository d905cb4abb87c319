"""``clamor.share(obj)``: can workers use ``obj`` in place?

A forked worker sees two kinds of memory at the driver's addresses: the
region (pages fetched on demand) and what it inherited at fork.  Anything
else reachable from ``obj``, such as an object a library took from a free
list or a cache while ``obj`` was built, is garbage on the worker.
``share`` walks what is reachable from ``obj`` through the Python object
graph (gc referents, with attribute, key and index names for the message)
and raises ``NotShareable`` naming the first object that is neither in the
region nor inherited.  C-level pointers inside extension objects are not
visible to it; numpy arrays are checked down to their data buffer (through
views) and, for object arrays, their items.  A region instance of a class
gets a dict with keys of its own, in the region (see ``_own_keys``).

"Inherited" is what existed when the last Cluster of this process forked
its workers (snapshot in ``note_fork``); before any fork, only objects that
every process of the same image has (types, modules, functions and code
objects, builtins, small ints, interned singletons) count.
"""
import gc
import sys
import types

import numpy as np

from . import errors, region

_inherited = None  # ids of objects alive at the last fork


class NotShareable(errors.ClamorError, ValueError):
    """Something reachable from a shared object is outside the region."""


def note_fork():
    """Remember what the workers about to be forked will inherit."""
    global _inherited
    # Neither the last snapshot nor the one being built may be walked: a set
    # is a gc container whose referents are its int ids, so each fork would
    # add the ids of those ints and the snapshot would double per Cluster.
    _inherited = None
    objs = gc.get_objects()
    ids = set()
    for o in objs:
        ids.add(id(o))
        for r in gc.get_referents(o):
            ids.add(id(r))
    _inherited = ids


_STATIC = (type, types.ModuleType, types.BuiltinFunctionType, types.FunctionType, types.CodeType,
           types.MethodDescriptorType, types.WrapperDescriptorType, types.GetSetDescriptorType,
           types.MemberDescriptorType)


_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE


def _ok_outside(o):
    if isinstance(o, (type, types.FunctionType, types.CodeType)):
        # a static (C) type is in every process of the image; a class,
        # function or code object made after the fork is not
        static = isinstance(o, type) and not (o.__flags__ & _HEAPTYPE)
        return static or _inherited is None or id(o) in _inherited
    if isinstance(o, _STATIC) or o is None or o is True or o is False or o is Ellipsis or o is NotImplemented:
        return True
    if type(o) is int and -5 <= o <= 256:
        return True
    if type(o) is str and (not o or (len(o) == 1 and ord(o) < 256)):
        return True  # the empty string and the Latin-1 characters are singletons
    return _inherited is not None and id(o) in _inherited


def _children(o):
    """(name, child) pairs, named where the structure gives a name."""
    if isinstance(o, dict):
        for k, v in o.items():
            yield f"[{k!r}]", v
            yield f"<key {k!r}>", k
        return
    if isinstance(o, (list, tuple)):
        for i, v in enumerate(o):
            yield f"[{i}]", v
        return
    # Not getattr(o, "__dict__"): CPython 3.11+ makes an instance's dict on
    # first request, outside the region, and would store its pointer in the
    # region object.  gc referents visit the attribute values in place.
    for r in gc.get_referents(o):
        yield f" -> <{type(r).__name__}>", r


_MANAGED_DICT = 1 << 4  # Py_TPFLAGS_MANAGED_DICT (CPython 3.11+)
_NONSTR_KEY = -12345   # any non-str key converts a split dict to a combined one


def _has_dict(o):
    t = type(o)
    return bool(t.__flags__ & _HEAPTYPE) and bool(t.__flags__ & _MANAGED_DICT or t.__dictoffset__)


def _own_keys(o, path):
    """Give a region instance a dict with its own keys table, in the region.

    CPython shares one keys table among the instances of a class (split
    dicts): the class's, made with the class, outside the region.  An
    attribute name first set after the workers were forked is added to
    that table in the driver only, and a worker, whose copy of the class
    is from the fork, would not find it.  A dict made and converted inside
    a heap block (one non-string key does it) keeps its own keys, in the
    region, where workers read them."""
    from ._native import lib

    def convert(fresh):
        lib.clamor_heap_enter()
        try:
            d = o.__dict__
            if fresh:
                d = o.__dict__ = dict(d)
            d[_NONSTR_KEY] = None
            del d[_NONSTR_KEY]
        finally:
            lib.clamor_heap_exit()
        return region.contains(id(d), sys.getsizeof(d))

    # The dict object may come from CPython's free list, outside the region
    # (its keys, general ones, never do): then empty the lists and make a
    # new one.
    if not convert(False):
        gc.collect()
        if not convert(True):
            raise NotShareable(f"{path}.__dict__ could not be placed in the region")


def share(obj, limit=20_000_000):
    """Check that workers can use ``obj`` in place; returns ``obj``.

    Raises NotShareable naming the path to the first object (or numpy data
    buffer) that lies neither in the region nor in memory the workers
    inherited."""
    if not region.size():
        raise errors.NoRegion("no region in this process")
    from .heap import install
    install()
    stack = [("obj", obj)]
    seen = set()
    n = 0
    while stack:
        path, o = stack.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        n += 1
        if n > limit:
            raise NotShareable(f"more than {limit} objects reachable from the shared object")
        inside = region.contains(id(o), sys.getsizeof(o) if not isinstance(o, type) else 1)
        if not inside:
            if _ok_outside(o):
                continue  # inherited: its own referents were inherited with it
            if isinstance(o, np.ndarray) and not o.dtype.hasobject and o.nbytes and \
                    region.contains(np.asarray(o).__array_interface__["data"][0], o.nbytes):
                if path == "obj":
                    continue  # shipped by itself, a region array travels as a reference
                raise NotShareable(f"{path} (ndarray at {id(o):#x}) has its data in the region but is itself an "
                                   f"object outside it, which workers cannot follow a pointer to: make the array "
                                   f"inside clamor.heap(), or pass it to tasks directly (it travels by reference)")
            raise NotShareable(f"{path} ({type(o).__name__} at {id(o):#x}) is outside the region and "
                               f"was not inherited by the workers: build it inside clamor.heap()")
        if isinstance(o, np.ndarray):
            # ndarrays are not gc containers: their base and items are
            # walked here
            if o.base is not None:
                stack.append((path + ".base", o.base))
            elif o.nbytes:
                addr = o.__array_interface__["data"][0]
                if not region.contains(addr, o.nbytes):
                    raise NotShareable(f"{path}: the data of this {o.dtype} array of {o.nbytes} bytes lies at "
                                       f"{addr:#x}, outside the region")
            if o.dtype.hasobject:
                for i, item in enumerate(o.ravel(order="K")):
                    stack.append((f"{path}.flat[{i}]", item))
            continue
        if _has_dict(o):
            _own_keys(o, path)
        for name, child in _children(o):
            stack.append((path + name, child))
    return obj

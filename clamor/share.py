"""``clamor.share(obj)``: can workers use ``obj`` in place?

A forked worker sees two kinds of memory at the driver's addresses: the
region (pages fetched on demand) and what it inherited at fork.  Anything
else reachable from ``obj``, such as an object a library took from a free
list or a cache while ``obj`` was built, is garbage on the worker.
``share`` walks what is reachable from ``obj`` through the Python object
graph (gc referents, with attribute, key and index names for the message)
and raises ``NotShareable`` naming the first object that is neither in the
region nor inherited.  C-level pointers inside extension objects are not
visible to it; numpy arrays are checked down to their data buffer.

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
    if type(o) is str and len(o) <= 1:
        return True
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
            raise NotShareable(f"{path} ({type(o).__name__} at {id(o):#x}) is outside the region and "
                               f"was not inherited by the workers: build it inside clamor.heap()")
        if isinstance(o, np.ndarray) and o.base is None and o.nbytes:
            addr = o.__array_interface__["data"][0]
            if not region.contains(addr, o.nbytes):
                raise NotShareable(f"{path}: the data of this {o.dtype} array of {o.nbytes} bytes lies at "
                                   f"{addr:#x}, outside the region")
        for name, child in _children(o):
            stack.append((path + name, child))
    return obj

"""The edges share()'s walk follows from a Python object: its children,
named for a message (``_Path``), including what the collector does not
report (a range's ints, a timezone's parts, a weak reference's referent,
a dtype's parts).
"""
import ctypes
import datetime
import gc
import weakref

from . import region
from .._native import lib
from ._kinds import _HEAPTYPE, _MANAGED_DICT, _TZINFO_AT, _WEAK_LINKS


class _Path:
    """Where an object was reached from the shared one, such as
    ``obj['a'][3].base``: built as the walk goes, written out only for a
    message (a repr of every key would cost, and some keys have none)."""
    __slots__ = ("parent", "step", "key")

    def __init__(self, parent=None, step="obj", key=None):
        self.parent, self.step, self.key = parent, step, key

    def __add__(self, step):
        return _Path(self, step)

    def __str__(self):
        parts, p = [], self
        while p is not None:
            parts.append(p.step if p.key is None else p.step.format(_short_repr(p.key)))
            p = p.parent
        return "".join(reversed(parts))


def _short_repr(k):
    try:
        r = repr(k)
    except Exception:  # a huge int, a repr that fails
        return f"<{type(k).__name__} at {id(k):#x}>"
    return r if len(r) <= 80 else r[:77] + "..."


def _children(o):
    """(step, child) pairs, named where the structure gives a name."""
    # (the built-in types' own iteration: a subclass's may run any code)
    if isinstance(o, dict):
        for k, v in dict.items(o):
            yield ("[{}]", k), v
            yield ("<key {}>", k), k
        yield from _class_parts(o)
        return
    if isinstance(o, (list, tuple)):
        for i, v in enumerate(list.__iter__(o) if isinstance(o, list) else tuple.__iter__(o)):
            yield ("[{}]", i), v
        yield from _class_parts(o)
        return
    if type(o) is range:
        # no gc referents: its four ints (the length too, which Python
        # does not show) are read from its body
        for i, name in enumerate(("start", "stop", "step", "length")):
            yield f".{name}", ctypes.cast(ctypes.c_void_p.from_address(id(o) + 16 + 8 * i).value,
                                          ctypes.py_object).value
        return
    if type(o) is slice:
        yield ".start", o.start
        yield ".stop", o.stop
        yield ".step", o.step
        return
    if type(o) in _TZINFO_AT:     # (no collector referents: the tzinfo is walked here)
        if o.tzinfo is not None:
            yield ".tzinfo", o.tzinfo
        return
    if type(o) is datetime.timezone:    # (nor here: its offset and its name, if it was given one)
        if not region.contains(id(o), 1):
            return      # inherited, as timezone.utc (clamor imports datetime): what it holds, too
        for name, at in ((".offset", 16), (".name", 24)):
            a = ctypes.c_void_p.from_address(id(o) + at).value
            if a:
                yield name, _object_at(a)
        return
    if isinstance(o, weakref.ReferenceType):
        # its referent is no reference the collector reports: walked as a
        # child, and its pointer is one the scan of the C fields accepts
        # (``_weak_links``)
        r = weakref.ReferenceType.__call__(o)
        if r is not None:
            yield "()", r
    # Not getattr(o, "__dict__"): CPython 3.11+ makes an instance's dict on
    # first request, outside the region, and would store its pointer in the
    # region object.  gc referents visit the attribute values in place;
    # those it visits in an instance's values table are named as its dict's
    # would be (a library's cache is known by its name).
    named = _instance_items(o)
    for k, v in named:
        yield (" -> <dict>[{}]", k), v
    given = {id(v) for _, v in named}
    for r in gc.get_referents(o):
        if id(r) not in given:
            yield f" -> <{type(r).__name__}>", r


def _instance_items(o):
    """[(name, value)] of an instance whose attribute values the collector
    visits in its values table, not through a dict (csrc/pyshare.c); []
    for any other object."""
    flags = type(o).__flags__
    if not (flags & _HEAPTYPE and flags & _MANAGED_DICT):
        return []
    out = []
    return out if lib.clamor_py_instance_items(id(o), id(out)) >= 0 else []


def _weak_links(r):
    """The addresses a weak reference's C fields hold that the scan of
    them accepts unread: its referent (walked by ``_children``) and its
    neighbours in the referent's list of weak references (wr_prev, wr_next
    of CPython 3.11-3.13).  No worker follows those links: it never frees
    a region object, and a list that leads out of the region is shown to
    it empty (``hidden``).  Scanned as C memory, their collector links and
    type pointers read as private pointers: a ShareWarning on every pandas
    frame, whose flags hold the frame weakly."""
    return {id(weakref.ReferenceType.__call__(r)), *(ctypes.c_void_p.from_address(id(r) + _WEAK_LINKS + 8 * i).value
                                                     or 0 for i in range(2))}


def _object_at(a):
    """The live Python object at address ``a``."""
    return ctypes.cast(a, ctypes.py_object).value


def _class_parts(o):
    """What an instance of a class derived from dict, list or tuple holds
    besides its items: its __dict__ (a Counter's, made by _own_keys) and
    slots, as the collector sees them (the items again: walked once).  A
    worker not forked looks an attribute up there first (``c.keys()``):
    left unwalked, its relocations were never listed, and the worker died."""
    if type(o).__flags__ & _HEAPTYPE:
        for r in gc.get_referents(o):
            yield f" -> <{type(r).__name__}>", r


def _dtype_parts(dt):
    """A dtype's Python parts: its scalar type, field names and table, sub-array
    base and shape, metadata."""
    yield ".type", dt.type
    if dt.names is not None:
        yield ".names", dt.names
    if dt.fields is not None:
        for table in gc.get_referents(dt.fields):   # the mappingproxy's dict
            yield ".fields", table
    if dt.subdtype is not None:
        yield ".subdtype[0]", dt.subdtype[0]
        yield ".subdtype[1]", dt.subdtype[1]
    if dt.metadata is not None:
        for table in gc.get_referents(dt.metadata):
            yield ".metadata", table

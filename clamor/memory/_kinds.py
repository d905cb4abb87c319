"""What share()'s walk knows of types: those every process of the image
has, those whose words are data, those whose C parts it knows (and scans
the others'), and where CPython keeps the pointers it reads.
"""
import array
import datetime
import sys
import types
import weakref

import numpy as np

from . import _pyshare


_STATIC = (type, types.ModuleType, types.BuiltinFunctionType, types.FunctionType, types.CodeType,
           types.MethodDescriptorType, types.WrapperDescriptorType, types.GetSetDescriptorType,
           types.MemberDescriptorType)


_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE


_WEAK_LINKS = 40        # a weak reference's wr_prev, then wr_next: past its head, wr_object, wr_callback, hash
_MANAGED_DICT = 1 << 4  # Py_TPFLAGS_MANAGED_DICT (CPython 3.11+)
_HAVE_GC = 1 << 14      # Py_TPFLAGS_HAVE_GC
# Py_TPFLAGS_INLINE_VALUES (CPython 3.13+: an instance's values table follows its body)
_INLINE_VALUES = 1 << 2 if sys.version_info >= (3, 13) else 0
# types whose words past the type pointer are data (never read as pointers)
_DATA_ONLY = (int, float, complex, str, bytes, bool, np.number, np.bool_, np.datetime64, np.timedelta64)
# the datetime module's values whose words past the type pointer are data
# (a cached hash, the fields, padding bytes that hold whatever the memory
# held before: read as pointers, they refused a dict keyed by dates); a
# datetime or time with a tzinfo points at it, and is scanned
_PLAIN_TIME = (datetime.date, datetime.timedelta)
_NAIVE_TIME = (datetime.datetime, datetime.time)
# where an aware one's tzinfo pointer lies (CPython 3.11-3.13); its other
# words past the type pointer are data, padding too (an old address there
# refused a dict keyed by aware datetimes)
_TZINFO_AT = {datetime.datetime: 40, datetime.time: 32}


def data_only(o):
    """Are all of ``o``'s words past its type pointer data?"""
    t = type(o)
    return (isinstance(o, _DATA_ONLY) and not own_state(t)) or t in _PLAIN_TIME or \
        (t in _NAIVE_TIME and o.tzinfo is None)


_own_state = weakref.WeakKeyDictionary()   # a class -> own_state(class)


def own_state(t):
    """Does class ``t``, made over a builtin type (a float or str
    subclass), add a dict or slots to it: words that point at objects,
    which can change in place?"""
    if not t.__flags__ & _HEAPTYPE:
        return False
    got = _own_state.get(t)
    if got is None:
        base = next(b for b in t.__mro__ if not b.__flags__ & _HEAPTYPE)
        got = _own_state[t] = bool(t.__dictoffset__ or t.__flags__ & _MANAGED_DICT or
                                   t.__basicsize__ > base.__basicsize__)
    return got


def frozen(o):
    """Can ``o`` not change in place (an inherited one stays as the
    workers have it while a region object holds it)?"""
    return isinstance(o, _FROZEN) and not own_state(type(o))


# what cannot change in place: an inherited one stays as the workers have it
# while a region object holds it
_FROZEN = _DATA_ONLY + (tuple, frozenset, type(None), type(Ellipsis), type(NotImplemented)) + _STATIC


# Types whose objects hold no pointer but Python references (walked as gc
# referents) and the fields ``_pyshare.fields`` reports.
_KNOWN = (int, float, complex, bytes, str, tuple, list, dict, set, frozenset, bytearray, array.array,
          np.ndarray, np.dtype, range, slice, types.SimpleNamespace, types.MappingProxyType,
          type(None), type(Ellipsis), type(NotImplemented)) + _STATIC
_INLINE_SCALARS = (np.number, np.bool_, np.datetime64, np.timedelta64, np.bytes_, np.str_)


def _solid(t):
    """The first type of ``t``'s MRO written in C (not a class statement;
    not always a static type: see ``_pyshare.is_class``)."""
    for b in t.__mro__:
        if not _pyshare.is_class(b):
            return b
    return object


_KNOWN_EXACT = frozenset(_KNOWN) | {bool}


def _opaque(o):
    """Is ``o``'s C part one the walk does not know?  A C subclass of a type
    it knows (an OrderedDict's linked nodes, a defaultdict's factory) has
    fields of its own: scanned."""
    s = _solid(type(o))
    return s is not object and s not in _KNOWN_EXACT and not issubclass(s, _INLINE_SCALARS) and not data_only(o) \
        and type(o) not in _TZINFO_AT and type(o) is not datetime.timezone

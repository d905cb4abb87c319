"""The region bytes a region object's readers follow pointers from
(``pointer_extents``), and what a forked walk's verdict rests on
(``Reads``).
"""
import ctypes
import sys

import numpy as np

from . import _inherit, _pyshare, region
from .._native import ffi, lib
from ._kinds import _DATA_ONLY, _HAVE_GC, _HEAPTYPE, _INLINE_VALUES, _MANAGED_DICT, _TZINFO_AT, data_only, frozen
from .readtable import read_digests


def _block(addr):
    """(start, length) of the region block holding ``addr``, or (addr, 8)."""
    start, size = ffi.new("uintptr_t *"), ffi.new("size_t *")
    if lib.clamor_block_of(ffi.cast("void *", addr), start, size) != 0:
        return addr, 8
    return int(start[0]), int(size[0])


def pointer_extents(o, path=None, body=True):
    """The byte ranges a reader of the region object ``o`` follows
    pointers from, as (start, length, strict, path, what): its body past
    the reference count (``body``), a class instance's dict pointers, and
    the tables its raw fields lead to (an item array, a dict's keys and
    values, a set's table, an object array's data, a dtype's sub-array and
    C metadata).  ``strict``: every word there is a pointer or null; the
    others may also hold hashes and spare slots."""
    t, a = type(o), id(o)
    flags = t.__flags__
    out = []
    if body and t in _TZINFO_AT:    # (an aware one: its type and its tzinfo)
        return [(a + 8, 8, True, path, "type"), (a + _TZINFO_AT[t], 8, True, path, "tzinfo")]
    if body:
        # (a class over a builtin data type: its value's words are data, its slots pointers)
        out.append((a + 8, max(0, lib.clamor_py_body_size(a) - 8), not isinstance(o, _DATA_ONLY), path, "body"))
        if flags & _HEAPTYPE and flags & _MANAGED_DICT:
            pre = 16 + (16 if flags & _HAVE_GC else 0)
            out.append((a - pre, 16, True, path, "dict pointers"))
            if flags & _INLINE_VALUES:     # (3.13: the values after the body, a header and a slot a name)
                v = a + t.__basicsize__
                out.append((v, 8 * (1 + ctypes.c_uint8.from_address(v).value), False, path, "inline values"))
            elif (v := _values_table(a)):      # (before 3.13, no dict made: the values table, its prefix bytes)
                lo, n = _block(v)
                out.append((lo, n, False, path, "values table"))
    for code, addr in _pyshare.fields(o):
        if code in (lib.CLAMOR_FIELD_ITEMS, lib.CLAMOR_FIELD_KEYS, lib.CLAMOR_FIELD_VALUES,
                    lib.CLAMOR_FIELD_TABLE, lib.CLAMOR_FIELD_SUBARRAY, lib.CLAMOR_FIELD_CMETA) \
                or (code == lib.CLAMOR_FIELD_DATA and isinstance(o, np.ndarray) and o.dtype.hasobject
                    and o.base is None):
            if not region.contains(addr, 1):
                continue     # (checked by share(): a static empty table)
            lo, n = _block(addr)
            if code == lib.CLAMOR_FIELD_ITEMS:
                lo, n = addr, 8 * len(o)     # (the spare capacity past the items holds old words)
            # a keys table and a set's table hold hashes, values tables spare slots: data
            strict = code in (lib.CLAMOR_FIELD_ITEMS, lib.CLAMOR_FIELD_DATA, lib.CLAMOR_FIELD_SUBARRAY)
            out.append((lo, n, strict, path, _pyshare.FIELD_NAMES[code]))
    return out


def _values_table(a):
    """The region values table of the managed-dict instance at ``a`` while
    it has no dict, before CPython 3.13 (3.11: the word at -32, the dict's
    at -24 null; 3.12: the word at -24 plus one, when that is odd), or 0."""
    if sys.version_info >= (3, 13):
        return 0
    w = ctypes.c_size_t.from_address(a - 24).value
    if sys.version_info >= (3, 12):
        v = w + 1 if w & 1 else 0     # (stored one byte below the table: odd)
    else:
        v = 0 if w else ctypes.c_size_t.from_address(a - 32).value
    return v if v and region.contains(v, 1) else 0


class Reads:
    """What a forked walk's verdict rests on, for the Cluster to know when
    to walk again: the region bytes it read pointers from (``extents``, as
    ``pointer_extents`` gives them, and the C memory it scanned), and the
    mutable objects outside the region it accepted because the workers
    inherited them (``inherited``: they could change in place)."""

    def __init__(self):
        self.extents = []
        self.plain = None       # the C walk's extents (csrc/pywalk.c), an (n, 2) array
        self.tags = None        # a walk of a dict's or list's entries: the entry of each of those (int32)
        self.root = None        # and where the root's entries lie: (first, stride, count)
        self.inherited = []
        self.read = None
        self.objects = 0        # the objects the walk visited
        self.stale = None       # pages changed since that the verdict read (``recheck`` walks again)

    def restart(self):
        self.extents, self.plain, self.inherited, self.objects = [], None, [], 0
        self.tags = self.root = None

    @property
    def incremental(self):
        """Can a change be checked by walking again only the entries it touched?"""
        return self.read is not None and self.read.tagged and self.root is not None

    def nbytes(self):
        """The bytes this verdict keeps: its read table and the inherited
        objects it names."""
        return (self.read.nbytes() if self.read is not None else 0) + 8 * len(self.inherited)

    def seal(self):
        """Digest what was read (``read``), and let the extents go."""
        self.read = read_digests(self.extents, self.plain, self.tags)
        self.extents, self.plain, self.tags = [], None, None
        return self

    def note(self, pages):
        """The driver changed ``pages`` (ascending unique uint64): does the
        verdict still stand as it is (True), or must it be walked again
        whole (False)?  One that ``recheck`` can bring up to date keeps
        the pages it read that changed in ``stale``."""
        if not self.incremental:
            return not self.changed(pages)
        hit = self.read.changed_pages(pages)
        if len(hit):
            self.stale = hit if self.stale is None else np.union1d(self.stale, hit)
        return True

    def changed(self, pages):
        """Did the driver change, in ``pages`` (a set), a byte the walk read
        a pointer from?"""
        return self.read.changed(pages)

    def inside(self, path, o):
        self.extents += pointer_extents(o, path, body=not data_only(o))

    def outside(self, o):
        if not frozen(o):
            self.inherited.append(o)

    def still_inherited(self):
        """Do the inherited objects still read as the workers have them?"""
        return all(_inherit._inherited is not None and _inherit._inherited.same(o) == 1 for o in self.inherited)

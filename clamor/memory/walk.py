"""The walk behind ``clamor.share()``: what is reachable from an object,
and whether workers can follow it.

A forked worker sees two kinds of memory at the driver's addresses: the
region (pages fetched on demand) and what it inherited at fork.  Anything
else reachable from ``obj``, such as an object a library took from a free
list or a cache while ``obj`` was built, is garbage on the worker.
The walk visits what is reachable from ``obj`` and raises ``NotShareable``
naming the path to the first thing that is neither in the region nor
inherited.  It follows three kinds of pointer:

- Python references: gc referents, with attribute, key and index names for
  the message; numpy arrays through their base, dtype and, for object
  arrays, their items;
- the pointer fields that hold no Python reference, of the types it knows
  (``_pyshare``): an array's data and its shape-and-strides buffer, a
  dtype's subarray and C metadata, a list's item array, a dict's keys and
  values tables, a set's table, a bytearray's and an ``array.array``'s
  buffer, a str's cached UTF-8 (and, before 3.12, wide-char) copy;
- every aligned word of objects of extension types it does not know (a
  cKDTree, a deque, a Decimal), and of the region blocks those lead to, the
  way a conservative collector scans: a word pointing into the process's
  private writable memory outside the region, unless it is an object the
  workers inherited, is something ``share`` cannot vouch for, and it says
  so.

A region instance of a class gets a dict with keys of its own, in the
region (see ``_own_keys``).

"Inherited" is what existed when the last Cluster of this process forked
its workers, and still reads as it did then (snapshot in ``note_fork``,
with a fingerprint of each object: a float made after the fork at the
address of one freed since is not the float the workers have); before any
fork, only objects that
every process of the same image has (types, modules, functions and code
objects, builtins, small ints, interned singletons, and whatever lies in a
loaded image's own memory) count.
"""
import array
import ctypes
import datetime
import gc
import sys
import types
import warnings
import weakref

import numpy as np

from . import _pyshare, cwalk, hidden, promote, region
from .cwalk import LIMIT, brought, conversions, in_c, plain_in_c  # noqa: F401  (share()'s, the tests')
from ._pyshare import fields  # noqa: F401  (the raw pointer fields of an object: clamor.dask's)
from .. import errors
from .._native import ffi, lib
from .hooks import HANDLER
from .readtable import read_digests

_inherited = None  # _Snapshot of the objects alive at the last fork
# Instance dicts _own_keys rewrote: the dicts and key tables that died then
# may sit on CPython's free lists, which the runtime empties before it
# pickles what travels (hooks.release_dropped).


from ..errors import NotShareable, ShareWarning  # noqa: E402,F401  (share()'s own)


class _Snapshot:
    """The addresses of the objects alive at a fork (sorted), each with a
    fingerprint of what a reader sees of it then (csrc/pyfinger.c): an
    address alone cannot tell the object the workers inherited from one
    made later at the same address, after the first was freed."""

    def __init__(self, ids, fps):
        self.ids, self.fps, self.n = ids, fps, len(ids)
        self._ids = ffi.cast("uint64_t *", ids.ctypes.data)
        self._fps = ffi.cast("uint64_t *", fps.ctypes.data)

    def __len__(self):
        return self.n

    def has(self, addr):
        """Was an object at ``addr`` at the fork?"""
        return bool(lib.clamor_py_snapshot_has(addr, self._ids, self.n))

    def same(self, o):
        """1: ``o`` reads as the object the workers inherited at its
        address; 0: nothing was there; -1: another object, or this one
        changed since."""
        return lib.clamor_py_inherited(id(o), self._ids, self._fps, self.n)


def note_fork():
    """Remember what the workers about to be forked will inherit."""
    global _inherited
    _inherited = None
    objs = gc.get_objects()
    raw = np.empty(8 * len(objs) + 4096, dtype=np.uint64)
    n = lib.clamor_py_snapshot(id(objs), ffi.cast("uint64_t *", raw.ctypes.data), len(raw))
    if n < 0:
        raw = np.empty(-n, dtype=np.uint64)
        n = lib.clamor_py_snapshot(id(objs), ffi.cast("uint64_t *", raw.ctypes.data), len(raw))
    ids = np.unique(raw[:n])     # (no object is made in between that could be missed: objs holds them all)
    del raw
    fps = np.empty_like(ids)
    # every object is alive while ``objs`` holds it or the objects that
    # refer to it; the call runs no Python code
    lib.clamor_py_fingerprints(ffi.cast("uint64_t *", ids.ctypes.data), ffi.cast("uint64_t *", fps.ctypes.data),
                               len(ids))
    del objs
    _inherited = _Snapshot(ids, fps)


_STATIC = (type, types.ModuleType, types.BuiltinFunctionType, types.FunctionType, types.CodeType,
           types.MethodDescriptorType, types.WrapperDescriptorType, types.GetSetDescriptorType,
           types.MemberDescriptorType)


_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE


def _ok_outside(o):
    if isinstance(o, (type, types.FunctionType, types.CodeType)):
        # a static (C) type is in every process of the image; a class,
        # function or code object made after the fork is not
        static = isinstance(o, type) and not (o.__flags__ & _HEAPTYPE)
        return static or _inherited is None or _inherited.has(id(o))
    if isinstance(o, _STATIC) or o is None or o is True or o is False or o is Ellipsis or o is NotImplemented:
        return True
    if type(o) is int and -5 <= o <= 256:
        return True
    if type(o) is str and (not o or (len(o) == 1 and ord(o) < 256)):
        return True  # the empty string and the Latin-1 characters are singletons
    return _inherited is not None and _inherited.same(o) == 1


def _vouched_by_words(o):
    """Was ``o`` accepted outside the region by its fingerprint at the fork
    (not as a type, function, module or singleton every process has)?"""
    return not isinstance(o, _STATIC) and not data_only(o) and _inherited is not None and \
        _inherited.same(o) == 1


def _replaced(o):
    """Is ``o`` at the address of an object the workers inherited, but not
    that object as they have it?"""
    return _inherited is not None and _inherited.same(o) == -1


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
    # region object.  gc referents visit the attribute values in place.
    for r in gc.get_referents(o):
        yield f" -> <{type(r).__name__}>", r


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


_WEAK_LINKS = 40        # a weak reference's wr_prev, then wr_next: past its head, wr_object, wr_callback, hash
_MANAGED_DICT = 1 << 4  # Py_TPFLAGS_MANAGED_DICT (CPython 3.11+)
_HAVE_GC = 1 << 14      # Py_TPFLAGS_HAVE_GC
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
    return isinstance(o, _DATA_ONLY) or t in _PLAIN_TIME or (t in _NAIVE_TIME and o.tzinfo is None)


# what cannot change in place: an inherited one stays as the workers have it
# while a region object holds it
_FROZEN = _DATA_ONLY + (tuple, frozenset, type(None), type(Ellipsis), type(NotImplemented)) + _STATIC


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
        out.append((a + 8, max(0, lib.clamor_py_body_size(a) - 8), True, path, "body"))
        if flags & _HEAPTYPE and flags & _MANAGED_DICT:
            pre = 16 + (16 if flags & _HAVE_GC else 0)
            out.append((a - pre, 16, True, path, "dict pointers"))
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
        return self.read is not None and self.read.tags is not None and self.root is not None

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
        if not isinstance(o, _FROZEN):
            self.inherited.append(o)

    def still_inherited(self):
        """Do the inherited objects still read as the workers have them?"""
        return all(_inherited is not None and _inherited.same(o) == 1 for o in self.inherited)


_NONSTR_KEY = -12345   # any non-str key converts a split dict to a combined one


def _has_dict(o):
    if isinstance(o, type):
        return False    # (a class made in a block: its dict is the type's own, not an instance's)
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
    region, where workers read them.  A dict that has its own keys
    already is left as it is: a walk may run after a stage began, and a
    write then would change pages for nothing (and, for workers not forked,
    be a page version no relocation list describes)."""
    from .._native import lib
    from . import hooks

    if not hooks._installed:
        hooks.install()   # (the block below needs Python's allocators wrapped; once: it rescans every library)

    def convert(fresh):
        lib.clamor_heap_enter()
        try:
            d = o.__dict__
            if fresh:
                d = dict(d)
                if not region.contains(id(d), sys.getsizeof(d)):
                    spare.append(d)     # off the free list: kept, so the next one is not
                    return False
                o.__dict__ = d
            else:
                depth = lib.clamor_heap_suspend()   # (the check's own objects are no region objects)
                try:
                    owns = _owns_keys(d)
                finally:
                    lib.clamor_heap_resume(depth)
                if owns:
                    return True     # done before: nothing is written
            conversions[0] += 1
            d[_NONSTR_KEY] = None
            del d[_NONSTR_KEY]
        finally:
            lib.clamor_heap_exit()
        return region.contains(id(d), sys.getsizeof(d))

    # The dict object may come from CPython's free list, outside the region
    # (its keys, general ones, never do): then make new ones until one is
    # the allocator's, holding those the free list gave (it keeps 80 at
    # most), which go back to it afterwards.  (A collection to empty the
    # lists cost a walk of the whole heap for each such instance.)
    spare = []
    if not convert(False):
        conversions[0] += 1
        for _ in range(_FREE_LIST_MAX + 1):
            if convert(True):
                break
        else:
            raise NotShareable(f"{path}.__dict__ could not be placed in the region")
        spare.clear()


_FREE_LIST_MAX = 80     # CPython's dict free list (PyDict_MAXFREELIST)


def _owns_keys(d):
    """A dict in the region, combined (no values table of a class's
    instances), whose keys table is in the region too."""
    if not region.contains(id(d), sys.getsizeof(d)):
        return False
    f = dict(_pyshare.fields(d))
    keys = f.get(lib.CLAMOR_FIELD_KEYS)
    return lib.CLAMOR_FIELD_VALUES not in f and keys is not None and region.contains(keys, 1)


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


class _Walk:
    """One share() call: the address map and the objects it has vouched
    for or may accept outside the region, built when first needed.
    ``mode``: None for forked workers, or a portable walk
    (``portable._Mode``), which decides what outside the region workers
    not forked from the driver can have, and records the words to
    relocate."""

    def __init__(self, mode=None):
        self.mode = mode
        self._amap = self._scanner = None
        self._alive = None
        self._vtables = None
        self.tables = []     # region objects whose tables are to be made again in the region
        self.unsure = []
        self.doubt_path = None
        self.referents = set()
        self.buffers = []

    @property
    def amap(self):
        if self._amap is None:   # reading /proc/self/maps costs milliseconds
            self._amap = _pyshare.AddressMap()
        return self._amap

    @property
    def scanner(self):
        if self._scanner is None:
            self._scanner = _pyshare.Scanner(self.amap, self.ok_address)
        return self._scanner

    def ok_address(self, addr):
        """A private address that is an object the workers have, or a
        Python reference the walk follows (and names better)."""
        if addr in self.referents or addr == HANDLER:
            return True
        if self.mode is None and _inherited is not None and _inherited.has(addr):
            return True
        if any(lo <= addr < hi for lo, hi in self.buffers):
            return True
        if self._vtables is None:
            self._vtables = _pyshare.vtables()
        cls = self._vtables.get(addr)
        if cls is not None:   # a Cython class's C methods: its module made them at import
            return self.mode.vtable(cls, addr) if self.mode is not None else _ok_outside(cls)
        if self._alive is None:
            self._alive = {id(o): o for o in gc.get_objects() if isinstance(o, _STATIC)}
        o = self._alive.get(addr)
        if self.mode is not None:
            return o is not None and self.mode.outside_ok(o)
        return o is not None and _ok_outside(o)

    def fields(self, path, o, bring_in=False):
        """Refuse a raw pointer field of ``o`` (in the region) that leaves it.
        ``bring_in``: a dict's, list's or set's table that grew outside the
        region after its block is listed in ``tables``, to be made again
        in the region, instead."""
        for code, addr in _pyshare.fields(o):
            if code == lib.CLAMOR_FIELD_DATA and isinstance(o, np.ndarray):
                continue  # through .base, or checked with the array's size below
            size = 8 * o.ndim if code in (lib.CLAMOR_FIELD_DIMS, lib.CLAMOR_FIELD_STRIDES) else 1
            if region.contains(addr, size) or (code == lib.CLAMOR_FIELD_KEYS and self.amap.in_image(addr)):
                continue  # (the interpreter's shared empty keys table is static)
            name = _pyshare.FIELD_NAMES[code]
            split = code == lib.CLAMOR_FIELD_KEYS and any(c == lib.CLAMOR_FIELD_VALUES for c, _ in _pyshare.fields(o))
            if bring_in and not split and code in (lib.CLAMOR_FIELD_KEYS, lib.CLAMOR_FIELD_ITEMS,
                                                   lib.CLAMOR_FIELD_TABLE) and type(o) in (dict, list, set):
                self.tables.append(o)
                continue
            hint = {lib.CLAMOR_FIELD_KEYS: ": a dict sharing the keys of a class's instances (vars() of an "
                                           "instance); copy it with dict() inside clamor.heap()" if split else
                                           ": the dict grew outside clamor.heap(); rebuild it inside the block",
                    lib.CLAMOR_FIELD_UTF8: ": CPython made it on a request outside the block; build the "
                                           "string inside clamor.heap() and ship it before asking for its "
                                           "UTF-8 form outside"}.get(code, ": rebuild it inside clamor.heap()")
            raise NotShareable(f"{path}: the {name} of this {type(o).__name__} (at {id(o):#x}) lies at "
                               f"{addr:#x}, outside the region, in memory workers read stale{hint}")
        if isinstance(o, array.array) and len(o):
            addr = o.buffer_info()[0]
            if not region.contains(addr, len(o) * o.itemsize):
                raise NotShareable(f"{path}: the buffer of this array.array lies at {addr:#x}, outside the region")

    def opaque(self, path, o):
        """Scan an object of an extension type share() does not know."""
        name = type(o).__name__
        body = lib.clamor_py_body_size(id(o))
        refs = gc.get_referents(o)
        self.referents = {id(r) for r in refs}
        if isinstance(o, weakref.ReferenceType):
            self.referents |= _weak_links(o)
        # the C fields of an object may point into the buffers of the arrays
        # it holds (a cKDTree into its points): those arrays are walked
        self.buffers = [(a, a + r.nbytes) for r in refs if isinstance(r, np.ndarray) and r.nbytes
                        for a in (r.__array_interface__["data"][0],)]
        try:
            # past the reference count and the type pointer (the type is walked)
            done = self.scanner.scan(id(o) + 16, max(0, body - 16), f"this {name}")
        except _pyshare.CannotTell as err:
            off, addr, where = err.args
            where = f"byte {off + 16} of this {name}" if where == f"this {name}" else f"byte {off} of {where}"
            raise NotShareable(f"{path} ({name} at {id(o):#x}): {where}, reached through its C fields, holds "
                               f"{addr:#x}, an address in this process's private memory outside the region; "
                               f"share() cannot tell what lies there (memory a library allocated outside "
                               f"clamor.heap(), or a cache it reused): build it inside clamor.heap()") from None
        if self.mode is not None:
            self.mode.opaque(path, o, self.scanner.blocks)
        if not done:
            self.unsure.append(path)
        if self.scanner.doubts and self.doubt_path is None:
            self.doubt_path = f"{path} ({name})"


def _walk(obj, limit, mode, reads=None, bring_in=True):
    """share()'s walk; ``mode`` as for ``_Walk``; ``reads`` (a ``Reads``,
    forked walks only) records what the verdict rests on.  ``bring_in``:
    objects outside the region that only a region object holds are copied
    into it (``promote``), a pandas Index's hash table is made in it
    (``promote.Warm``), and the walk made again; otherwise refused, and
    nothing is written."""
    if not region.size():
        raise errors.NoRegion("no region in this process")
    if mode is None and _walk_plain(obj, limit, reads):
        return
    if mode is not None and mode.c_walk(obj, limit):
        return
    last = None
    for _ in range(16):
        moves = _walk_once(obj, limit, mode, reads, bring_in)
        if not moves:
            return
        ids = [id(o) for _, o in moves]
        if ids == last:      # the same objects again: bringing them in did not take
            break
        last = ids
        _bring_in(moves)
        if mode is not None:
            mode.restart()
        if reads is not None:
            reads.restart()
    _walk_once(obj, limit, mode, reads, False)


def _walk_plain(obj, limit, reads=None, convert=True):
    """share()'s walk in C (cwalk.walk_plain), the objects it met outside
    the region judged by the Python walk's rules (``_c_outside_ok``).
    ``convert``: where it meets strs outside the region that the workers
    would not have (the attribute names of a class made before any Cluster,
    a key in every instance's dict), the dicts holding them as keys get
    region copies (cwalk.rekey, the Python walk's ``promote.Rekey`` in C),
    and it walks again."""
    met = []

    def judge(objs, limit, reads):
        met[:] = objs
        return _c_outside_ok(objs, limit, reads)

    if cwalk.walk_plain(obj, limit, reads, convert, judge):
        return True
    if not convert:
        return False
    amap = _Walk().amap
    strays = [o for o in met if type(o) is str and len(o) > 1 and not (_ok_outside(o) or amap.in_image(id(o)))]
    if not strays or not cwalk.rekey(obj, limit, strays):
        return False
    return cwalk.walk_plain(obj, limit, reads, convert, _c_outside_ok)


def recheck(obj, reads, limit=LIMIT):
    """cwalk.recheck, the objects met outside the region judged by the
    Python walk's rules."""
    return cwalk.recheck(obj, reads, limit, _outside_inherited)


def _outside_inherited(objs, limit):
    """The inherited objects among ``objs`` (outside the region) that the
    Python walk accepts as they are, or None if it would not accept them
    all so (a refusal, a write, region bytes it would read)."""
    extra = Reads()
    if not _c_outside_ok(objs, limit, extra) or extra.extents:
        return None
    return extra.inherited


_C_ATOMS = (int, float, complex, str, bytes)


def _c_outside_ok(objs, limit, reads):
    """Does the Python walk accept each of ``objs``, outside the region, as
    it is: the atoms, classes and containers the C walk met there?  An
    atom or a class by ``_ok_outside``; a container (one the workers
    inherited, such as a constant tuple of code compiled before the fork)
    by a walk of its own that brings nothing in, its extents and inherited
    objects going to ``reads``.  (A class whose instances the walk warms, a
    pandas Index's, is left to the Python walk; so is a container it would
    refuse, or copy into the region, where its holder is known.)"""
    walk = _Walk()
    for o in objs:
        if isinstance(o, type) and promote.warms(o):
            return False
        if type(o) in _C_ATOMS or isinstance(o, type):
            if not (_ok_outside(o) or walk.amap.in_image(id(o))):
                return False
            continue
        try:
            if _walk_once(o, limit, None, reads, False):
                return False
        except NotShareable:
            return False
    return True


def _bring_in(moves):
    """Copy each object of ``moves`` [(store, object)] into the region and
    store the copy where the object was."""
    from .heap import heap
    with heap():
        for store, o in moves:
            if store is None and lib.clamor_py_table_in(id(o)) < 0:
                raise errors.ClamorError(f"could not make the table of a {type(o).__name__} again in the region")
        copies = [(store, promote.copy_in(o)) for store, o in moves
                  if store is not None and not isinstance(store, (promote.Rekey, promote.Drop, promote.Warm))]
        promote.rekey([(store.d, o) for store, o in moves if isinstance(store, promote.Rekey)])
        for store, o in moves:
            if isinstance(store, promote.Warm):
                store()
    for store, o in moves:
        if isinstance(store, promote.Drop):
            store()
    n = len(moves)
    moves.clear()
    for store, c in copies:
        store(c)
    conversions[0] += n
    brought[0] += n


def _candidate(parent, o, cache):
    """A store for ``o`` if it can be brought into the region (the caller
    holds it in one local), else None.  A constant key of a dict (a str or
    int made after the block) is a ``promote.Rekey``.  What is reached
    through an entry of a library's cache (``cache``: the dict and the
    key) and cannot be brought in drops that entry (``promote.Drop``)."""
    if parent is None:
        return None
    if promote.copyable(o):
        if promote.rekeyable(parent, o):
            return promote.Rekey(parent)
        # (the references here: the walk's local, this parameter and sole()'s)
        if promote.sole(o, 3):
            store = promote.slot(parent, o)
            if store is not None:
                return store
    return promote.Drop(*cache) if cache is not None else None


def _walk_once(obj, limit, mode, reads, bring_in):
    walk = _Walk(mode)
    root = _Path()
    stack = [(root, obj, None, None)]
    seen = set()
    rekeyed = set()     # constants outside the region to copy in as keys: of every dict that has them
    moves = []
    n = 0
    while stack:
        path, o, parent, cache = stack.pop()
        if id(o) in seen:
            # (an attribute name that instances of a class share is one str:
            # each dict gets a copy, in this round)
            if id(o) in rekeyed and promote.rekeyable(parent, o):
                moves.append((promote.Rekey(parent), o))
            continue
        seen.add(id(o))
        n += 1
        if n > limit:
            raise NotShareable(f"more than {limit} objects reachable from the shared object")
        # (not sys.getsizeof: it runs the class's __sizeof__, and pandas'
        # computes and caches arrays there, outside the region)
        inside = region.contains(id(o), lib.clamor_py_body_size(id(o)) if not isinstance(o, type) else 1)
        if not inside and mode is not None and not (isinstance(o, np.ndarray) and path is root):
            why = mode.why_not(o)      # a relocation target, or not portable
            if why is not None:
                store = _candidate(parent, o, cache) if bring_in else None
                if store is None:
                    raise mode.refusal(path, o, why)
                moves.append((store, o))
                if isinstance(store, promote.Rekey):
                    rekeyed.add(id(o))
            continue
        if not inside:
            by_words = _vouched_by_words(o)    # (the fingerprint once: _ok_outside's last test)
            if by_words or _ok_outside(o) or walk.amap.in_image(id(o)):
                if reads is not None:
                    reads.outside(o)
                if by_words:
                    # its fingerprint covers its own words, and its referents
                    # only by address: a dict freed since the fork and made
                    # again at the same address, its keys table, key and
                    # value too, read as the inherited one (a worker read
                    # {'d234': 1234} for the driver's {'d433': 1433}).  Each
                    # referent is checked in turn (and not brought in: the
                    # inherited object is not written).
                    for step, child in _children(o):
                        stack.append((_Path(path, *step) if isinstance(step, tuple) else path + step, child, None,
                                      None))
                    step = child = None
                continue  # inherited, or part of a loaded image
            if isinstance(o, np.ndarray) and not o.dtype.hasobject and o.nbytes and \
                    region.contains(np.asarray(o).__array_interface__["data"][0], o.nbytes):
                if path is root:
                    continue  # shipped by itself, a region array travels as a reference
                store = _candidate(parent, o, cache) if bring_in else None
                if store is not None:
                    moves.append((store, o))
                    continue
                raise NotShareable(f"{path} (ndarray at {id(o):#x}) has its data in the region but is itself an "
                                   f"object outside it, which workers cannot follow a pointer to: make the array "
                                   f"inside clamor.heap(), or pass it to tasks directly (it travels by reference)")
            store = _candidate(parent, o, cache) if bring_in else None
            if store is not None:
                moves.append((store, o))
                if isinstance(store, promote.Rekey):
                    rekeyed.add(id(o))
                continue
            if _inherited is None:
                raise NotShareable(f"{path} ({type(o).__name__} at {id(o):#x}) is outside the region, and no "
                                   f"Cluster has forked workers yet: start the Cluster first (what exists when it "
                                   f"forks is inherited), or build it inside clamor.heap()")
            if _replaced(o):
                raise NotShareable(f"{path} ({type(o).__name__} at {id(o):#x}) is outside the region, at the "
                                   f"address of an object the workers inherited, but not that object as they have "
                                   f"it: it was made or changed after the fork (a freed object's address is "
                                   f"used again); build it inside clamor.heap()")
            raise NotShareable(f"{path} ({type(o).__name__} at {id(o):#x}) is outside the region and "
                               f"was not inherited by the workers: build it inside clamor.heap()")
        walk.fields(path, o, bring_in)
        if bring_in and promote.warmable(o):
            moves.append((promote.Warm(o), o))
        hidden.note(o)
        if mode is not None:
            mode.inside(path, o)       # the words of it to relocate
        if reads is not None:
            reads.inside(path, o)
        if isinstance(o, np.ndarray):
            # ndarrays are not gc containers: their base, dtype and items are
            # walked here
            if o.base is not None:
                stack.append((path + ".base", o.base, None, cache))
            elif o.nbytes:
                addr = o.__array_interface__["data"][0]
                if not region.contains(addr, o.nbytes):
                    raise NotShareable(f"{path}: the data of this {o.dtype} array of {o.nbytes} bytes lies at "
                                       f"{addr:#x}, outside the region")
            stack.append((path + ".dtype", o.dtype, None, cache))
            if o.dtype.hasobject:
                for i, item in enumerate(o.ravel(order="K")):
                    stack.append((_Path(path, ".flat[{}]", i), item, None, cache))
                item = None
            continue
        if isinstance(o, np.dtype):
            for name, child in _dtype_parts(o):
                stack.append((path + name, child, None, cache))
            child = None
            continue
        if _opaque(o):
            walk.opaque(path, o)
        if _has_dict(o):
            _own_keys(o, path)
        in_cache = type(o) is dict and path.key in promote.CACHE_NAMES
        for step, child in _children(o):
            entry = (o, step[1]) if in_cache and isinstance(step, tuple) and step[0] == "[{}]" else cache
            stack.append((_Path(path, *step) if isinstance(step, tuple) else path + step, child, o, entry))
        entry = None
        step = child = None     # (a reference left here would count as another holder)
    if reads is not None:
        reads.objects += n
    if mode is not None:
        mode.objects += n
    moves += [(None, t) for t in walk.tables]
    if moves:
        return moves
    if reads is not None and walk._scanner is not None:
        reads.extents += [(lo, n, False, None, "C memory") for lo, n in walk.scanner.blocks]
    if walk.unsure:
        warnings.warn(ShareWarning(f"share() scanned {walk.scanner.budget >> 20} MiB of the C memory behind "
                                   f"{walk.unsure[0]} and stopped: what lies past that is not checked"),
                      stacklevel=3)
    if walk._scanner is not None and walk.scanner.doubts:
        off, addr, where = walk.scanner.doubts[0]
        warnings.warn(ShareWarning(f"share() cannot tell whether byte {off} of {where}, reached through the C "
                                   f"memory of {walk.doubt_path}, is a pointer: it holds {addr:#x}, an address in "
                                   f"this process's private memory outside the region (it may be bytes left from "
                                   f"an earlier use of that memory)"), stacklevel=3)


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

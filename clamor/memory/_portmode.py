"""The portable side of one share() walk (``_Mode``): what lies outside
the region that workers not forked from the driver can have, and the
extents to read for the words to relocate (see ``clamor.memory.portable``).
"""
import ctypes
import threading
import types
import weakref

import numpy as np

from . import cwalk, region
from .. import errors
from .._native import ffi, lib
from ._kinds import _HAVE_GC, _HEAPTYPE, _WEAK_LINKS, data_only
from ._reads import pointer_extents
from ._relocentries import _TYPE_WORD, _match
from .._native import owned_array as _owned
from ._seeds import _seeded
from .readtable import read_digests

NotShareable = errors.NotShareable

_ARRAY_CACHE = lib.clamor_py_array_cache_offset()
_BESIDE = 1 << 16       # ranges from which a walk's read table is made in a thread of its own


class _Mode:
    """The portable side of one share() walk: classifies what lies outside
    the region and collects the extents to read for relocations."""

    def __init__(self, targets, seeds_agree=True, amap=None):
        self.t = targets
        self.extents = []       # (lo, length, strict, path, what)
        self.null_words = []    # addresses of words a worker reads as null
        self.null_tags = None   # int32 a null word, a tagged walk's in C
        self.seeded = None      # path of a dict or set whose keys hash by the seed
        self.root = None        # what the walk started from, for messages
        self.blocks_seen = set()
        self.objects = 0        # objects visited
        self.seeds_agree = seeds_agree
        self.amap = amap
        # the walk in C (c_walk): its extents as arrays, and the words found
        self.c_extents = None   # (n, 2) uint64 (start, length), each within one page
        self.c_strict = None    # uint8 a range: bit 0 strict, _TYPE_WORD an atom's type word
        self.tags = None        # int32 a range, a tagged walk's
        self.found = None       # (addresses, targets, tags or None), sorted by address
        self.words = None       # found as _relocentries.Words, or None
        self.shared = False
        self._table = None      # c_walk's read table, made beside its listing
        # the "classkeys" targets of the classes whose instances were taken
        # over their frozen tables (each worker lays its own out alike)
        self.keyed = set()

    def restart(self):
        """Forget what a walk collected: it is made again (objects were
        brought into the region)."""
        self.extents, self.null_words, self.seeded, self.blocks_seen = [], [], None, set()
        self.objects = 0
        self.c_extents = self.found = self.tags = self.words = self._table = None
        self.shared = False
        self.keyed = set()

    def c_walk(self, obj, limit, dirty=None):
        """The walk of plain data and plain instances in C
        (clamor_py_walk_portable), the relocations matched there too: True
        if it decided (approved, the words found), False if the Python walk
        must (an object it does not take, one outside the region that is no
        target, a pointer into private memory, a seed to report).  Nothing is
        brought into the region here.  A dict or list is walked tagged: each
        range read and word found carries the root's entry it was reached
        through (``tags``, ``found[2]``), for a walk of some entries again
        (``dirty``: those, ascending int32; ``shared``: an object reached
        through two, which makes that walk not enough)."""
        if not cwalk.in_c(obj):
            return False
        tagged = type(obj) in (dict, list)
        if dirty is not None and not tagged:
            return False
        images = self.t.image_pairs()
        visited, seeded, shared = ffi.new("long *"), ffi.new("int *"), ffi.new("int *")
        want = dirty if dirty is not None else np.zeros(0, np.int32)
        walked = {}

        def run():
            out = walked["out"] = ffi.new("struct clamor_walkout *")
            outside = walked["outside"] = []
            return lib.clamor_py_walk_portable(id(obj), limit, *images, visited, id(outside), seeded, tagged,
                                               ffi.cast("const int32_t *", want.ctypes.data), len(want),
                                               dirty is not None, shared, out)

        if cwalk.c_pass(run, obj, limit, convert=dirty is None, frozen=cwalk.NOT_FORKED) != 1:
            return False
        out = walked["out"]
        # (each array the walk grew, owned here: freed with its last view)
        ext = _owned(out.ext, 2 * out.n, np.uint64).reshape(-1, 2)
        strict = _owned(out.strict, out.n, np.uint8)
        nulls = _owned(out.nulls, out.nnulls, np.uint64)
        tags = _owned(out.tags, out.n, np.int32) if tagged else None
        null_tags = _owned(out.null_tags, out.nnulls, np.int32) if tagged else None
        keyed = _owned(out.keyed, out.nkeyed, np.uint64).tolist()
        numbered = set()
        for o in walked["outside"]:
            if id(o) not in numbered:
                if self.t.classify(o) is not None:
                    return False
                numbered.add(id(o))
        if seeded[0] and not self.seeds_agree:
            return False        # (the Python walk names the dict)
        table = {}
        if dirty is None and len(ext) >= _BESIDE:
            # (the read table made beside the listing: neither holds the GIL
            # for long, and a whole walk's caller wants both)
            beside = threading.Thread(target=lambda: table.update(t=self._read_table(ext, strict, tags)),
                                      name="clamor-read-table", daemon=True)
            beside.start()
            try:
                found, bad, words = _match(ext, strict, nulls, self.t, self.amap, tags, null_tags)
            finally:
                beside.join()
        else:
            found, bad, words = _match(ext, strict, nulls, self.t, self.amap, tags, null_tags)
        if len(bad):
            return False        # (the Python walk names the path)
        for a in keyed:
            if not self._keyed_class(ctypes.cast(a, ctypes.py_object).value):
                return False    # (its instances are walked in Python, and given keys of their own)
        if self.keyed:
            words.targets = np.union1d(words.targets, sorted(self.keyed)).astype(np.uint32)
        self.c_extents, self.c_strict, self.tags, self.found, self.shared = ext, strict, tags, found, bool(shared[0])
        self.words, self.null_words, self.null_tags = words, nulls, null_tags
        self._table = table.get("t")
        self.objects += int(visited[0])
        if seeded[0] and self.seeded is None:
            self.seeded = f"a dict or set reached from {self.root or 'the object'}"
        return True

    def keeps_keys(self, o):
        """The Python walk's ``keyed_ok`` (csrc/pywalk.c): may region
        instance ``o`` keep its attributes in its values table over its
        class's table, frozen for workers not forked?"""
        return bool(lib.clamor_py_portable_keys(id(o))) and self._keyed_class(type(o))

    def _keyed_class(self, cls):
        tid = self.t.class_keys(cls)
        if tid is not None:
            self.keyed.add(tid)
        return tid is not None

    def read_table(self):
        """The ReadTable of what this walk read pointers from, but for the
        type words of atoms and other data-only objects: they cannot change
        while the object lives, and what holds it is read (a dead one's
        holder changed)."""
        if self.c_extents is not None:
            return self._table if self._table is not None else self._read_table(self.c_extents, self.c_strict,
                                                                                 self.tags)
        return read_digests([e for e in self.extents if e[4] != "type"])

    def why_not(self, o):
        """None if ``o`` (outside the region) is a relocation target, else
        why it is not portable."""
        return self.t.classify(o)

    def refusal(self, path, o, why):
        return NotShareable(f"{path} ({type(o).__name__} at {id(o):#x}) is not portable to workers not forked "
                            f"from the driver: {why}")

    def outside(self, path, o):
        why = self.t.classify(o)
        if why is not None:
            raise self.refusal(path, o, why)

    @staticmethod
    def _read_table(ext, strict, tags):
        return read_digests([], plain=ext, tags=tags, skip=strict & _TYPE_WORD)

    def outside_ok(self, o):
        return self.t.classify(o) is None

    def vtable(self, cls, addr):
        """A word holding the C method table of the Cython class ``cls``: a
        worker finds its own in the class it imports."""
        if addr in self.t.by_addr or self.t.in_image(addr):
            return True
        if self.t.classify(cls) is not None:
            return False
        self.t._new(("vtable", cls.__module__, cls.__qualname__, addr), addr, cls)
        return True

    def inside(self, path, o):
        if isinstance(o, (type, types.FunctionType, types.CodeType, types.ModuleType)):
            raise NotShareable(f"{path} ({type(o).__name__} at {id(o):#x}) was made inside clamor.heap(): a class, "
                               f"function or module in the region is not portable; define it in a module")
        t = type(o)
        a = id(o)
        flags = t.__flags__
        # The type word: a type that is no gc referent (a numpy DType class,
        # made at run time) is still one to relocate.
        why = self.t.classify(t) if not region.contains(id(t), 1) else "it lies in the region"
        if why is not None:
            raise NotShareable(f"{path} ({t.__module__}.{t.__qualname__} at {a:#x}): its type is not portable to "
                               f"workers not forked from the driver: {why}")
        # Words a worker must see null: the collector's links (the object
        # is not in the worker's lists), the weak-reference list (the
        # driver's weak references), an array's cached buffer description.
        if flags & _HAVE_GC:
            self.null_words += (a - 16, a - 8)
        if t.__weakrefoffset__:     # (negative since 3.12 for a class: the list lies before the header)
            self.null_words.append(a + t.__weakrefoffset__)
        if isinstance(o, np.ndarray):
            self.null_words.append(a + _ARRAY_CACHE)
        if isinstance(o, weakref.ReferenceType):
            # its links in its referent's list (wr_prev, wr_next), which may
            # be the driver's weak references: a worker sees that list empty
            self.null_words += (a + _WEAK_LINKS, a + _WEAK_LINKS + 8)
        if data_only(o) and t is not np.void:
            if flags & _HEAPTYPE:
                raise NotShareable(f"{path} ({t.__module__}.{t.__qualname__} at {a:#x}): an instance of a class "
                                   f"derived from {_solid_name(t)} is not portable to workers not forked from the "
                                   f"driver (its data would be read as pointers): use the built-in type")
            self.extents.append((a + 8, 8, True, path, "type"))
        # (a set's body and a dtype's hold a few hashes: one that looks like
        # a private address refuses it, rather than pass a pointer)
        self.extents += pointer_extents(o, path, body=not data_only(o) or t is np.void)
        if self.seeded is None and isinstance(o, (dict, set, frozenset)):
            if any(_seeded(k) for k in (o.keys() if isinstance(o, dict) else o)):
                self.seeded = f"{path} (in {self.root})" if self.root else str(path)

    def opaque(self, path, o, blocks):
        for lo, n in blocks:
            if lo not in self.blocks_seen:
                self.blocks_seen.add(lo)
                self.extents.append((lo, n, False, path, "C memory"))


def _solid_name(t):
    for b in t.__mro__:
        if not b.__flags__ & _HEAPTYPE:
            return b.__name__
    return "object"

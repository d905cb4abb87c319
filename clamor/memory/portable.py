"""Portable region objects: Python objects built under ``clamor.heap()``,
used in place by workers that were not forked from the driver.

A region object points out of the region: at its type, at ``None`` and
small ints inside libpython, at a dtype inside numpy, at an interned string
in the driver's heap.  A forked worker has all of those at the driver's
addresses; a spawned one, or one on another host, has them elsewhere
(ASLR stays on).  So the driver lists, for each region page, the words that
point out of the region and what they point at (a *target*), and a worker
that was not forked rewrites those words against its own address space as
the page arrives, before any thread can read it (``csrc/reloc.c``).

Finding the words (driver, ``prepare``): the walk of ``share()`` visits
every object reachable from the objects a stage ships, and for each one
reads the words that can hold pointers: all of a container's or an
instance's body, its item array, its dict's keys and values tables, an
object array's items, the C memory of an extension object and the region
blocks that memory leads to (conservatively, as a collector does, skipping
atomic blocks: array data is never read as pointers); only the type word
of an int, float, str or bytes (their other words are data).  A word that
points at a target is a relocation; the garbage-collector links of a
region object are relocated to null (a worker sees the object untracked).

Targets, each numbered once for the driver's life:

- an image (the executable, libpython, an extension module, a shared
  library): the word is an offset into it (static types, ``None``, small
  ints, numpy's built-in dtypes, a Cython vtable);
- a symbol: a module, class or function the worker imports by name;
- a constant the worker makes equal and keeps: a str (interned), an int,
  float, complex, bytes, or a tuple or frozenset of those, a built-in
  dtype;
- clamor's numpy allocator (every region array names it).

Anything else outside the region (a mutable object, a class defined in
``__main__``, a pointer of C memory into the driver's heap) is not
portable: ``share(obj, portable=True)`` and the Cluster raise NotShareable
naming the path to it and why.

A dict or set with str or bytes keys stores their hashes, which CPython
seeds per process; a worker reads it correctly only with the driver's
seed (``PYTHONHASHSEED``, passed to the workers a Cluster spawns).
"""
import bisect
import ctypes
import datetime
import functools
import hashlib
import importlib
import os
import pickle
import sys
import time
import types
import weakref

import numpy as np

from .. import errors
from .._native import ffi, lib
from . import _pyshare, images, region
from .hooks import HANDLER
from .readtable import pages_array, read_digests
from .walk import _HAVE_GC, _HEAPTYPE, _WEAK_LINKS, _walk, data_only, pointer_extents

NotShareable = errors.NotShareable

_CONST_SCALARS = (int, float, complex, str, bytes)
_HASHED_BY_SEED = (str, bytes, datetime.date, datetime.time)   # (a date's hash is its bytes')
_ARRAY_CACHE = lib.clamor_py_array_cache_offset()


def hash_digest():
    """A digest of this interpreter's str/bytes hash secret (equal in two
    processes iff their str hashes agree)."""
    secret = (ctypes.c_char * 24).in_dll(ctypes.pythonapi, "_Py_HashSecret")
    return hashlib.blake2b(bytes(secret), digest_size=16).hexdigest()


def seed_passes_on():
    """Whether workers started from this process's environment get its
    hash secret: PYTHONHASHSEED is set to a number."""
    return os.environ.get("PYTHONHASHSEED", "random").isdigit()


_NAMES = {}     # path -> portable name (naming costs a look at sys.path and the file system)


def loaded_images():
    """[(portable name, path, base, lo, hi)] of this process's ELF objects."""
    cap = 1024
    while True:
        buf = ffi.new("struct clamor_image[]", cap)
        n = lib.clamor_py_images(buf, cap)
        if n <= cap:
            break
        cap = n + 64
    out = []
    for i in range(n):
        raw = ffi.string(buf[i].name).decode(errors="surrogateescape")
        if not raw.startswith("/") and raw:
            continue    # the vDSO: no file
        named = _NAMES.get(raw)
        if named is None:
            path = os.path.realpath("/proc/self/exe" if not raw else raw)
            named = _NAMES[raw] = (images.portable_name(path), path)
        out.append((*named, int(buf[i].base), int(buf[i].lo), int(buf[i].hi)))
    return out


_MODULE_FILES = {}   # realpath of an extension module's file -> its name (grows as modules load)


def _module_of_file(path):
    if path not in _MODULE_FILES:
        for name, m in list(sys.modules.items()):
            f = getattr(m, "__file__", None)
            if f and f.endswith(".so") and name not in _MODULE_FILES.values():
                _MODULE_FILES.setdefault(os.path.realpath(f), name)
    return _MODULE_FILES.get(path)


def _lookup(module, qualname):
    obj = importlib.import_module(module)
    for part in qualname.split(".") if qualname else ():
        obj = getattr(obj, part)
    return obj


def _is_const(o, depth=0):
    if type(o) in _CONST_SCALARS:
        return True
    if type(o) is slice and depth < 8:     # (pandas keeps them in its block placements)
        return all(x is None or _is_const(x, depth + 1) for x in (o.start, o.stop, o.step))
    if type(o) in (tuple, frozenset) and depth < 8 and len(o) <= 64:
        return all(_is_const(x, depth + 1) for x in o)
    return False


def _seeded(k, depth=0):
    if isinstance(k, _HASHED_BY_SEED):
        return True
    if isinstance(k, (tuple, frozenset)) and depth < 8:
        return any(_seeded(x, depth + 1) for x in k)
    return False


class _Targets:
    """The driver's relocation targets: id -> (spec, driver address)."""

    def __init__(self):
        self.specs = [("null",)]
        self.addrs = [0]
        self.by_addr = {}       # object address -> id
        self.keep = []          # the objects: alive while numbered, so an address never names two
        self.by_image = {}      # portable name -> id
        self.images = []        # (lo, hi, id), this walk's
        self._starts = []
        self._ranges = None

    def _new(self, spec, addr, obj=None):
        tid = len(self.specs)
        self.specs.append(spec)
        self.addrs.append(addr)
        if obj is not None:
            self.by_addr[addr] = tid
            self.keep.append(obj)
            self._ranges = None
        return tid

    def refresh_images(self):
        imgs = []
        for name, path, base, lo, hi in loaded_images():
            tid = self.by_image.get(name)
            if tid is None or self.addrs[tid] != base:
                # (the module is looked for once: a library a module pulled in has none)
                tid = self.by_image[name] = self._new(("image", name, _module_of_file(path), base), base)
            imgs.append((lo, hi, tid))
        self.images = sorted(imgs)
        self._starts = [lo for lo, _, _ in self.images]
        self._ranges = None
        if HANDLER and HANDLER not in self.by_addr and not self.in_image(HANDLER):
            # every region array names clamor's numpy allocator (not a gc referent)
            self._new(("handler", HANDLER), HANDLER, ctypes.cast(HANDLER, ctypes.py_object).value)

    def in_image(self, addr):
        i = bisect.bisect_right(self._starts, addr) - 1
        return i >= 0 and addr < self.images[i][1]

    def ranges(self):
        """Sorted target ranges for clamor_py_match: (lo[], hi[], id[], n)."""
        if self._ranges is None:
            rs = sorted(self.images + [(a, a + 1, t) for a, t in self.by_addr.items()])
            clean = []
            for r in rs:      # (an object inside an image's hull is covered by the image)
                if clean and r[0] < clean[-1][1]:
                    continue
                clean.append(r)
            n = len(clean)
            self._ranges = (ffi.new("uintptr_t[]", [r[0] for r in clean] or [0]),
                            ffi.new("uintptr_t[]", [r[1] for r in clean] or [0]),
                            ffi.new("uint32_t[]", [r[2] for r in clean] or [0]), n)
        return self._ranges

    def classify(self, o):
        """Number ``o`` (outside the region) as a target; None if an image
        covers it, else the reason it is not portable."""
        a = id(o)
        if a in self.by_addr or self.in_image(a):
            return None
        if a == HANDLER:
            self._new(("handler", a), a, o)
            return None
        if isinstance(o, types.ModuleType):
            try:
                ok = importlib.import_module(o.__name__) is o
            except Exception:
                ok = False
            if not ok:
                return f"module {o.__name__!r} cannot be imported by name"
            self._new(("symbol", o.__name__, "", a), a, o)
            return None
        if isinstance(o, (type, types.FunctionType, types.BuiltinFunctionType)):
            mod = getattr(o, "__module__", None)
            if mod is None and isinstance(getattr(o, "__self__", None), types.ModuleType):
                mod = o.__self__.__name__
            qual = getattr(o, "__qualname__", None)
            what = f"{'class' if isinstance(o, type) else 'function'} {mod}.{qual}"
            if mod in (None, "__main__") or not qual or "<locals>" in qual:
                return f"{what} cannot be imported by a worker (define it in a module the workers can import)"
            try:
                found = _lookup(mod, qual) is o
            except Exception:
                found = False
            if not found:
                return f"{what} is not what importing {mod} and looking up {qual} gives"
            self._new(("symbol", mod, qual, a), a, o)
            return None
        if o is datetime.timezone.utc:       # (each process has its own, found by name)
            self._new(("symbol", "datetime", "timezone.utc", a), a, o)
            return None
        if type(o) is str:
            self._new(("str", o, a), a, o)
            return None
        if _is_const(o):
            self._new(("const", pickle.dumps(o, protocol=pickle.HIGHEST_PROTOCOL), a), a, o)
            return None
        if type(o) is np.dtype:
            try:
                builtin = np.dtype(o.str) is o
            except TypeError:
                builtin = False
            if builtin:
                self._new(("dtype", o.str, a), a, o)
                return None
            return "a dtype made at run time outside the region: make it inside clamor.heap()"
        return (f"a {'mutable ' if not _is_const(o) else ''}{type(o).__name__} outside the region, which a worker "
                f"not forked from the driver cannot have: build it inside clamor.heap()")


class _Mode:
    """The portable side of one share() walk: classifies what lies outside
    the region and collects the extents to read for relocations."""

    def __init__(self, targets):
        self.t = targets
        self.extents = []       # (lo, length, strict, path, what)
        self.null_words = []    # addresses of words a worker reads as null
        self.seeded = None      # path of a dict or set whose keys hash by the seed
        self.root = None        # what the walk started from, for messages
        self.blocks_seen = set()
        self.objects = 0        # region objects visited

    def restart(self):
        """Forget what a walk collected: it is made again (objects were
        brought into the region)."""
        self.extents, self.null_words, self.seeded, self.blocks_seen = [], [], None, set()
        self.objects = 0

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
        self.objects += 1
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


class Relocations:
    """The driver's relocation lists, kept current for the objects shipped
    in place to workers not forked from it."""

    def __init__(self):
        self.generation = region.generation()
        self.targets = _Targets()
        self.roots = {}         # id -> object, every root shipped in place (and alive)
        self.per_root = {}      # id -> ({page: entries}, what its last walk read: a readtable.ReadTable)
        self.lists = {}         # page -> entries installed (bytes)
        self.orphans = set()    # pages listing words of roots forgotten since
        self.changed = []       # pages the driver changed since the last walk
        self.used = set()       # targets named by an installed list
        # walks done, their time, pages they read (last walk), pages with a
        # list and the entries of those lists (now)
        self.cost = {"walks": 0, "seconds": 0.0, "walked_pages": 0, "covered": 0, "pages": 0, "entries": 0}

    def nbytes(self):
        """The bytes the relocation lists keep: those installed, each
        root's entries and the table of what its walk read."""
        per_root = sum(len(e) for entries, _ in self.per_root.values() for e in entries.values())
        tables = sum(read.nbytes() for _, read in self.per_root.values() if read is not None)
        return sum(len(b) for b in self.lists.values()) + per_root + tables

    def note_changed(self, pages):
        if len(pages):
            self.changed.append(np.asarray(pages, dtype=np.uint64))

    def prepare(self, roots, stage, seeds_agree=True, limit=20_000_000, bring_in=False):
        """List the relocations of ``roots`` and install the lists that
        differ at ``stage``; return the pages whose lists changed (workers
        must fetch them again).  NotShareable if a root is not portable, or
        holds a dict keyed by str while the workers' hash seeds differ from
        the driver's (``seeds_agree`` false); nothing is kept of such roots.

        A page's list is the union of the words of every root shipped so
        far that is still alive.  A root is walked when first shipped, and
        again when the driver changed a page its last walk read.

        ``bring_in``: objects outside the region that only a root holds may
        be copied into it (walk._bring_in), which writes region pages; only
        for a caller whose version at ``stage`` begins after this.  A
        version begun already shows its workers the bytes as they were, and
        a list of bytes written since agrees with none of its pages (the
        worker that fetched one died of it).  Never for roots of earlier
        stages that this one does not ship: a refusal drops their words."""
        self._forget_dead()
        # The lists of dead roots go now, whatever the walk below decides:
        # their memory is free once _forget_dead let them go, and what the
        # driver makes there next must not be fetched with their words (a
        # refused walk left them, and a region array written over a dead
        # dict read as the dict's relocated pointers on the workers).
        orphaned = np.zeros(0, np.uint64)
        if self.orphans:
            pages, self.orphans = self.orphans, set()
            orphaned = self._install(pages, stage)
        changed = np.unique(np.concatenate(self.changed)) if self.changed else np.zeros(0, np.uint64)
        todo = {id(r): r for r in roots if id(r) not in self.roots}
        if changed.size:
            ch = pages_array(changed)
            todo.update((k, self.roots[k]) for k, (_, read) in self.per_root.items()
                        if k in self.roots and read.changed(ch))
        if not todo:
            self.changed = []
            return orphaned
        t0 = time.perf_counter()
        t = self.targets
        t.refresh_images()
        amap = _pyshare.AddressMap()
        walked, seeded, dropped = {}, None, set()
        shipped = {id(r) for r in roots}
        for k, r in todo.items():
            mode = _Mode(t)
            mode.root = f"a region {type(r).__name__} at {id(r):#x}"
            try:
                _walk(r, limit, mode, bring_in=bring_in and k in shipped)
                walked[k] = (_entries(mode, t, amap), read_digests(mode.extents))
            except NotShareable:
                if k in shipped or k not in self.roots:
                    raise
                # An earlier stage's object that the driver changed since,
                # not one this stage ships: its words go from the lists
                # (a later stage that ships it checks it again first).
                del self.roots[k]
                dropped.update(self.per_root.pop(k, ({}, None))[0])
                continue
            seeded = seeded or mode.seeded
        if seeded is not None and not seeds_agree:
            raise NotShareable(seed_message(seeded))
        pages = set(dropped)
        for k, (entries, cov) in walked.items():
            old = self.per_root.get(k)
            pages.update(entries)
            if old is not None:
                pages.update(old[0])
            self.per_root[k] = (entries, cov)
            self.roots[k] = todo[k]
        self.changed = []
        out = self._install(pages, stage)
        if orphaned.size:
            out = np.union1d(out, orphaned).astype(np.uint64)
        self.cost["walks"] += 1
        self.cost["walked_pages"] += sum(len(read) for _, read in walked.values())
        self.cost["covered"] = len(pages_array(np.concatenate([read.pages for _, read in self.per_root.values()]
                                                              or [np.zeros(0, np.uint64)])))
        self.cost["seconds"] += time.perf_counter() - t0
        return out

    def _forget_dead(self):
        """Roots no one but this table holds any more: their objects may be
        freed, and no task can read them."""
        for k in [k for k, r in self.roots.items() if sys.getrefcount(r) <= 3]:   # (the dict, r, the call)
            del self.roots[k]
            entries, _ = self.per_root.pop(k, ({}, None))
            self.orphans.update(entries)     # (their words may be another object's soon)

    def _page_list(self, page):
        return functools.reduce(_union, (e[page] for e, _ in self.per_root.values() if page in e), b"")

    def _install(self, pages, stage):
        changed = []
        for page in sorted(pages):
            e = self._page_list(page)
            if self.lists.get(page, b"") == e:
                continue
            n = len(e) // 16
            buf = ffi.from_buffer("struct clamor_reloc[]", bytearray(e)) if n else ffi.NULL
            rc = lib.clamor_reloc_set(stage, page, buf, n)
            if rc:
                from .._native import check
                check(rc, "clamor_reloc_set")
            if e:
                self.lists[page] = e
                self.used.update(np.frombuffer(e, _ENTRY)["t"].tolist())
            else:
                self.lists.pop(page, None)
            changed.append(page)
        self.cost["pages"] = len(self.lists)
        self.cost["entries"] = sum(len(e) for e in self.lists.values()) // 16
        return np.asarray(changed, dtype=np.uint64)

    def prune(self, floor):
        """Forget the lists no request at a stage >= ``floor`` is served."""
        lib.clamor_reloc_prune(floor)

    def specs_for(self, sent):
        """[(id, spec)] of the targets a list names that are not in
        ``sent`` (a worker binds them before it runs a task)."""
        return [(i, self.targets.specs[i]) for i in sorted(self.used - sent) if i]


_ENTRY = np.dtype([("w", "<u4"), ("t", "<u4"), ("v", "<u8")])


def _union(a, b):
    """Two pages' entries (bytes) as one list, sorted by word."""
    if not a or not b:
        return a or b
    e = np.concatenate([np.frombuffer(a, _ENTRY), np.frombuffer(b, _ENTRY)])
    _, first = np.unique(e["w"], return_index=True)
    return e[first].tobytes()


def _entries(mode, t, amap=None):
    """{page: entries as bytes, sorted by word} from the walk's extents."""
    tlo, thi, tid, nt = t.ranges()
    amap = amap or _pyshare.AddressMap()
    cap = 1 << 16
    at = ffi.new("uintptr_t[]", cap)
    ids = ffi.new("uint32_t[]", cap)
    done = ffi.new("size_t *")
    found = dict.fromkeys(mode.null_words, 0)
    for lo, n, strict, path, what in mode.extents:
        pos = 0
        while pos < n:
            k = lib.clamor_py_match(lo + pos, n - pos, tlo, thi, tid, nt, amap.private, amap.nprivate,
                                    at, ids, cap, done)
            pos += int(done[0])
            for i in range(k):
                a, target = int(at[i]), int(ids[i])
                if target == lib.CLAMOR_NO_TARGET:
                    if strict and a not in found:
                        word = int(ffi.cast("uintptr_t *", a)[0])
                        raise NotShareable(f"{path}: its {what} holds at byte {a - lo} a pointer ({word:#x}) into "
                                           f"this process's private memory outside the region, which a worker not "
                                           f"forked from the driver cannot follow (a weak reference, a cached "
                                           f"buffer, memory a library allocated outside clamor.heap())")
                    continue    # C memory: share()'s scan has warned about it
                if a not in found:
                    found[a] = target
    base, shift = region.base(), (region.page_size() - 1).bit_length()
    if not found:
        return {}
    addrs = np.fromiter(found.keys(), dtype=np.uint64, count=len(found))
    tids = np.fromiter(found.values(), dtype=np.uint32, count=len(found))
    order = np.argsort(addrs)
    addrs, tids = addrs[order], tids[order]
    off = addrs - np.uint64(base)
    pages = off >> np.uint64(shift)
    rec = np.empty(len(addrs), dtype=_ENTRY)
    rec["w"] = (off & np.uint64(region.page_size() - 1)) >> np.uint64(3)
    rec["t"] = tids
    rec["v"] = [int(ffi.cast("uintptr_t *", int(a))[0]) for a in addrs]
    out = {}
    cuts = np.flatnonzero(np.diff(pages)) + 1
    for chunk in np.split(np.arange(len(addrs)), cuts):
        out[int(pages[chunk[0]])] = rec[chunk].tobytes()
    return out


def check(obj, limit=20_000_000, seed=True):
    """share(obj, portable=True): NotShareable unless workers not forked
    from the driver can use ``obj`` in place (``seed``: also unless its str
    hashes need a seed the workers will not have)."""
    mode = _Mode(_driver().targets)
    mode.t.refresh_images()
    _walk(obj, limit, mode)
    _entries(mode, mode.t)   # (a pointer out of the region no target covers is refused here)
    if seed and mode.seeded is not None and not seed_passes_on():
        raise NotShareable(seed_message(mode.seeded))
    return _Read(read_digests(mode.extents), mode.objects)


class _Read:
    """What a portable verdict rests on: the region bytes its walk read
    pointers from (``walk.Reads``'s interface)."""

    def __init__(self, read, objects=0):
        self.read = read
        self.objects = objects

    def nbytes(self):
        return self.read.nbytes()

    def changed(self, pages):
        return self.read.changed(pages)

    def still_inherited(self):
        return True


def seed_message(path):
    return (f"{path} is a dict or set keyed by str or bytes, whose hashes CPython seeds per process: a worker not "
            f"forked from the driver reads it right only with the driver's seed.  Start the driver with "
            f"PYTHONHASHSEED set (for example PYTHONHASHSEED=0 python job.py): a Cluster passes it to the workers "
            f"it spawns; give hand-started workers the same")


_DRIVER = [None]


def _driver():
    d = _DRIVER[0]
    if d is None or d.generation != region.generation():   # (a region closed since: its lists went with it)
        d = _DRIVER[0] = Relocations()
    return d


def reset():
    """Forget every list, target and root (the objects it held may go):
    a Cluster closes.  Its workers were the only ones to read them."""
    if _DRIVER[0] is not None:
        _DRIVER[0] = None
        if lib.clamor_region_role() == lib.CLAMOR_ROLE_DRIVER:
            lib.clamor_reloc_reset()


def driver():
    """This process's Relocations (the driver's)."""
    return _driver()


def driver_nbytes():
    """The bytes the driver's relocation lists keep (0 if it has none)."""
    d = _DRIVER[0]
    return d.nbytes() if d is not None else 0


# ---- worker --------------------------------------------------------------------------

_bound = {}     # id -> the object a target resolved to (kept alive here)


def enable():
    """Ask for relocations with every page this worker fetches."""
    lib.clamor_reloc_enable(1)


def bind(specs):
    """Resolve and bind targets [(id, spec)] in this worker.  NotShareable
    if one cannot be had here (an image not loaded, a symbol not found)."""
    imgs = None
    for tid, spec in specs:
        if tid in _bound:
            continue
        kind = spec[0]
        if kind == "image":
            _, name, module, dbase = spec
            if module:
                try:
                    importlib.import_module(module)
                except Exception as err:
                    raise NotShareable(f"a region object points into {module}, which this worker cannot import: "
                                       f"{err}") from err
            imgs = imgs if imgs is not None and not module else {n: b for n, _, b, _, _ in loaded_images()}
            local = imgs.get(name)
            if local is None:
                path = images.local_path(name)
                if path is not None:
                    try:
                        ctypes.CDLL(path)
                    except OSError:
                        pass
                    imgs = {n: b for n, _, b, _, _ in loaded_images()}
                    local = imgs.get(name)
            if local is None:
                raise NotShareable(f"a region object points into {name.removeprefix('rel:')}, which this worker "
                                   f"has not loaded and cannot load")
            obj, daddr, laddr = None, dbase, local
        elif kind == "symbol":
            _, module, qual, daddr = spec
            try:
                obj = _lookup(module, qual)
            except Exception as err:
                raise NotShareable(f"a region object refers to {module}{'.' + qual if qual else ''}, which this "
                                   f"worker cannot import: {type(err).__name__}: {err}") from err
            laddr = id(obj)
        elif kind == "str":
            obj, daddr = sys.intern(spec[1]), spec[2]
            laddr = id(obj)
        elif kind == "const":
            obj, daddr = pickle.loads(spec[1]), spec[2]
            laddr = id(obj)
        elif kind == "dtype":
            obj, daddr = np.dtype(spec[1]), spec[2]
            laddr = id(obj)
        elif kind == "handler":
            obj, daddr, laddr = None, spec[1], HANDLER
        elif kind == "vtable":
            _, module, qual, daddr = spec
            try:
                obj = _lookup(module, qual)
            except Exception as err:
                raise NotShareable(f"a region object uses the C methods of {module}.{qual}, which this worker "
                                   f"cannot import: {type(err).__name__}: {err}") from err
            laddr = _pyshare.vtable_of(obj)
            if not laddr:
                raise NotShareable(f"{module}.{qual} has no table of C methods on this worker")
        else:
            raise errors.ProtocolError(f"unknown relocation target kind {kind!r}")
        rc = lib.clamor_reloc_bind(tid, daddr, laddr)
        if rc:
            from .._native import check as _check
            _check(rc, "clamor_reloc_bind")
        _bound[tid] = obj


def unbind_all():
    """Forget every target bound here (the region was closed, which
    unbound them in C): the next driver numbers its targets from 1 again."""
    _bound.clear()


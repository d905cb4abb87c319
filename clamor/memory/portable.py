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
import sys
import time

import numpy as np

from .. import errors
from .._native import ffi, lib
from . import _pyshare, region
from .targets import Targets, bind, enable, loaded_images, unbind_all  # noqa: F401  (the runtime's)
from .readtable import pages_array
from . import cwalk
from .walk import _walk
# The parts of portable objects, each in a module of its own: the names
# the runtime and the tests use of them are here too.
from ._portmode import _Mode
from ._relocentries import _ENTRY, _TYPE_WORD, Words, _by_page, _entries, _page_entries, _pages_of, _splice  # noqa: F401
from ._seeds import hash_digest, seed_message, seed_passes_on  # noqa: F401

NotShareable = errors.NotShareable


class Relocations:
    """The driver's relocation lists, kept current for the objects shipped
    in place to workers not forked from it."""

    def __init__(self):
        self.generation = region.generation()
        self.targets = Targets()
        self.roots = {}         # id -> object, every root shipped in place (and alive)
        self.per_root = {}      # id -> (its relocation Words, what its last walk read: a readtable.ReadTable)
        self.visited = {}       # id -> the objects its last walk visited
        self.offers = {}        # id -> (object, version, Words, _Read, seeded, tagged state): check()'s walks
        # id -> (Words with tags, root slots, seeded): the words a tagged
        # walk of a dict or list found, for a walk of some entries again
        self.tagged = {}
        self.seeded = {}        # id -> its last walk reached a dict or set keyed by seeded hashes
        self.pending = set()    # pages whose lists a recheck changed, to install at the next prepare
        self.listed = {}        # page -> entries of its list installed (pages with none: not here)
        self.orphans = set()    # pages listing words of roots forgotten since
        self.changed = []       # pages the driver changed since the last walk
        self.used = set()       # targets named by a root's words (installed)
        # walks done, their time, pages they read (last walk), pages with a
        # list and the entries of those lists (now)
        self.cost = {"walks": 0, "seconds": 0.0, "walked_pages": 0, "covered": 0, "pages": 0, "entries": 0}

    def nbytes(self, counted=frozenset()):
        """The bytes the relocation lists keep: those installed (the C
        side's, every version held), each root's words, tags and the table
        of what its walk read (but those whose id is in ``counted``: a
        verdict's, counted there)."""
        # (a root's words and its tagged state share their addresses and targets)
        held = {id(a): a.nbytes for words, _ in self.per_root.values() for a in words.arrays()}
        held.update((id(a), a.nbytes) for state in self.tagged.values() for a in state[0].arrays())
        tables = sum(read.nbytes() for _, read in self.per_root.values()
                     if read is not None and id(read) not in counted)
        return sum(held.values()) + tables + lib.clamor_reloc_nbytes()

    def note_changed(self, pages):
        if len(pages):
            self.changed.append(np.asarray(pages, dtype=np.uint64))

    def prepare(self, roots, stage, seeds_agree=True, limit=cwalk.LIMIT, bring_in=False):
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
        if not seeds_agree:
            # (a root whose last walk, or a recheck for share()'s check,
            # reached such a dict is walked whole: a worker hashing otherwise
            # misreads it, and a recheck cannot tell that it went since)
            todo.update((id(r), r) for r in roots if self.seeded.get(id(r)))
        if not todo:
            self.changed = []
            if self.pending:
                pages, self.pending = self.pending, set()
                orphaned = np.union1d(orphaned, self._install(pages, stage)).astype(np.uint64)
            return orphaned
        t0 = time.perf_counter()
        walked, seeded, dropped = self._walk_roots(roots, todo, changed, limit, seeds_agree, bring_in)
        if seeded is not None and not seeds_agree:
            raise NotShareable(seed_message(seeded))
        pages = set(dropped) | self.pending
        self.pending = set()
        for k, (words, cov, touched, state, sd) in walked.items():
            old = self.per_root.get(k)
            if touched is not None:
                pages.update(touched.tolist())       # (a recheck: the other pages' lists stand)
            else:
                pages.update(words.pages.tolist())
                if old is not None:
                    pages.update(old[0].pages.tolist())
            self._keep(k, todo[k], words, cov, state, sd)
        self.changed = []
        out = self._install(pages, stage)
        if orphaned.size:
            out = np.union1d(out, orphaned).astype(np.uint64)
        self.cost["walks"] += 1
        self.cost["walked_pages"] += sum(len(read) for _, read, *_ in walked.values())
        self.cost["covered"] = len(pages_array(np.concatenate([read.pages for _, read in self.per_root.values()]
                                                              or [np.zeros(0, np.uint64)])))
        self.cost["seconds"] += time.perf_counter() - t0
        return out

    def _walk_roots(self, roots, todo, changed, limit, seeds_agree, bring_in):
        """``prepare``'s walks of the roots ``todo`` {id: root}: a walk
        ``check`` offered, a recheck of some entries, or a walk again.
        ({id: (Words, read table, pages whose lists changed or None,
        tagged state)}, the path of a dict keyed by seeded hashes or None,
        the pages of earlier roots refused and dropped)."""
        t = self.targets
        t.refresh_images()
        amap = _pyshare.AddressMap()
        walked, seeded, dropped = {}, None, set()
        shipped = {id(r) for r in roots}
        offers, self.offers = self.offers, {}
        for k, r in todo.items():
            o = _offered(offers.get(k), r, seeds_agree)
            if o is not None:
                walked[k] = (o[2], o[3].read, None, o[5], bool(o[4]))
                self.visited[k] = o[3].objects
                seeded = seeded or o[4]
                continue
            again = self._recheck(k, r, changed, limit, seeds_agree)
            if again is not None:
                walked[k] = (*again, again[3][2])
                continue
            mode = _Mode(t, seeds_agree, amap)
            mode.root = f"a region {type(r).__name__} at {id(r):#x}"
            try:
                _walk(r, limit, mode, bring_in=bring_in and k in shipped)
                walked[k] = (_entries(mode, t, amap), mode.read_table(), None, _tag_state(mode, r), bool(mode.seeded))
                self.visited[k] = mode.objects
            except NotShareable:
                if k in shipped or k not in self.roots:
                    raise
                # An earlier stage's object that the driver changed since,
                # not one this stage ships: its words go from the lists
                # (a later stage that ships it checks it again first).
                del self.roots[k]
                self.visited.pop(k, None)
                self.tagged.pop(k, None)
                self.seeded.pop(k, None)
                gone = self.per_root.pop(k, None)
                if gone is not None:
                    dropped.update(gone[0].pages.tolist())
                continue
            seeded = seeded or mode.seeded
        return walked, seeded, dropped

    def offer(self, obj, words, read, seeded, state):
        """A walk of ``obj`` that ``check`` made: a stage that ships it before
        its version begins takes it, if the bytes it read still read so,
        instead of walking again (the check before a stage and the listing
        of its relocations walk the same object)."""
        self.offers[id(obj)] = (obj, region.version_current(), words, read, seeded, state)

    def _keep(self, k, r, words, read, state, seeded):
        self.per_root[k] = (words, read)
        self.roots[k] = r
        self.seeded[k] = seeded
        self.used.update(words.targets.tolist())
        if state is not None:
            self.tagged[k] = state
        else:
            self.tagged.pop(k, None)

    def _recheck(self, k, r, written, limit, seeds_agree=True):
        """Root ``r`` (id ``k``), a dict or list whose tagged walk is kept,
        after the driver wrote the pages ``written``: walk again in C only
        the entries whose bytes changed (cwalk.dirty_entries), and put their
        words and ranges in place of the old ones.  (Words, read table,
        the pages whose lists changed, the tagged state), or None when a
        whole walk must decide (see cwalk.recheck; also an object outside
        the region that is no target, or a seed to report)."""
        st = self.tagged.get(k)
        if st is None or self.roots.get(k) is not r or not len(written):
            return None
        old, slots, was_seeded = st
        if was_seeded and not seeds_agree:
            return None
        read = self.per_root[k][1]
        stale = read.changed_pages(np.intersect1d(pages_array(written), read.pages, assume_unique=True))
        got = cwalk.dirty_entries(r, read, stale, slots)
        if got is None:
            return None
        dirty, slots_now = got
        self.targets.refresh_images()
        mode = _Mode(self.targets, seeds_agree)
        if not mode.c_walk(r, limit, dirty=dirty) or mode.shared:
            return None
        drop = np.union1d(dirty, np.array([-1], np.int32)).astype(np.int32)  # (the root's own words come again)
        got = _splice(old, drop, mode.found)
        if got is None:
            return None      # (a word both kept and found again: an object two entries share)
        words, touched = got
        words.targets = np.union1d(self.per_root[k][0].targets, mode.words.targets).astype(np.uint32)
        kept = (mode.c_strict & _TYPE_WORD) == 0
        read = read.updated(drop, mode.c_extents[kept], mode.tags[kept], stale)
        self.cost["rechecks"] = self.cost.get("rechecks", 0) + 1
        return words, read, touched, (words, slots_now, was_seeded or bool(mode.seeded))

    def verdict(self, obj):
        """What the last walk of ``obj`` read (a ``_Read``), if it is a root
        whose pages read as that walk read them: its walk approved it for
        workers not forked, and ``check`` would again.  None otherwise.
        (Every page written since that walk is among those noted since, or
        written since the version began.)"""
        k = id(obj)
        if self.roots.get(k) is not obj or k not in self.per_root:
            return None
        read = self.per_root[k][1]
        written = pages_array(np.concatenate(self.changed + [region.dirty_pages()]))
        if read.changed(np.intersect1d(written, read.pages, assume_unique=True)):
            # (a dict or list whose entries changed: those are walked again,
            # and their pages' lists listed at the next prepare)
            again = self._recheck(k, obj, written, cwalk.LIMIT)
            if again is None:
                return None
            words, read, touched, state = again
            self._keep(k, obj, words, read, state, state[2])
            self.pending.update(touched.tolist())
        return _Read(read, self.visited.get(k, 0))

    def _forget_dead(self):
        """Roots no one but this table holds any more: their objects may be
        freed, and no task can read them."""
        for k in [k for k, r in self.roots.items() if sys.getrefcount(r) <= 3]:   # (the dict, r, the call)
            del self.roots[k]
            self.visited.pop(k, None)
            self.tagged.pop(k, None)
            self.seeded.pop(k, None)
            gone = self.per_root.pop(k, None)
            if gone is not None:
                self.orphans.update(gone[0].pages.tolist())     # (their words may be another object's soon)

    def _groups(self, pages):
        """The words to list on ``pages`` (ascending), as (pages, addresses,
        targets) groups for clamor_reloc_set_words: a root's whole words
        for the pages only it has words on (C skips the others' words), the
        union of the roots' words on the pages two or more have words on
        (each address once: the first root's, in the order the roots came;
        an object two roots reach has the same words in both), and none
        for the pages no live root has words on."""
        roots = [w for w, _ in self.per_root.values() if len(w.pages)]
        masks = [np.isin(pages, w.pages, assume_unique=True) for w in roots]
        count = np.sum(masks, axis=0) if masks else np.zeros(len(pages), np.int64)
        groups = [g for w, m in zip(roots, masks) for g in w.groups(pages[m & (count == 1)])]
        shared = pages[count >= 2]
        if len(shared):
            parts = [w.on(shared) for w, m in zip(roots, masks) if (m & (count >= 2)).any()]
            addrs, first = np.unique(np.concatenate([a for a, _ in parts]), return_index=True)
            groups.append((shared, addrs, np.concatenate([t for _, t in parts])[first]))
        groups.append((pages[count == 0], np.zeros(0, np.uint64), np.zeros(0, np.uint32)))
        return [g for g in groups if len(g[0])]

    def _install(self, pages, stage):
        """Install the lists of ``pages`` (a set) at ``stage`` where they
        changed; the pages whose lists changed (ascending)."""
        pages = np.asarray(sorted(pages), dtype=np.uint64)
        changed_pages = []
        for group, addrs, tids in self._groups(pages):
            group = np.ascontiguousarray(group, dtype=np.uint64)
            addrs = np.ascontiguousarray(addrs, dtype=np.uint64)
            tids = np.ascontiguousarray(tids, dtype=np.uint32)
            changed = np.zeros(len(group), np.uint8)
            counts = np.zeros(len(group), np.uint32)
            rc = lib.clamor_reloc_set_words(stage, ffi.cast("const uint64_t *", group.ctypes.data), len(group),
                                            ffi.cast("const uint64_t *", addrs.ctypes.data),
                                            ffi.cast("const uint32_t *", tids.ctypes.data), len(addrs),
                                            ffi.cast("uint8_t *", changed.ctypes.data),
                                            ffi.cast("uint32_t *", counts.ctypes.data))
            if rc:
                from .._native import check
                check(rc, "clamor_reloc_set_words")
            for page, n in zip(group.tolist(), counts.tolist()):
                if n:
                    self.listed[page] = n
                else:
                    self.listed.pop(page, None)
            changed_pages.append(group[changed.astype(bool)])
        self.cost["pages"] = len(self.listed)
        self.cost["entries"] = sum(self.listed.values())
        return np.sort(np.concatenate(changed_pages)) if changed_pages else np.zeros(0, np.uint64)

    def prune(self, floor):
        """Forget the lists no request at a stage >= ``floor`` is served."""
        lib.clamor_reloc_prune(floor)

    def specs_for(self, sent):
        """[(id, spec)] of the targets a list names that are not in
        ``sent`` (a worker binds them before it runs a task)."""
        return [(i, self.targets.specs[i]) for i in sorted(self.used - sent) if i]


def _tag_state(mode, r):
    """What a walk of some entries again needs of ``mode``'s walk of the
    dict or list ``r``: its words tagged by entry and where the entries
    lie; None if it was not tagged, or an object was reached through two."""
    if mode.found is None or mode.found[2] is None or mode.shared:
        return None
    slots = cwalk._root_slots(r)
    if slots is None:
        return None
    return (_entries(mode, mode.t), slots, bool(mode.seeded))


def _offered(o, r, seeds_agree):
    """The offered walk ``o`` of root ``r``, if it is current: made in this
    version, on bytes that read as they did then (the pages written since
    the version began are compared), and no seed to report."""
    if o is None or o[0] is not r or o[1] != region.version_current() or (o[4] and not seeds_agree):
        return None
    read = o[3].read
    if read.changed(np.intersect1d(pages_array(region.dirty_pages()), read.pages, assume_unique=True)):
        return None
    return o


def check(obj, limit=cwalk.LIMIT, seed=True):
    """share(obj, portable=True): NotShareable unless workers not forked
    from the driver can use ``obj`` in place (``seed``: also unless its str
    hashes need a seed the workers will not have)."""
    if not seed or seed_passes_on():
        # (the stage that ships it listed its relocations already: that walk's verdict)
        known = _DRIVER[0].verdict(obj) if _DRIVER[0] is not None else None
        if known is not None:
            return known
    d = _driver()
    o = _offered(d.offers.get(id(obj)), obj, True)
    if o is not None and o[3].objects <= limit:
        # (a walk made since the bytes it read last changed: share()'s before the stage's check)
        if seed and o[4] and not seed_passes_on():
            raise NotShareable(seed_message(o[4]))
        return o[3]
    mode = _Mode(d.targets, seeds_agree=not seed or seed_passes_on())
    mode.t.refresh_images()
    _walk(obj, limit, mode)
    words = _entries(mode, mode.t)     # (a pointer out of the region no target covers is refused here)
    if seed and mode.seeded is not None and not seed_passes_on():
        raise NotShareable(seed_message(mode.seeded))
    read = _Read(mode.read_table(), mode.objects)
    d.offer(obj, words, read, mode.seeded, _tag_state(mode, obj))
    return read


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


def driver_nbytes(counted=frozenset()):
    """The bytes the driver's relocation lists keep (0 if it has none),
    but the read tables whose id is in ``counted``."""
    d = _DRIVER[0]
    return d.nbytes(counted) if d is not None else 0

"""share()'s walks in C (csrc/pywalk.c), as the Python walk
(``walk.py``, their reference) calls them: of plain data and of
instances of plain classes, whole (``walk_plain``), again for the entries
of a dict or list that changed (``recheck``, ``dirty_entries``), and the
conversion of instances' dicts to keys of their own (``c_pass``).  What
they meet outside the region the Python walk judges: its rules come in as
a ``judge``.  The walk for workers not forked is portable._Mode.c_walk.
"""
import numpy as np

from . import _pyshare, region
from .._native import ffi, lib
from .readtable import union_equal

conversions = [0]   # instances' dicts given keys of their own, and objects brought in, by either walk
brought = [0]       # objects brought into the region by share()'s walks (promote)


# The most objects a walk visits before it refuses (share()'s ``limit``):
# a runaway graph is refused in seconds rather than walked for minutes; a
# dict of 10^7 entries of tuples is 3 * 10^7 objects.
LIMIT = 100_000_000
_PLAIN = (dict, list, tuple, set, frozenset, str, bytes, int, float, complex, bool)
plain_in_c = [True]     # (tests/test_walk_plain.py compares the two walks)
# The loaded images' ranges, read once (/proc/self/maps costs milliseconds):
# the interpreter's static objects lie in its own image, loaded at start; an
# image loaded later is only missing from them, and what lies there goes to
# the Python walk.
_images = [None]


def _image_ranges():
    """The loaded images' ranges for the C walks: (sorted pairs, count)."""
    if _images[0] is None:
        spans = _pyshare.AddressMap().images()
        _images[0] = (ffi.new("uintptr_t[]", [x for r in spans for x in r] or [0]), len(spans))
    return _images[0]


def in_c(obj):
    """Can a walk from ``obj`` go in C (csrc/pywalk.c)?  Plain data, or an
    instance of a plain class."""
    return plain_in_c[0] and (type(obj) in _PLAIN or _pyshare.is_class(type(obj)))


def _wrap_allocators():
    """Python's allocators wrapped (hooks.install), as a heap block in C needs."""
    from . import hooks
    if not hooks._installed:
        hooks.install()


# the workers a walk is for, as clamor_py_own_keys takes them
FORKED, NOT_FORKED = 1, 2


def c_pass(run, obj, limit, convert=True, frozen=FORKED):
    """Run the C walk ``run()`` from ``obj``; where it answers that an
    instance's dict needs keys of its own (2) and ``convert``, give every
    such instance reachable its own (clamor_py_own_keys, as ``_own_keys``
    would) and run it again.  Its answer: 1 approved, 0 the Python walk
    decides, 2 keys needed.  ``frozen``: the workers the walk is for:
    FORKED leaves the instances of classes whose keys were frozen at the
    fork as they are, NOT_FORKED those whose attributes lie in a region
    values table over their class's frozen table (csrc/pyclasskeys.c)."""
    for again in (False, True):
        rc = run()
        if rc < 0:
            raise MemoryError("no memory for the walk of plain data")
        if rc != 2 or again or not convert:
            return rc
        _wrap_allocators()
        n = lib.clamor_py_own_keys(id(obj), limit, frozen)
        if n < 0:
            return 0            # (not the driver: the Python walk says why)
        conversions[0] += n
    return rc


def rekey(obj, limit, keys):
    """promote.rekey in C for the exact region dicts reachable from ``obj``
    that hold one of the strs ``keys`` (outside the region, more than one
    character) as a key: one region copy of each key, in place of it in
    each such dict (csrc/pyownkeys.c, clamor_py_rekey).  The (dict, key)
    pairs replaced, counted as the Python walk counts its moves."""
    _wrap_allocators()
    addrs = np.array(sorted({id(k) for k in keys}), dtype=np.uint64)
    n = lib.clamor_py_rekey(id(obj), limit, ffi.from_buffer("uint64_t[]", addrs), len(addrs))
    if n < 0:
        raise MemoryError(f"the keys of the dicts could not be copied into the region (errno {-n})")
    conversions[0] += n
    brought[0] += n
    return n


def walk_plain(obj, limit, reads, convert, judge):
    """share()'s walk of plain data and of instances of plain classes in C
    (csrc/pywalk.c): True when every object reachable is plain data or such
    an instance, in the region with its tables (or a singleton every
    process has, or an atom or class outside it that ``_ok_outside``
    accepts), and the walk in Python would approve it without a word to
    say or a thing to write; False when that walk must decide.  ``reads``
    (the Cluster's check, a ``walk.Reads``) gets the extents the verdict
    rests on, as the Python walk's ``Reads.inside`` would.  ``convert``: instances whose
    dicts need keys of their own get them first, as ``_own_keys`` gives
    them (csrc/pyownkeys.c, clamor_py_own_keys), where the Python walk would
    have.  ``judge(objects, limit, reads)``: does the Python walk accept
    the objects the C walk met outside the region, as they are?"""
    if not in_c(obj):
        return False
    images, visited = _image_ranges(), ffi.new("long *")
    tagged = reads is not None and type(obj) in (dict, list)

    def run():
        nonlocal out, outside, tags, shared
        out = bytearray() if reads is not None else None
        outside = []
        if tagged:
            tags, shared = bytearray(), ffi.new("int *")
            return lib.clamor_py_walk_tagged(id(obj), limit, *images, visited, id(out), id(tags), id(outside),
                                             ffi.NULL, 0, 0, shared)
        return lib.clamor_py_walk_plain(id(obj), limit, *images, visited, id(out) if out is not None else 0,
                                        id(outside))

    out = outside = tags = shared = None
    if c_pass(run, obj, limit, convert) != 1:
        return False
    if not judge(outside, limit, reads):
        if reads is not None:
            reads.restart()
        return False
    if reads is not None:
        reads.plain = np.frombuffer(out, dtype=np.uint64).reshape(-1, 2)
        reads.objects += int(visited[0])
        slots = _root_slots(obj) if tagged and not shared[0] and not reads.extents else None
        if slots is not None:
            # (entries sharing an object, containers the Python walk took
            # outside the region, a table laid out otherwise: a change is
            # walked again whole)
            reads.tags = np.frombuffer(tags, dtype=np.int32)
            reads.root = slots
    return True


def _root_slots(obj):
    """(first, stride, count): entry i of the dict or list ``obj`` lies at
    first + i * stride, for i < count; None if that is not known."""
    first, stride, count = ffi.new("uint64_t *"), ffi.new("uint64_t *"), ffi.new("int64_t *")
    if lib.clamor_py_root_slots(id(obj), first, stride, count) != 0:
        return None
    return int(first[0]), int(stride[0]), int(count[0])


def dirty_entries(obj, table, stale, root):
    """The entries of the dict or list ``obj`` to walk again after the
    driver changed the pages ``stale`` (ascending) that its walk read, by
    the read ``table`` tagged by entry and where the entries lay then
    (``root``, ``_root_slots``): those with a range on a changed page, and,
    if the root's own bytes changed, those whose slots lie on those pages
    and those between its old end and its new one.  (int32 entries ascending, the slots now),
    or None if its table moved (the slots are others: a whole walk)."""
    tags = table.tags_on(stale)
    dirty = tags[tags >= 0]
    if len(tags) and tags[0] < 0:
        now = _root_slots(obj)
        if now is None or now[:2] != root[:2]:
            return None
        lo, st, count = now
        hi, ps, base = lo + st * count, region.page_size(), region.base()
        # (and those between the old end and the new: gone, or new)
        slots = [np.arange(min(root[2], count), max(root[2], count), dtype=np.int32)]
        for p in stale.tolist():
            a, b = max(lo, base + p * ps), min(hi, base + (p + 1) * ps)
            if a < b:
                slots.append(np.arange((a - lo) // st, (b - lo + st - 1) // st, dtype=np.int32))
        dirty = np.union1d(dirty, np.concatenate(slots))
        root = now
    return np.ascontiguousarray(dirty, dtype=np.int32), root


def recheck(obj, reads, limit, judge):
    """Bring a verdict on the dict or list ``obj`` up to date after the
    driver changed the pages in ``reads.stale``: walk again, in C, only the
    entries whose slot in the root's table, or a range reached through
    them, lies on a changed page (csrc/pywalk.c, clamor_py_walk_tagged),
    and replace their ranges in the read table.  True if the verdict
    stands (``reads`` updated); False if it must be made again by a whole
    walk (the root's table moved or grew, an entry the C walk leaves to
    Python, an object two entries share, an instance whose dict needs keys
    of its own).  ``judge(objects, limit)``: the inherited ones among the
    objects the C walk met outside the region, or None if the Python walk
    would not accept them as they are."""
    if not reads.incremental or type(obj) not in (dict, list) or not plain_in_c[0]:
        return False
    stale = reads.stale if reads.stale is not None else np.zeros(0, np.uint64)
    table = reads.read
    got = dirty_entries(obj, table, stale, reads.root)
    if got is None:
        return False
    dirty, reads.root = got
    out, tagbuf, shared, visited = bytearray(), bytearray(), ffi.new("int *"), ffi.new("long *")
    outside = []
    rc = lib.clamor_py_walk_tagged(id(obj), limit, *_image_ranges(), visited, id(out), id(tagbuf), id(outside),
                                   ffi.cast("const int32_t *", dirty.ctypes.data), len(dirty), 1, shared)
    if rc < 0:
        raise MemoryError("no memory for the walk of plain data")
    if rc != 1 or shared[0]:
        return False
    inherited = judge(outside, limit)
    if inherited is None:
        return False
    ranges = np.frombuffer(out, dtype=np.uint64).reshape(-1, 2)
    new_tags = np.frombuffer(tagbuf, dtype=np.int32)
    mine = new_tags < 0
    if union_equal(table.own_ranges(), ranges[mine]):
        ranges, new_tags = ranges[~mine], new_tags[~mine]      # (the root's own ranges stay)
    else:
        dirty = np.union1d(dirty, np.array([-1], np.int32))    # (a list's items grew: its ranges with them)
    reads.read = table.updated(dirty, ranges, new_tags, stale)
    reads.inherited += inherited
    reads.stale = None
    return True

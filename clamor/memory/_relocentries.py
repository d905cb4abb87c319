"""The relocation words of region pages: the words of a walk's extents
that point at a target (``_match``), kept per root as ``Words`` (sorted by
address, with the pages they lie in), from which C makes each page's list
of entries as it installs it (clamor_reloc_set_words; ``_by_page`` is the
same lists in numpy, the tests' reference).  See ``clamor.memory.portable``.
"""
import errno

import numpy as np

from . import _pyshare, region
from .readtable import TagSet
from .. import errors
from .._native import ffi, lib
from .._native import owned_array as _owned

NotShareable = errors.NotShareable


_TYPE_WORD = 2      # (an extent's strictness byte: csrc/pywalk.c)
_ENTRY = np.dtype([("w", "<u4"), ("t", "<u4"), ("v", "<u8")])


def _match(ext, strict, nulls, t, amap=None, tags=None, null_tags=None):
    """The words of the extents ``ext`` ((n, 2) start, length) that point at
    a target, and the ``nulls`` (read as null by a worker): ((addresses,
    targets, tags) sorted by address, the first number found for a word
    kept, each word tagged as its extent or null word is, if ``tags``), the
    words of strict extents that point into private memory and are no
    null word (``bad``, in the extents' order), and the words as ``Words``.
    In one call of C
    (csrc/pyrelist.c); ``_match_reference`` is its reference."""
    tlo, thi, tid, nt = t.ranges()
    if amap is None:
        amap = _pyshare.AddressMap()
    ext = np.ascontiguousarray(ext, dtype=np.uint64).reshape(-1, 2)
    strict = np.ascontiguousarray(strict, dtype=np.uint8)
    nulls = np.ascontiguousarray(nulls, dtype=np.uint64)
    tagged = tags is not None
    if tagged:
        tags = np.ascontiguousarray(tags, dtype=np.int32)
        null_tags = np.ascontiguousarray(null_tags, dtype=np.int32)
    out = ffi.new("struct clamor_relist *")
    rc = lib.clamor_py_reloc_words(
        ffi.cast("const uint64_t *", ext.ctypes.data), ffi.cast("const uint8_t *", strict.ctypes.data),
        ffi.cast("const int32_t *", tags.ctypes.data) if tagged else ffi.NULL, len(ext),
        ffi.cast("const uint64_t *", nulls.ctypes.data),
        ffi.cast("const int32_t *", null_tags.ctypes.data) if tagged else ffi.NULL, len(nulls),
        tlo, thi, tid, nt, amap.private, amap.nprivate, 1, out)
    if rc in (errno.E2BIG, errno.EINVAL):     # (words beyond its packed keys, or outside the region)
        found, bad = _match_reference(ext, strict, nulls, t, amap, tags, null_tags)
        return found, bad, Words(*found[:2], tags=found[2])
    if rc:
        raise MemoryError("no memory to list the relocations")
    n = out.n
    addrs = _owned(out.addrs, n, np.uint64)
    tids = _owned(out.tids, n, np.uint32)
    word_tags = _owned(out.tags, n, np.int32)
    bad = _owned(out.bad, out.nbad, np.uint64)
    words = Words(addrs, tids, _owned(out.pages, out.npages, np.uint64), _owned(out.ends, out.npages, np.uint64),
                  _owned(out.targets, out.ntargets, np.uint32), word_tags if tagged else None)
    return (addrs, tids, word_tags if tagged else None), bad, words


# A root's words are kept in chunks of whole pages, about this many words
# each: a recheck's splice makes anew only the chunks its words go from or
# come to, and shares the others with the words before it.
CHUNK_WORDS = 1 << 16


class _Chunk:
    """Words of consecutive pages: ``addrs`` (ascending), ``tids``,
    ``tags`` (or None), the ``pages`` and where each one's words end
    (``ends``, into this chunk); the least and greatest tag.  Never changed
    once made: Words share chunks."""

    __slots__ = ("addrs", "tids", "tags", "pages", "ends", "tmin", "tmax")

    def __init__(self, addrs, tids, tags, pages, ends):
        self.addrs, self.tids, self.tags, self.pages, self.ends = addrs, tids, tags, pages, ends
        for a in (addrs, tids, tags, pages, ends):
            if a is not None:
                a.flags.writeable = False
        self.tmin = int(tags.min()) if tags is not None and len(tags) else 0
        self.tmax = int(tags.max()) if tags is not None and len(tags) else -1


class Words:
    """A root's relocation words: their addresses (ascending, each once)
    and the targets they name, the tags of a tagged walk (the root's entry
    each was reached through), the pages they lie in (ascending) with where
    each page's words end, and the targets named (each once).  Kept in
    chunks of whole pages (``CHUNK_WORDS``); ``addrs``, ``tids``, ``tags``,
    ``pages`` and ``ends`` read them whole."""

    __slots__ = ("chunks", "targets", "tagged", "_firsts", "_flat")

    def __init__(self, addrs, tids, pages=None, ends=None, targets=None, tags=None):
        if pages is None:
            p = _pages_of(addrs)
            cut = np.flatnonzero(p[1:] != p[:-1]) + 1
            pages = p[np.concatenate([[0], cut]).astype(np.int64)] if len(p) else np.zeros(0, np.uint64)
            ends = np.append(cut, len(p)).astype(np.uint64) if len(p) else np.zeros(0, np.uint64)
        if targets is None:
            targets = np.unique(tids)
        self._set(_cut_words(addrs, tids, tags, pages, ends), targets, tags is not None)

    @classmethod
    def of_chunks(cls, chunks, targets, tagged):
        w = cls.__new__(cls)
        w._set(chunks, targets, tagged)
        return w

    def _set(self, chunks, targets, tagged):
        self.chunks, self.targets, self.tagged, self._flat = chunks, targets, tagged, {}
        self._firsts = np.array([int(c.pages[0]) for c in chunks], dtype=np.uint64)     # (each chunk's first page)

    def _joined(self, name, dtype):
        got = self._flat.get(name)
        if got is None:
            parts = [getattr(c, name) for c in self.chunks]
            got = parts[0] if len(parts) == 1 else np.concatenate(parts) if parts else np.zeros(0, dtype)
            self._flat[name] = got
        return got

    @property
    def addrs(self):
        return self._joined("addrs", np.uint64)

    @property
    def tids(self):
        return self._joined("tids", np.uint32)

    @property
    def tags(self):
        return self._joined("tags", np.int32) if self.tagged else None

    @property
    def pages(self):
        return self._joined("pages", np.uint64)

    @property
    def ends(self):
        got = self._flat.get("ends")
        if got is None:
            at, parts = 0, []
            for c in self.chunks:
                parts.append(c.ends + np.uint64(at))
                at += len(c.addrs)
            got = self._flat["ends"] = np.concatenate(parts) if parts else np.zeros(0, np.uint64)
        return got

    def arrays(self):
        return [a for c in self.chunks for a in (c.addrs, c.tids, c.tags, c.pages, c.ends) if a is not None] + \
            [self.targets]

    def groups(self, pages):
        """[(the pages of ``pages`` (ascending) in a chunk, its addresses,
        its targets)] for clamor_reloc_set_words, chunk by chunk."""
        out = []
        for c in self.chunks:
            # (the pages within the chunk's span first: a search, not a pass over all)
            lo = int(np.searchsorted(pages, c.pages[0], side="left"))
            seg = pages[lo:int(np.searchsorted(pages, c.pages[-1], side="right"))]
            mine = seg[np.isin(seg, c.pages, assume_unique=True)] if len(seg) else seg
            if len(mine):
                out.append((mine, c.addrs, c.tids))
        return out

    def on(self, pages):
        """(addresses, targets) of the words on ``pages`` (ascending)."""
        pages = np.asarray(pages, dtype=np.uint64)
        got = [_on(c, pages) for c in self.chunks
               if np.searchsorted(pages, c.pages[0]) < np.searchsorted(pages, c.pages[-1], side="right")]
        if not got:
            return np.zeros(0, np.uint64), np.zeros(0, np.uint32)
        return np.concatenate([a for a, _ in got]), np.concatenate([t for _, t in got])

    def __len__(self):
        return sum(len(c.addrs) for c in self.chunks)


def _on(c, pages):
    """(addresses, targets) of chunk ``c``'s words on ``pages`` (ascending)."""
    k = np.searchsorted(c.pages, pages)
    hit = k < len(c.pages)
    hit[hit] = c.pages[k[hit]] == pages[hit]
    k = k[hit]
    ends = c.ends[k].astype(np.int64)
    starts = np.where(k > 0, c.ends[np.maximum(k - 1, 0)].astype(np.int64), 0)
    n = ends - starts
    idx = np.repeat(starts - np.concatenate([[0], np.cumsum(n)[:-1]]), n) + np.arange(int(n.sum()))
    return c.addrs[idx], c.tids[idx]


def _cut_words(addrs, tids, tags, pages, ends):
    """Words ordered by address, with their pages and where each page's
    words end, as chunks of whole pages, about ``CHUNK_WORDS`` words each
    (views: nothing is copied but the ends)."""
    if not len(pages):
        return []
    ends = np.asarray(ends, dtype=np.uint64)
    n = int(ends[-1])
    edges = np.unique(np.searchsorted(ends, np.arange(0, n, CHUNK_WORDS, dtype=np.uint64), side="right"))
    edges = [e for e in np.union1d(edges, [0]).tolist() if e < len(pages)] + [len(pages)]
    chunks = []
    for a, b in zip(edges, edges[1:]):
        w0, w1 = int(ends[a - 1]) if a else 0, int(ends[b - 1])
        chunks.append(_Chunk(addrs[w0:w1], tids[w0:w1], None if tags is None else tags[w0:w1], pages[a:b],
                             ends[a:b] - np.uint64(w0)))
    return chunks


def _splice(old, drop, new):
    """A recheck's words: the tagged Words ``old`` but those tagged in
    ``drop`` (ascending int32), with ``new`` (addresses, targets, tags; by
    address) merged in, in C (clamor_py_reloc_splice), chunk by chunk: a
    chunk that loses no word and gains none is kept as it is.  (Words with
    the targets unset, the pages of the words gone and come, ascending), or
    None if a new word's address is a kept one's.  ``_splice_reference`` is
    its reference."""
    na, nt, ng = (np.ascontiguousarray(x, dtype=d) for x, d in zip(new, (np.uint64, np.uint32, np.int32)))
    drop = np.ascontiguousarray(drop, dtype=np.int32)
    dropped = TagSet(drop)
    chunks = old.chunks or [None]
    at = np.maximum(np.searchsorted(old._firsts, _pages_of(na), side="right") - 1, 0) if old.chunks else \
        np.zeros(len(na), np.int64)
    cuts = np.searchsorted(at, np.arange(len(chunks) + 1))
    out, touched = [], []
    for i, c in enumerate(chunks):
        a, b = int(cuts[i]), int(cuts[i + 1])
        if c is not None and a == b and (not dropped.meets(c.tmin, c.tmax) or not dropped.hits(c.tags).any()):
            out.append(c)
            continue
        got = _splice_chunk(c, drop, na[a:b], nt[a:b], ng[a:b])
        if got is None:
            return None
        out += got[0]
        touched.append(got[1])
    touched = np.unique(np.concatenate(touched)) if touched else np.zeros(0, np.uint64)
    return Words.of_chunks(out, np.zeros(0, np.uint32), True), touched.astype(np.uint64)


def _splice_chunk(c, drop, na, nt, ng):
    """``_splice`` of one chunk (or None: no words yet): (its chunks now,
    the pages of the words gone and come), or None on a clash."""
    if c is None:
        a, t, g = np.zeros(0, np.uint64), np.zeros(0, np.uint32), np.zeros(0, np.int32)
    else:
        a, t, g = c.addrs, c.tids, c.tags
    out = ffi.new("struct clamor_relist *")
    rc = lib.clamor_py_reloc_splice(
        ffi.cast("const uint64_t *", a.ctypes.data), ffi.cast("const uint32_t *", t.ctypes.data),
        ffi.cast("const int32_t *", g.ctypes.data), len(a), ffi.cast("const int32_t *", drop.ctypes.data), len(drop),
        ffi.cast("const uint64_t *", na.ctypes.data), ffi.cast("const uint32_t *", nt.ctypes.data),
        ffi.cast("const int32_t *", ng.ctypes.data), len(na), out)
    if rc == errno.EEXIST:
        return None
    if rc:
        raise MemoryError("no memory for the relocation words")
    n = out.n
    addrs, tids, tags = _owned(out.addrs, n, np.uint64), _owned(out.tids, n, np.uint32), _owned(out.tags, n, np.int32)
    touched = _owned(out.bad, out.nbad, np.uint64)
    return _cut_words(addrs, tids, tags, _owned(out.pages, out.npages, np.uint64),
                      _owned(out.ends, out.npages, np.uint64)), touched


def _splice_reference(old, drop, new):
    """``_splice`` in numpy: ((addresses, targets, tags), touched pages), or None."""
    addrs, tids, tags = old
    new_addrs, new_tids, new_tags = new
    gone = np.isin(tags, drop)
    ka, kt, kg = addrs[~gone], tids[~gone], tags[~gone]
    at = np.searchsorted(ka, new_addrs)
    if len(ka) and (ka[np.minimum(at, len(ka) - 1)] == new_addrs).any():
        return None
    merged = np.insert(ka, at, new_addrs), np.insert(kt, at, new_tids), np.insert(kg, at, new_tags)
    return merged, np.union1d(_pages_of(addrs[gone]), _pages_of(new_addrs)).astype(np.uint64)


def _match_reference(ext, strict, nulls, t, amap=None, tags=None, null_tags=None):
    """``_match``'s reference, in numpy over clamor_py_match_all: (found,
    bad) as ``_match`` gives them."""
    tlo, thi, tid, nt = t.ranges()
    if amap is None:
        amap = _pyshare.AddressMap()
    ext = np.ascontiguousarray(ext, dtype=np.uint64)
    strict = np.ascontiguousarray(strict, dtype=np.uint8)
    at, ids, which = bytearray(), bytearray(), bytearray()
    rc = lib.clamor_py_match_all(ffi.cast("const uint64_t *", ext.ctypes.data),
                                 ffi.cast("const uint8_t *", strict.ctypes.data), len(ext), tlo, thi, tid, nt,
                                 amap.private, amap.nprivate, id(at), id(ids), id(which) if tags is not None else 0)
    if rc:
        raise MemoryError("no memory to list the relocations")
    at = np.frombuffer(at, dtype=np.uint64)
    ids = np.frombuffer(ids, dtype=np.uint32)
    nulls = np.asarray(nulls, dtype=np.uint64)
    none = ids == lib.CLAMOR_NO_TARGET
    bad = at[none]
    if len(bad):
        bad = bad[~np.isin(bad, nulls)]
    addrs = np.concatenate([nulls, at[~none]])
    tids = np.concatenate([np.zeros(len(nulls), np.uint32), ids[~none]])
    addrs, first = _unique_first(addrs)     # (a null word first, then the first extent's)
    word_tags = None
    if tags is not None:
        at_tags = np.asarray(tags, dtype=np.int32)[np.frombuffer(which, dtype=np.uint32)]
        word_tags = np.concatenate([np.asarray(null_tags, dtype=np.int32), at_tags[~none]])[first]
    return (addrs, tids[first], word_tags), bad


def _unique_first(addrs):
    """np.unique(addrs, return_index=True) of word addresses, by a radix
    sort (clamor_py_sort_words): the sorted unique addresses, and where
    each first occurs in ``addrs``."""
    addrs = np.ascontiguousarray(addrs, dtype=np.uint64)
    order = np.empty(len(addrs), dtype=np.uint32)
    if lib.clamor_py_sort_words(ffi.cast("const uint64_t *", addrs.ctypes.data), len(addrs),
                                ffi.cast("uint32_t *", order.ctypes.data)):
        raise MemoryError("no memory to sort the relocation words")
    s = addrs[order]
    first = np.ones(len(s), dtype=bool)
    first[1:] = s[1:] != s[:-1]
    return s[first], order[first].astype(np.int64)


def _entries(mode, t, amap=None):
    """The walk's relocation words (``Words``), from its extents."""
    if mode.found is None:
        ext = np.array([(lo, n) for lo, n, *_ in mode.extents], dtype=np.uint64).reshape(-1, 2)
        strict = np.array([s for _, _, s, *_ in mode.extents], dtype=np.uint8)
        mode.found, bad, mode.words = _match(ext, strict, mode.null_words, t, amap or mode.amap)
        if len(bad):
            a = int(bad[0])
            lo, n, _, path, what = next(e for e in mode.extents if e[2] and e[0] <= a < e[0] + e[1])
            word = int(ffi.cast("uintptr_t *", a)[0])
            raise NotShareable(f"{path}: its {what} holds at byte {a - lo} a pointer ({word:#x}) into "
                               f"this process's private memory outside the region, which a worker not "
                               f"forked from the driver cannot follow (a weak reference, a cached "
                               f"buffer, memory a library allocated outside clamor.heap())")
    if mode.words is None:
        mode.words = Words(*mode.found[:2], tags=mode.found[2])
    if mode.keyed and not np.isin(sorted(mode.keyed), mode.words.targets).all():
        # (no word names a class's "classkeys" target: the workers bind it all the same)
        mode.words.targets = np.union1d(mode.words.targets, sorted(mode.keyed)).astype(np.uint32)
    return mode.words


def _page_entries(words):
    """{page: entries as bytes} of ``words``, as clamor_reloc_set_words
    makes them now (the tests' reference)."""
    return _by_page(words.addrs, words.tids)


def _pages_of(addrs):
    return (addrs - np.uint64(region.base())) >> np.uint64((region.page_size() - 1).bit_length())


def _by_page(addrs, tids):
    """{page: entries as bytes} of the words ``addrs`` (ascending) naming
    targets ``tids``, the words' values read now: the lists
    clamor_reloc_set_words makes, in numpy (the tests' reference)."""
    pages = _pages_of(addrs)
    cuts = np.flatnonzero(np.diff(pages)) + 1
    lo = np.concatenate([[0], cuts]).astype(np.int64) if len(addrs) else np.zeros(0, np.int64)
    hi = np.append(lo[1:], len(addrs)).astype(np.int64)
    off = addrs - np.uint64(region.base())
    rec = np.empty(len(addrs), dtype=_ENTRY)
    rec["w"] = (off & np.uint64(region.page_size() - 1)) >> np.uint64(3)
    rec["t"] = tids
    rec["v"] = _words(off)
    return {int(page): rec[a:b].tobytes() for page, a, b in zip(pages[lo].tolist(), lo.tolist(), hi.tolist())}


def _words(off):
    """The region's words at the byte offsets ``off`` (8-aligned), as they are now."""
    view = np.frombuffer(ffi.buffer(ffi.cast("char *", region.base()), region.size()), dtype=np.uint64)
    return view[off >> np.uint64(3)]

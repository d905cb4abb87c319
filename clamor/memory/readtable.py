"""What a walk's verdict rests on: the region bytes it read pointers from,
per page, with each page's digest (``ReadTable``), so that the Cluster
walks again only when a byte it read changed, and only what changed
(``walk.recheck``).
"""
import errno

import numpy as np

from .._native import ffi, lib
from .._native import owned_array as _owned
from . import region

# A table is kept in blocks of whole pages, about this many ranges each: a
# change rebuilds the blocks it lands on and shares the others with the
# table before it (a change to one entry of millions costs a few blocks).
BLOCK_RANGES = 1 << 16


class TagSet:
    """Tags (int32) to find among many: a table of the span they cover,
    so that a test of n tags costs a pass over them and no sort (the
    entries a recheck walks again, looked for in each block and chunk)."""

    __slots__ = ("lo", "hi", "table", "sorted")

    def __init__(self, tags):
        tags = np.asarray(tags, dtype=np.int64)
        self.sorted = np.unique(tags)
        self.lo, self.hi = (int(tags.min()), int(tags.max())) if len(tags) else (0, -1)
        self.table = np.zeros(max(self.hi - self.lo + 1, 0), dtype=bool)
        self.table[tags - self.lo] = True

    def hits(self, tags):
        """A bool per tag of ``tags``: is it one of these?"""
        inside = (tags >= self.lo) & (tags <= self.hi)
        out = np.zeros(len(tags), dtype=bool)
        out[inside] = self.table[tags[inside].astype(np.int64) - self.lo]
        return out

    def meets(self, tmin, tmax):
        """Is one of these from ``tmin`` to ``tmax``?  (Tags there might
        include it; none there, none can.)"""
        i = int(np.searchsorted(self.sorted, tmin))
        return i < len(self.sorted) and int(self.sorted[i]) <= tmax


class _Block:
    """Consecutive pages of a table: ``ranges`` (k, 2), ``tags`` (k) or
    None, ``pages`` (m), ``starts`` (m + 1, into ``ranges``), ``digests``
    (m, 2); and the least and greatest tag.  Never changed once made:
    tables share blocks."""

    __slots__ = ("ranges", "tags", "pages", "starts", "digests", "tmin", "tmax", "_own")

    def __init__(self, ranges, tags, pages, starts, digests):
        self.ranges, self.tags, self.pages, self.starts, self.digests = ranges, tags, pages, starts, digests
        for a in (ranges, tags, pages, starts, digests):
            if a is not None:
                a.flags.writeable = False
        self.tmin = int(tags.min()) if tags is not None and len(tags) else 0
        self.tmax = int(tags.max()) if tags is not None and len(tags) else -1
        self._own = None

    def own(self):
        """The ranges tagged -1 (the root's own bytes), in order."""
        if self._own is None:
            self._own = self.ranges[self.tags < 0] if self.tmin < 0 else self.ranges[:0]
        return self._own

    def page_index(self):
        """The page of each range."""
        return np.repeat(self.pages, np.diff(self.starts).astype(np.int64))


class ReadTable:
    """What a walk's verdict rests on: the region bytes it read pointers
    from, per page, with each page's digest.  A verdict depends on those
    bytes only (reference counts and the collector's links are not among
    them), so a page the driver changed whose ranges read the same needs
    no new walk.  Read as whole arrays: ``ranges``, an (n, 2) uint64 array
    of (start, length), ordered by page (in the walk's order within one);
    ``pages``: the pages, ascending; page ``pages[i]`` holds
    ``ranges[starts[i]:starts[i + 1]]``; ``digests``: an (m, 2) uint64
    array, one per page (csrc/pyrecheck.c).  ``tags`` (a walk of a dict's
    or list's entries, or None): an int32 per range, the entry it was
    reached through (-1: the root's own).  Kept in blocks of pages
    (``BLOCK_RANGES``); ``updated`` makes the blocks a change lands on
    anew.  About 16 bytes a range (20 tagged) and 32 a page."""

    __slots__ = ("blocks", "tagged", "_firsts", "_pofs", "_flat")

    def __init__(self, ranges, tags=None, skip=None):
        ranges = np.ascontiguousarray(ranges, dtype=np.uint64).reshape(-1, 2)
        tags = None if tags is None else np.ascontiguousarray(tags, dtype=np.int32)
        skip = None if skip is None else np.ascontiguousarray(skip, dtype=np.uint8)
        out = ffi.new("struct clamor_pagesort *")
        rc = lib.clamor_py_sort_by_page(ffi.cast("const uint64_t *", ranges.ctypes.data),
                                        ffi.NULL if tags is None else ffi.cast("const int32_t *", tags.ctypes.data),
                                        ffi.NULL if skip is None else ffi.cast("const uint8_t *", skip.ctypes.data),
                                        len(ranges), out)
        if rc == errno.ENOMEM:
            raise MemoryError("no memory for the read table")
        if rc:      # (a range outside the region: numpy orders it as well)
            keep = slice(None) if skip is None else skip == 0
            flat = _order_reference(ranges[keep], None if tags is None else tags[keep])
        else:
            flat = (_owned(out.ranges, 2 * out.n, np.uint64).reshape(-1, 2),
                    None if tags is None else _owned(out.tags, out.n, np.int32),
                    _owned(out.pages, out.npages, np.uint64),
                    _owned(out.starts, out.npages + 1, np.uint64) if out.n else np.zeros(1, np.uint64))
        r, g, p, s = flat
        self._set(_cut(r, g, p, s, _digest(r, s, np.arange(len(p), dtype=np.uint64))), tags is not None)

    @classmethod
    def from_arrays(cls, ranges, tags, pages, starts, digests):
        """A table of whole arrays as ``ReadTable`` reads them (ordered by
        page; ``digests`` those of the bytes now)."""
        t = cls.__new__(cls)
        t._set(_cut(ranges, tags, pages, starts, digests), tags is not None)
        return t

    def _set(self, blocks, tagged):
        self.blocks, self.tagged, self._flat = blocks, tagged, {}
        self._firsts = np.array([int(b.pages[0]) for b in blocks], dtype=np.uint64)
        self._pofs = np.cumsum([0] + [len(b.pages) for b in blocks]).astype(np.int64)

    def _joined(self, name, empty):
        got = self._flat.get(name)
        if got is None:
            parts = [getattr(b, name) for b in self.blocks]
            got = parts[0] if len(parts) == 1 else np.concatenate(parts) if parts else empty
            self._flat[name] = got
        return got

    @property
    def ranges(self):
        return self._joined("ranges", np.zeros((0, 2), np.uint64))

    @property
    def tags(self):
        return self._joined("tags", np.zeros(0, np.int32)) if self.tagged else None

    @property
    def pages(self):
        return self._joined("pages", np.zeros(0, np.uint64))

    @property
    def digests(self):
        return self._joined("digests", np.zeros((0, 2), np.uint64))

    @property
    def starts(self):
        got = self._flat.get("starts")
        if got is None:
            at, parts = 0, []
            for b in self.blocks:
                parts.append(b.starts[:-1] + np.uint64(at))
                at += len(b.ranges)
            got = np.concatenate(parts + [np.array([at], np.uint64)])
            self._flat["starts"] = got
        return got

    def __len__(self):
        return int(self._pofs[-1])

    def nbytes(self):
        return sum(b.ranges.nbytes + b.pages.nbytes + b.starts.nbytes + b.digests.nbytes +
                   (b.tags.nbytes if b.tags is not None else 0) for b in self.blocks)

    def own_ranges(self):
        """The ranges tagged -1 (the root's own bytes), in table order."""
        parts = [b.own() for b in self.blocks]
        return np.concatenate(parts) if parts else np.zeros((0, 2), np.uint64)

    def _located(self, pages):
        """For ``pages`` (ascending unique uint64): [(block number,
        indices into its pages)] of those in the table."""
        idx = self._index(pages)
        if not len(idx):
            return []
        which = np.searchsorted(self._pofs, idx, side="right") - 1
        cut = np.flatnonzero(np.r_[True, which[1:] != which[:-1]])
        return [(int(which[a]), idx[a:b] - self._pofs[which[a]])
                for a, b in zip(cut.tolist(), cut[1:].tolist() + [len(idx)])]

    def changed_pages(self, pages):
        """The pages of ``pages`` (ascending unique uint64) whose ranges read
        otherwise now."""
        hit = []
        for k, i in self._located(pages):
            b = self.blocks[k]
            hit.append(b.pages[i[(_digest(b.ranges, b.starts, i.astype(np.uint64)) != b.digests[i]).any(axis=1)]])
        return np.concatenate(hit) if hit else np.zeros(0, np.uint64)

    def _index(self, pages):
        mine = self.pages
        if not len(pages) or not len(mine):
            return np.zeros(0, np.int64)
        idx = np.searchsorted(mine, pages)
        ok = idx < len(mine)
        idx, pages = idx[ok], pages[ok]
        return idx[mine[idx] == pages]

    def tags_on(self, pages):
        """The tags of the ranges on ``pages`` (ascending unique uint64)."""
        parts = [self.blocks[k].tags[int(self.blocks[k].starts[i]):int(self.blocks[k].starts[i + 1])]
                 for k, idx in self._located(pages) for i in idx.tolist()]
        return np.unique(np.concatenate(parts)) if parts else np.zeros(0, np.int32)

    def updated(self, drop, ranges, tags, touched):
        """This table with the ranges tagged in ``drop`` (ascending int32)
        replaced by ``ranges`` (tagged ``tags``); the pages in ``touched``
        (ascending) and those ranges come and go on are digested again, the
        others' digests kept.  Only the blocks those pages lie in are made
        anew (``updated_reference`` is the same on whole arrays)."""
        if not self.tagged:
            raise ValueError("only a tagged read table is updated by entry")
        drop = np.asarray(drop, dtype=np.int32)
        ranges = np.asarray(ranges, dtype=np.uint64).reshape(-1, 2)
        tags = np.asarray(tags, dtype=np.int32)
        new_p = _page_of(ranges)
        order = np.argsort(new_p, kind="stable")
        ranges, tags, new_p = ranges[order], tags[order], new_p[order]
        touched = np.asarray(touched, dtype=np.uint64)
        nb = len(self.blocks)
        work = {}       # block -> [gone mask or None, new ranges' indices]
        dropped = TagSet(drop)
        for k, b in enumerate(self.blocks):
            if not dropped.meets(b.tmin, b.tmax):
                continue
            gone = dropped.hits(b.tags)
            if gone.any():
                work[k] = [gone, None]
        if nb:
            at = np.maximum(np.searchsorted(self._firsts, new_p, side="right") - 1, 0)
            cut = np.flatnonzero(np.r_[True, at[1:] != at[:-1]]) if len(at) else np.zeros(0, np.int64)
            for a, e in zip(cut.tolist(), cut[1:].tolist() + [len(at)]):
                work.setdefault(int(at[a]), [None, None])[1] = np.arange(a, e)
            for k, _ in self._located(touched):
                work.setdefault(k, [None, None])
        elif len(ranges):
            work[0] = [None, np.arange(len(ranges))]
        blocks = []
        for k in range(max(nb, 1 if work else 0)):
            if k not in work:
                if k < nb:
                    blocks.append(self.blocks[k])
                continue
            gone, new = work[k]
            old = self.blocks[k] if k < nb else None
            blocks += _remade(old, gone, ranges[new] if new is not None else ranges[:0],
                              tags[new] if new is not None else tags[:0],
                              new_p[new] if new is not None else new_p[:0], touched)
        t = ReadTable.__new__(ReadTable)
        t._set(blocks, self.tagged)
        return t

    def changed(self, pages):
        """Does a page of ``pages`` (ascending unique uint64) read otherwise
        now where the walk read it?"""
        return bool(len(self.changed_pages(pages)))


def _digest(ranges, starts, which):
    """The digests of the pages ``which`` (uint64 indices) of ranges cut by ``starts``."""
    out = np.empty((len(which), 2), dtype=np.uint64)
    if len(which):
        ranges, starts = np.ascontiguousarray(ranges), np.ascontiguousarray(starts)
        which = np.ascontiguousarray(which, dtype=np.uint64)
        lib.clamor_py_digest_runs(ffi.cast("const uint64_t *", ranges.ctypes.data),
                                  ffi.cast("const uint64_t *", starts.ctypes.data),
                                  ffi.cast("const uint64_t *", which.ctypes.data), len(which),
                                  ffi.cast("uint64_t *", out.ctypes.data))
    return out


def _cut(ranges, tags, pages, starts, digests):
    """Whole arrays of a table as blocks of whole pages, about
    ``BLOCK_RANGES`` ranges each (views: nothing is copied but the starts)."""
    if not len(pages):
        return []
    starts = np.asarray(starts, dtype=np.uint64)
    n = int(starts[-1])
    edges = np.unique(np.searchsorted(starts, np.arange(0, n, BLOCK_RANGES, dtype=np.uint64), side="right") - 1)
    edges = np.union1d(edges, [0]).tolist() + [len(pages)]
    blocks = []
    for a, b in zip(edges, edges[1:]):
        if a >= b:
            continue
        r0, r1 = int(starts[a]), int(starts[b])
        blocks.append(_Block(ranges[r0:r1], None if tags is None else tags[r0:r1], pages[a:b],
                             starts[a:b + 1] - np.uint64(r0), digests[a:b]))
    return blocks


def _remade(old, gone, ranges, tags, new_p, touched):
    """Block ``old`` (or None: the table had none) with the ranges where
    ``gone`` (or None) left out and ``ranges`` (tagged ``tags``, on pages
    ``new_p``, ascending) put in after those of their page; the pages of
    ``touched``, of the ranges gone and of those new digested again.  As
    blocks (none, if no range is left)."""
    if old is None:
        page, kr, kt, was_p, was_d = new_p[:0], ranges[:0], tags[:0], new_p[:0], np.zeros((0, 2), np.uint64)
        gone_p = page
    else:
        page = old.page_index()
        keep = slice(None) if gone is None else ~gone
        kr, kt = old.ranges[keep], old.tags[keep]
        gone_p = page[gone] if gone is not None else page[:0]
        page, was_p, was_d = page[keep], old.pages, old.digests
    at = np.searchsorted(page, new_p, side="right")
    r = np.insert(_as_items(kr), at, _as_items(ranges)).view(np.uint64).reshape(-1, 2)
    g = np.insert(kt, at, tags)
    pg = np.insert(page, at, new_p)
    first = np.flatnonzero(np.r_[True, pg[1:] != pg[:-1]]) if len(pg) else np.zeros(0, np.int64)
    pages = pg[first]
    starts = np.append(first, len(pg)).astype(np.uint64)
    digests = np.empty((len(pages), 2), dtype=np.uint64)
    redo = np.isin(pages, np.concatenate([touched, gone_p, new_p]))
    if len(was_p):
        was = np.minimum(np.searchsorted(was_p, pages), len(was_p) - 1)
        known = (was_p[was] == pages) & ~redo
        digests[known] = was_d[was[known]]
    else:
        known = np.zeros(len(pages), bool)
    digests[~known] = _digest(r, starts, np.flatnonzero(~known).astype(np.uint64))
    return _cut(r, g, pages, starts, digests)


def _order_reference(ranges, tags):
    """The ranges by page, stably, in numpy (clamor_py_sort_by_page's
    reference): (ranges, tags, pages, starts)."""
    page = _page_of(ranges)
    order = np.argsort(page, kind="stable")
    ranges = np.ascontiguousarray(ranges[order])
    tags = None if tags is None else np.ascontiguousarray(tags[order])
    page = page[order]
    first = np.flatnonzero(np.r_[True, page[1:] != page[:-1]]) if len(page) else np.zeros(0, np.int64)
    return ranges, tags, page[first], np.append(first, len(order)).astype(np.uint64)


def updated_reference(table, drop, ranges, tags, touched):
    """``ReadTable.updated`` on whole arrays, in numpy (its reference for
    the differential tests)."""
    page = _page_of(table.ranges)
    gone = np.flatnonzero(np.isin(table.tags, drop))
    new_p = _page_of(ranges)
    order = np.argsort(new_p, kind="stable")
    ranges, tags, new_p = ranges[order], tags[order], new_p[order]
    keep = np.ones(len(page), bool)
    keep[gone] = False
    at = np.searchsorted(page[keep], new_p, side="right")
    r = np.insert(_as_items(table.ranges)[keep], at, _as_items(ranges)).view(np.uint64).reshape(-1, 2)
    g = np.insert(table.tags[keep], at, tags)
    pg = np.insert(page[keep], at, new_p)
    first = np.flatnonzero(np.r_[True, pg[1:] != pg[:-1]]) if len(pg) else np.zeros(0, np.int64)
    pages = pg[first]
    starts = np.append(first, len(pg)).astype(np.uint64)
    r = np.ascontiguousarray(r)
    digests = np.empty((len(pages), 2), dtype=np.uint64)
    redo = np.isin(pages, np.concatenate([touched, page[gone], new_p]))
    old = table.pages
    if len(old):
        was = np.minimum(np.searchsorted(old, pages), len(old) - 1)
        known = (old[was] == pages) & ~redo
        digests[known] = table.digests[was[known]]
    else:
        known = np.zeros(len(pages), bool)
    digests[~known] = _digest(r, starts, np.flatnonzero(~known).astype(np.uint64))
    return ReadTable.from_arrays(r, np.ascontiguousarray(g), pages, starts, digests)


def _as_items(ranges):
    return np.ascontiguousarray(ranges).view(np.dtype((np.void, 16))).ravel()


def _page_of(ranges):
    if not len(ranges):
        return np.zeros(0, np.uint64)
    return (ranges[:, 0] - np.uint64(region.base())) >> np.uint64(region.page_size().bit_length() - 1)


def _split(extents):
    """(start, length, ...) tuples as an (n, 2) uint64 array, each range
    split at page boundaries."""
    arr = np.array([(lo, n) for lo, n, *_ in extents if n], dtype=np.uint64).reshape(-1, 2)
    if not len(arr):
        return arr
    base, ps = np.uint64(region.base()), np.uint64(region.page_size())
    lo, end = arr[:, 0], arr[:, 0] + arr[:, 1]
    first, last = (lo - base) // ps, (end - np.uint64(1) - base) // ps
    k = (last - first + np.uint64(1)).astype(np.int64)
    if (k == 1).all():
        return arr
    page = np.repeat(first, k) + (np.arange(k.sum()) - np.repeat(np.cumsum(k) - k, k)).astype(np.uint64)
    seg_lo = np.maximum(np.repeat(lo, k), base + page * ps)
    seg_hi = np.minimum(np.repeat(end, k), base + (page + np.uint64(1)) * ps)
    return np.stack([seg_lo, seg_hi - seg_lo], axis=1)


def read_digests(extents, plain=None, tags=None, skip=None):
    """The ``ReadTable`` of a walk: ``extents``, (start, length, ...)
    tuples, and ``plain``, more of them as an (n, 2) uint64 array already
    split at page boundaries (the C walk's, csrc/pyextents.c), tagged by
    ``tags`` when there are no others; ``skip`` (with ``plain`` alone): a
    byte per range, nonzero for one left out."""
    split = _split(extents)
    if plain is None or not len(plain):
        ranges = split
    else:
        plain = np.asarray(plain, dtype=np.uint64).reshape(-1, 2)
        ranges = np.concatenate([split, plain]) if len(split) else plain     # (a walk's millions: no copy)
    if skip is not None and len(skip) != len(ranges):
        raise ValueError("skip needs a byte per range")
    return ReadTable(ranges, tags if tags is not None and len(tags) == len(ranges) else None, skip=skip)


def pages_array(pages):
    """Page indices (any iterable or array) as an ascending unique uint64 array."""
    return np.unique(np.asarray(pages if isinstance(pages, np.ndarray) else list(pages), dtype=np.uint64))


def union_equal(a, b):
    """Do the (n, 2) range arrays ``a`` and ``b`` hold the same ranges?"""
    return len(a) == len(b) and bool((np.sort(_as_items(a)) == np.sort(_as_items(b))).all())

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


class ReadTable:
    """What a walk's verdict rests on: the region bytes it read pointers
    from, per page, with each page's digest.  A verdict depends on those
    bytes only (reference counts and the collector's links are not among
    them), so a page the driver changed whose ranges read the same needs
    no new walk.  ``ranges``: an (n, 2) uint64 array of (start, length),
    ordered by page (in the walk's order within one); ``pages``: the pages,
    ascending; page ``pages[i]`` holds ``ranges[starts[i]:starts[i + 1]]``;
    ``digests``: an (m, 2) uint64 array, one per page (csrc/pyrecheck.c).
    ``tags`` (a walk of a dict's or list's entries, or None): an int32 per
    range, the entry it was reached through (-1: the root's own).  About
    16 bytes a range (20 tagged) and 32 a page."""

    __slots__ = ("ranges", "pages", "starts", "digests", "tags")

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
            self._order(ranges[keep], None if tags is None else tags[keep])
        else:
            self.ranges = _owned(out.ranges, 2 * out.n, np.uint64).reshape(-1, 2)
            self.tags = None if tags is None else _owned(out.tags, out.n, np.int32)
            self.pages = _owned(out.pages, out.npages, np.uint64)
            self.starts = _owned(out.starts, out.npages + 1, np.uint64) if out.n else np.zeros(1, np.uint64)
        self.digests = self._digests(np.arange(len(self.pages), dtype=np.uint64))

    def _order(self, ranges, tags):
        """The ranges by page, stably, in numpy (clamor_py_sort_by_page's reference)."""
        page = _page_of(ranges)
        order = np.argsort(page, kind="stable")
        self.ranges = np.ascontiguousarray(ranges[order])
        self.tags = None if tags is None else np.ascontiguousarray(tags[order])
        page = page[order]
        first = np.flatnonzero(np.r_[True, page[1:] != page[:-1]]) if len(page) else np.zeros(0, np.int64)
        self.pages = page[first]
        self.starts = np.append(first, len(order)).astype(np.uint64)

    def __len__(self):
        return len(self.pages)

    def nbytes(self):
        return self.ranges.nbytes + self.pages.nbytes + self.starts.nbytes + self.digests.nbytes + \
            (self.tags.nbytes if self.tags is not None else 0)

    def changed_pages(self, pages):
        """The pages of ``pages`` (ascending unique uint64) whose ranges read
        otherwise now."""
        idx = self._index(pages)
        return self.pages[idx[(self._digests(idx.astype(np.uint64)) != self.digests[idx]).any(axis=1)]]

    def _index(self, pages):
        if not len(pages) or not len(self.pages):
            return np.zeros(0, np.int64)
        idx = np.searchsorted(self.pages, pages)
        ok = idx < len(self.pages)
        idx, pages = idx[ok], pages[ok]
        return idx[self.pages[idx] == pages]

    def tags_on(self, pages):
        """The tags of the ranges on ``pages`` (ascending unique uint64)."""
        idx = self._index(pages)
        if not len(idx):
            return np.zeros(0, np.int32)
        return np.unique(np.concatenate([self.tags[int(self.starts[i]):int(self.starts[i + 1])] for i in idx]))

    def updated(self, drop, ranges, tags, touched):
        """This table with the ranges tagged in ``drop`` replaced by
        ``ranges`` (tagged ``tags``); the pages in ``touched`` (ascending)
        and those ranges come and go on are digested again, the others'
        digests kept.  (A few ranges replaced in millions cost a copy, not
        a sort.)"""
        page = _page_of(self.ranges)
        gone = np.flatnonzero(np.isin(self.tags, drop))
        new_p = _page_of(ranges)
        order = np.argsort(new_p, kind="stable")
        ranges, tags, new_p = ranges[order], tags[order], new_p[order]
        keep = np.ones(len(page), bool)
        keep[gone] = False
        at = np.searchsorted(page[keep], new_p, side="right")
        # (a range as one 16-byte item: numpy copies those fast, pairs slowly)
        r = np.insert(_as_items(self.ranges)[keep], at, _as_items(ranges)).view(np.uint64).reshape(-1, 2)
        g = np.insert(self.tags[keep], at, tags)
        pg = np.insert(page[keep], at, new_p)
        t = ReadTable.__new__(ReadTable)
        t.ranges, t.tags = np.ascontiguousarray(r), np.ascontiguousarray(g)
        first = np.flatnonzero(np.r_[True, pg[1:] != pg[:-1]]) if len(pg) else np.zeros(0, np.int64)
        t.pages = pg[first]
        t.starts = np.append(first, len(pg)).astype(np.uint64)
        t.digests = np.empty((len(t.pages), 2), dtype=np.uint64)
        redo = np.isin(t.pages, np.concatenate([touched, page[gone], new_p]))
        if len(self.pages):
            was = np.minimum(np.searchsorted(self.pages, t.pages), len(self.pages) - 1)
            known = (self.pages[was] == t.pages) & ~redo
            t.digests[known] = self.digests[was[known]]
        else:
            known = np.zeros(len(t.pages), bool)
        t.digests[~known] = t._digests(np.flatnonzero(~known).astype(np.uint64))
        return t

    def _digests(self, which):
        out = np.empty((len(which), 2), dtype=np.uint64)
        if len(which):
            lib.clamor_py_digest_runs(ffi.cast("const uint64_t *", self.ranges.ctypes.data),
                                      ffi.cast("const uint64_t *", self.starts.ctypes.data),
                                      ffi.cast("const uint64_t *", which.ctypes.data), len(which),
                                      ffi.cast("uint64_t *", out.ctypes.data))
        return out

    def changed(self, pages):
        """Does a page of ``pages`` (ascending unique uint64) read otherwise
        now where the walk read it?"""
        return bool(len(self.changed_pages(pages)))


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

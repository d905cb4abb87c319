"""Page versions, kept once for every driver (a Cluster, clamor.dask) and
changed once for every worker.

DESIGN.  The driver numbers its page versions with the region's stage
counter.  ``VersionKeeper.begin`` ends the driver's epoch: pages written
since the last version are versioned, and the list of those whose bytes
changed is kept under the new version, for workers that move between
versions (in either direction: a lineage re-run goes back).  Each begin
also tells the two caches that rest on region bytes what changed: the
relocation lists (clamor/memory/portable.py) and the verdicts of the
checks before a stage (clamor/runtime/serialize.py).  ``keep`` frees the
versions no reader needs; which ones a reader needs is the caller's
policy (a Cluster's running attempts and lineage, Dask's scheduler).

A worker changes version with ``change_version``: it lets go of the
region objects whose pages change, drops those pages and tags its page
requests with the new version.  A worker that runs tasks on several
threads (a Dask worker) runs those of one version at a time, through a
``VersionGate``; a Cluster's worker runs one task at a time and changes
version before each.
"""
import bisect
import gc
import threading
import time

import numpy as np

from .. import errors
from ..memory import portable, region, samehost
from . import serialize
from .._native import lib

MOVED = int(lib.CLAMOR_INVAL_MOVED)     # (a page index's flag: moved, unchanged; csrc/binding.h)


class VersionKeeper:
    """The driver's page versions and the pages changed at each.

    ``moves``: also keep, per version, the pages that kept their bytes but
    moved in the driver's memfd (for workers that map the driver's pages).
    Not thread-safe: a caller with threads holds its own lock."""

    def __init__(self, moves=False):
        self.changes = {}     # version -> the pages changed as it began
        self.moves = {} if moves else None   # version -> pages moved unchanged as it began
        self.newest = None    # the newest version whose bytes differ from the one before

    def begin(self, relocated=None, always=False):
        """Begin a version and return its number.  ``relocated``: pages
        whose relocation lists changed at it (workers drop them as if
        changed).  Its list is kept if pages changed, or ``always``."""
        sid = region.version_current() + 1
        changed = region.version_begin(sid)
        if changed.size:
            portable.driver().note_changed(changed)   # (a root whose bytes changed is walked again)
            serialize.note_changed(changed)           # share()'s verdicts that rest on what changed
        if relocated is not None and relocated.size:
            changed = np.union1d(changed, relocated).astype(np.uint64)
        if changed.size or always or self.newest is None:
            self.changes[sid] = changed
            self.newest = sid
        if self.moves is not None:
            moved = samehost.moved()
            if moved.size:
                self.moves[sid] = moved
        return sid

    def changed_between(self, a, b):
        """The pages changed at the versions after the lower of ``a`` and
        ``b`` up to the higher (a uint64 ndarray)."""
        lo, hi = sorted((int(a), int(b)))
        parts = [ch for s, ch in self.changes.items() if lo < s <= hi]
        if not parts:
            return np.empty(0, dtype=np.uint64)
        return parts[0] if len(parts) == 1 else np.unique(np.concatenate(parts))

    def invalidations(self, a, b, maps=False):
        """What a worker drops between versions ``a`` and ``b``: the pages
        changed, and for one that maps the driver's pages (``maps``) those
        that only moved, each with CLAMOR_INVAL_MOVED set: it drops those
        only where it maps the driver's copy (a copy of its own, fetched
        and relocated, holds the same bytes).  A uint64 ndarray."""
        changed = self.changed_between(a, b)
        if not maps or self.moves is None:
            return changed
        lo, hi = sorted((int(a), int(b)))
        parts = [mv for s, mv in self.moves.items() if lo < s <= hi]
        if not parts:
            return changed
        moved = np.setdiff1d(np.unique(np.concatenate(parts)), changed).astype(np.uint64)
        both = np.concatenate([changed.astype(np.uint64), moved])
        order = np.argsort(both, kind="stable")      # (ascending, so that the worker drops runs)
        return (both | np.concatenate([np.zeros(len(changed), np.uint64),
                                       np.full(len(moved), MOVED, np.uint64)]))[order]

    def keep(self, versions, floor=None):
        """Keep only the page versions of ``versions``; ``floor``: the
        lowest a reader that maps the driver's pages may still read at
        (default: the lowest kept).  Returns them, sorted."""
        keep = sorted(versions)
        samehost.map_floor(keep[0] if floor is None else floor)
        region.versions_keep(keep)
        # (pages rewritten at every version move to their next copy now, in
        # runs, into the locations just freed: the driver's writes skip the fault)
        region.log_ahead()
        portable.driver().prune(keep[0])
        return keep

    def trim(self, bounds):
        """Changed-page lists are asked for between two versions, each one
        of ``bounds`` (no other can become one later): lists of versions
        with no bound between them are merged, those at or below the lowest
        bound dropped."""
        bounds = sorted(bounds)

        def trim(lists):
            merged = {}
            for s, ch in lists.items():
                if s > bounds[0]:
                    merged.setdefault(bounds[bisect.bisect_left(bounds, s)], []).append(ch)
            return {b: chs[0] if len(chs) == 1 else np.unique(np.concatenate(chs)) for b, chs in merged.items()}

        self.changes = trim(self.changes)
        if self.moves is not None:
            self.moves = trim(self.moves)


def change_version(version, pages, release=None):
    """Worker: move to page version ``version``.  ``release`` (if given)
    first lets go of the region objects this process references, whose
    pages may change; then ``pages`` (page indices, as the driver listed
    them) are dropped and page requests carry ``version``."""
    region.sweep_dead()
    if release is not None:
        release()
    if len(pages):
        region.invalidate(pages, version=version)   # (one step: see clamor_change_version)
    else:
        region.set_version(version)


class VersionGate:
    """Worker: tasks of one version at a time, on threads of its own; the
    version changes (``change_version``) when none runs, in the order
    versions were asked for.  ``changes(lo, hi)``: the pages changed between
    two versions (the driver's answer).  ``resolved``: a task used a region
    object since the last change (the next one first frees the cycles that
    may hold such objects)."""

    def __init__(self, changes, version, on_switch=None):
        self.changes = changes
        self.on_switch = on_switch    # called at each change of version, first (relocation targets)
        self.resolved = False         # a region object was used since the last change
        self.current = int(version)
        self.running = 0
        self.switches = 0
        self.closed = None            # why, once closed
        self._cond = threading.Condition()
        self._waiting = {}            # ticket -> version
        self._tickets = 0

    def stamp(self):
        return self.current

    def enter(self, version):
        with self._cond:
            self._tickets += 1
            ticket = self._tickets
            self._waiting[ticket] = version
            try:
                while True:
                    if self.closed:
                        raise errors.ClamorError(f"clamor is detached from this worker ({self.closed}): a task that "
                                                 f"reads the driver's globals cannot run here")
                    older = [t for t, v in self._waiting.items() if t < ticket and v != version]
                    if version == self.current and not older:
                        break
                    if self.running == 0 and ticket == min(self._waiting):
                        self._switch(version)
                        break
                    self._cond.wait()
            finally:
                del self._waiting[ticket]
                self._cond.notify_all()
            self.running += 1

    def exit(self):
        region.sweep_dead()
        with self._cond:
            self.running -= 1
            self._cond.notify_all()

    def _switch(self, version):
        pages = self.changes(self.current, version)
        # The new version's relocation targets are bound first: letting go
        # of region objects below (a collection, the collector's lists) may
        # touch a page this worker never fetched, and the driver may serve
        # it with the new version's lists.  (Bound after, a Dask worker that
        # had attached again aborted there now and then: a target it had not
        # bound.)  Binding is additive: the old version's targets stay.
        if self.on_switch is not None:
            self.on_switch()
        # Region objects a task used may sit in cycles: freed now, on the
        # pages as this worker holds them, not against the driver's counts
        # after the pages are fetched again.
        change_version(version, pages, self._collect if self.resolved else None)
        self.current = version
        self.switches += 1

    def _collect(self):
        gc.collect()
        self.resolved = False

    def close(self, why, wait=60.0):
        """Refuse new tasks; wait (up to ``wait`` seconds) for running ones."""
        with self._cond:
            self.closed = why
            self._cond.notify_all()
            deadline = time.monotonic() + wait
            while self.running and time.monotonic() < deadline:
                self._cond.wait(0.1)
            return self.running == 0

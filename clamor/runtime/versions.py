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
requests with the new version.
"""
import bisect

import numpy as np

from ..memory import portable, region, samehost
from . import serialize


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
        sid = region.stage_current() + 1
        changed = region.stage_begin(sid)
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

    def changed_between(self, a, b, moved=False):
        """The pages changed at the versions after the lower of ``a`` and
        ``b`` up to the higher (a uint64 ndarray); ``moved``: and those that
        moved (a reader that maps the driver's pages)."""
        lo, hi = sorted((int(a), int(b)))
        parts = [ch for s, ch in self.changes.items() if lo < s <= hi]
        if moved and self.moves is not None:
            parts += [ch for s, ch in self.moves.items() if lo < s <= hi]
        if not parts:
            return np.empty(0, dtype=np.uint64)
        return parts[0] if len(parts) == 1 else np.unique(np.concatenate(parts))

    def keep(self, versions, floor=None):
        """Keep only the page versions of ``versions``; ``floor``: the
        lowest a reader that maps the driver's pages may still read at
        (default: the lowest kept).  Returns them, sorted."""
        keep = sorted(versions)
        samehost.map_floor(keep[0] if floor is None else floor)
        region.versions_keep(keep)
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
    if release is not None:
        release()
    if len(pages):
        region.invalidate(pages)
    region.set_stage(version)

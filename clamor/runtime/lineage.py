"""Lineage: where the outputs of earlier stages live, and what a stage needs.

DESIGN.  Clamor keeps Spark's promise (paper section 5): a partition lost
with its worker is rebuilt from its lineage, and the job's result is the
same as without the failure.  Two kinds of output outlive the task that made
them, both kept on the worker that made them: shuffle map outputs (the
buckets of map partition m of shuffle s) and cached partitions.  The driver
records, for each, the worker holding it and the stage at which it was
computed: its *version*, since a task reads global-variable pages as its
stage sees them.  The version is what makes recovery exact when the driver
updated a global in between: a lost output is recomputed by a task that
reads the region at the output's own version, never the current one.

When a worker is lost its outputs are marked lost, not forgotten: the
version stays, so a later stage that needs them can have them recomputed
(``needs``).  Records go only when the collection or shuffle is dropped
(``forget``, when the collection or shuffle is garbage-collected).  The
collections themselves are never held here: a stage's graph, walked by
``needs``, holds every collection a re-run may need.

Unpersisting is not forgetting.  A cached partition is a snapshot, and the
outputs computed from it while it was cached (a shuffle's map outputs, a
cache made from it) read that snapshot.  So ``unpersist`` keeps, as a
*snapshot record*, the version each partition was made at and the first
stage that no longer read it (``until``): a re-run at a version ``r`` with
``made <= r < until`` reads the partition as it was made, restored first
by a job at ``made`` (its copy is recorded in ``restored`` and dropped at
the end of the action), and any other re-run computes it, as its original
did.  A snapshot record lives while a re-run may still reach it: while the
collection lives and some recorded output (or another snapshot record that
is needed) was made at a version in its range.  The versions that only
snapshot records keep are bounded (``prune``); past the bound the oldest
expire, and a re-run that needs one raises VersionExpired rather than
reading the globals at the wrong stage.

Nothing here does I/O; the cluster (clamor/runtime/cluster.py) asks and acts.
"""
from .. import errors
from .collection import Shuffled


class _Snapshot:
    """The partitions of an unpersisted collection, as they were cached."""
    __slots__ = ("made", "until", "expired", "first")

    def __init__(self, made, until):
        self.made = made            # partition -> version it was made at
        self.until = until          # the first stage that did not read them
        self.expired = set()        # versions of ``made`` no longer kept
        self.first = min(made.values())

    def reached(self, version):
        """Whether tasks at ``version`` read some partition of it."""
        return version is not None and self.first <= version < self.until

    def at(self, p, version):
        """The version partition ``p`` is read at by a task at ``version``,
        or None: that task computes it."""
        v = self.made.get(p)
        if v is not None and version is not None and v <= version < self.until:
            return v
        return None

    def live(self):
        return set(self.made.values()) - self.expired


class Lineage:
    def __init__(self):
        self.shuffles = {}      # shuffle id -> [worker id, or None when lost, per map partition]
        self.shuffle_made = {}  # shuffle id -> version (stage) its map tasks read at
        self.cache = {}         # (collection id, partition) -> worker id holding it
        self.cache_made = {}    # (collection id, partition) -> version; kept while lost
        self.snapshots = {}     # collection id -> [_Snapshot], one per unpersist
        self.restored = {}      # (collection id, partition, version) -> worker id, until the action ends

    # -- recording --------------------------------------------------------------------
    def shuffle_started(self, shuffle_id, nmaps, version):
        if shuffle_id not in self.shuffles:
            self.shuffles[shuffle_id] = [None] * nmaps
            self.shuffle_made[shuffle_id] = version

    def map_output(self, shuffle_id, m, wid):
        locs = self.shuffles.get(shuffle_id)
        if locs is not None and locs[m] is None:
            locs[m] = wid

    def cached(self, cid, p, wid, version):
        """Worker ``wid`` cached partition ``p`` of ``cid``, computed at
        ``version``.  Only a copy of the partition's first version counts
        (a re-run at an older stage that computed it on the way is not the
        partition the later stages read)."""
        if self.cache_made.setdefault((cid, p), version) == version:
            self.cache[(cid, p)] = wid

    def restored_copy(self, cid, p, version, wid):
        """Worker ``wid`` computed partition ``p`` of ``cid`` at ``version``:
        record it if it restores an unpersisted snapshot (True)."""
        for snap in self.snapshots.get(cid, ()):
            if snap.made.get(p) == version and version not in snap.expired:
                self.restored.setdefault((cid, p, version), wid)
                return True
        return False

    def restored_locs(self, version):
        """{(collection id, partition): (worker id, made)} of restored
        copies that tasks at ``version`` read."""
        out = {}
        for (cid, p, v), wid in self.restored.items():
            if any(snap.at(p, version) == v for snap in self.snapshots.get(cid, ())):
                out[(cid, p)] = (wid, v)
        return out

    def restore_ids(self, version):
        """Collections that tasks at ``version`` read as snapshots, no longer
        cached: they read the restored copies, and cache what they compute."""
        return {cid for cid, snaps in self.snapshots.items() if any(snap.reached(version) for snap in snaps)}

    def drop_restored(self):
        """Forget every restored copy; returns their block keys."""
        keys = [("cache",) + k for k in self.restored]
        self.restored.clear()
        return keys

    # -- losing and forgetting --------------------------------------------------------
    def lose_worker(self, wid):
        """Mark everything ``wid`` held as lost; returns (shuffle ids, cache
        keys) that lost something (a restored copy's key is (collection,
        partition, version))."""
        shuffles = set()
        for sid, locs in self.shuffles.items():
            for m, w in enumerate(locs):
                if w == wid:
                    locs[m] = None
                    shuffles.add(sid)
        keys = {k for k, w in self.cache.items() if w == wid}
        for k in keys:
            del self.cache[k]
        restored = {k for k, w in self.restored.items() if w == wid}
        for k in restored:
            del self.restored[k]
        return shuffles, keys | restored

    def lose_block(self, wid, key):
        """A live worker said it lacks a block it should hold: mark it lost."""
        if key[0] == "shuffle":
            locs = self.shuffles.get(key[1])
            if locs is not None and key[2] < len(locs) and locs[key[2]] == wid:
                locs[key[2]] = None
        elif key[0] == "cache":
            ck = (key[1], key[2])
            if self.cache.get(ck) == wid and (len(key) < 4 or self.cache_made.get(ck) == key[3]):
                del self.cache[ck]
            elif len(key) >= 4 and self.restored.get(tuple(key[1:4])) == wid:
                del self.restored[tuple(key[1:4])]

    def forget(self, kind, ident):
        """The shuffle or collection ``ident`` is gone: drop its records
        (a collection's snapshots too: no graph holds it any more)."""
        if kind == "shuffle":
            self.shuffles.pop(ident, None)
            self.shuffle_made.pop(ident, None)
        else:
            self._uncache(ident)
            self.snapshots.pop(ident, None)
            for k in [k for k in self.restored if k[0] == ident]:
                del self.restored[k]

    def unpersist(self, cid, until):
        """Collection ``cid`` is no longer cached, from stage ``until`` on:
        its copies go, and the versions they were made at are kept as a
        snapshot for re-runs of earlier stages."""
        made = self._uncache(cid)
        if made:
            self.snapshots.setdefault(cid, []).append(_Snapshot(made, until))

    def _uncache(self, cid):
        made = {}
        for k in [k for k in self.cache_made if k[0] == cid]:
            made[k[1]] = self.cache_made.pop(k)
            self.cache.pop(k, None)
        return made

    def versions(self):
        """Every version a recorded output was made at (lost ones included:
        recomputing them reads it), and those snapshots still need."""
        out = set(self.shuffle_made.values()) | set(self.cache_made.values())
        for snaps in self.snapshots.values():
            for snap in snaps:
                out |= snap.live()
        return out

    def prune(self, limit=None):
        """Drop the snapshots no re-run can reach, and expire the oldest
        versions kept only for snapshots beyond ``limit`` of them.

        A re-run happens at the version of a recorded output or of a
        snapshot it restores, so a snapshot is reachable if one of those
        falls in its range (conservative: the output need not have read
        this collection).  An expired snapshot that is reachable stays,
        so that a re-run that needs it fails instead of computing it at
        the wrong version.
        """
        roots = set(self.shuffle_made.values()) | set(self.cache_made.values())
        reach, needed = set(roots), set()
        changed = True
        while changed:
            changed = False
            for snaps in self.snapshots.values():
                for snap in snaps:
                    if id(snap) not in needed and any(snap.reached(r) for r in reach):
                        needed.add(id(snap))
                        reach |= snap.live()
                        changed = True
        for cid in list(self.snapshots):
            kept = [snap for snap in self.snapshots[cid] if id(snap) in needed]
            if kept:
                self.snapshots[cid] = kept
            else:
                del self.snapshots[cid]
        if limit is None:
            return
        extra = sorted(reach - roots)
        if len(extra) > limit:
            gone = set(extra[:len(extra) - limit])
            for snaps in self.snapshots.values():
                for snap in snaps:
                    snap.expired |= gone & set(snap.made.values())

    # -- planning ---------------------------------------------------------------------
    def needs(self, node, parts, recompute=False, version=None):
        """What tasks computing ``parts`` of ``node`` read from earlier
        stages; with ``recompute``, tasks that recompute those partitions of
        a cached ``node`` (so not reading them).  Returns (shuffled,
        lost_cache, reads):

        - ``shuffled``: the Shuffled collections whose map outputs they read
          (the cluster makes sure every map partition is present);
        - ``lost_cache``: {version: {collection: [partitions]}}, cached
          partitions they would read that were lost and must be recomputed
          at that version first;
        - ``reads``: (shuffle ids, cache keys) they will fetch, so that losing
          one of them during the stage can be noticed.

        Tasks reading at ``version`` do not read partitions cached at a later
        one (a re-run computes what the original task computed): those
        count as not cached.  A re-run of a stage that read an unpersisted
        collection's snapshot reads it again (restored copies are in
        ``reads``, the ones to restore in ``lost_cache``); VersionExpired
        if its version is no longer kept.
        """
        shuffled, lost, seen = {}, {}, set()
        read_shuffles, read_cache = set(), set()
        stack = [(node, frozenset(parts))]
        while stack:
            c, ps = stack.pop()
            if (c.id, ps) in seen or not ps:
                continue
            seen.add((c.id, ps))
            if c.cached and not (recompute and c is node):
                made = {p: self.cache_made.get((c.id, p)) for p in ps}
                ours = {p for p, v in made.items() if v is not None and (version is None or v <= version)}
                here = {p for p in ours if (c.id, p) in self.cache}
                gone = ours - here
                read_cache.update((c.id, p) for p in here)
                for p in gone:
                    lost.setdefault(self.cache_made[(c.id, p)], {}).setdefault(c, []).append(p)
                ps = ps - here - gone
                if not ps:
                    continue
            if c.id in self.snapshots and not (recompute and c is node):
                ps = self._snapshot_reads(c, ps, version, lost, read_cache)
                if not ps:
                    continue
            if isinstance(c, Shuffled):
                shuffled[c.id] = c
                read_shuffles.update(c.shuffle_ids)
                continue
            for d in c.deps:
                stack.append((d, ps))
        for groups in lost.values():
            for c in groups:
                groups[c].sort()
        return list(shuffled.values()), lost, (read_shuffles, read_cache)

    def _snapshot_reads(self, c, ps, version, lost, read_cache):
        """The partitions of ``ps`` not read from a snapshot of ``c``."""
        rest = set(ps)
        for snap in self.snapshots[c.id]:
            for p in ps:
                v = snap.at(p, version)
                if v is None:
                    continue
                if v in snap.expired:
                    raise errors.VersionExpired(
                        f"partition {p} of {c!r} was unpersisted, and re-running stage {version}, which read it "
                        f"as cached at stage {v}, needs the globals as they were then: that version is no longer "
                        f"kept (Cluster.unpersisted_versions); keep the collection cached while collections "
                        f"computed from it are in use")
                if (c.id, p, v) in self.restored:
                    read_cache.add((c.id, p, v))
                else:
                    lost.setdefault(v, {}).setdefault(c, []).append(p)
                rest.discard(p)
        return frozenset(rest)

    def missing_maps(self, shuffle_id):
        """Map partitions of ``shuffle_id`` whose output is lost."""
        return [m for m, w in enumerate(self.shuffles.get(shuffle_id, ())) if w is None]

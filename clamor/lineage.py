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
(``forget``, when the collection or shuffle is garbage-collected or
unpersisted).  The collections themselves are never held here: a stage's
graph, walked by ``needs``, holds every collection a re-run may need.

Nothing here does I/O; the cluster (clamor/cluster.py) asks and acts.
"""
from .collection import Shuffled


class Lineage:
    def __init__(self):
        self.shuffles = {}      # shuffle id -> [worker id, or None when lost, per map partition]
        self.shuffle_made = {}  # shuffle id -> version (stage) its map tasks read at
        self.cache = {}         # (collection id, partition) -> worker id holding it
        self.cache_made = {}    # (collection id, partition) -> version; kept while lost

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

    # -- losing and forgetting --------------------------------------------------------
    def lose_worker(self, wid):
        """Mark everything ``wid`` held as lost; returns (shuffle ids, cache
        keys) that lost something."""
        shuffles = set()
        for sid, locs in self.shuffles.items():
            for m, w in enumerate(locs):
                if w == wid:
                    locs[m] = None
                    shuffles.add(sid)
        keys = {k for k, w in self.cache.items() if w == wid}
        for k in keys:
            del self.cache[k]
        return shuffles, keys

    def lose_block(self, wid, key):
        """A live worker said it lacks a block it should hold: mark it lost."""
        if key[0] == "shuffle":
            locs = self.shuffles.get(key[1])
            if locs is not None and key[2] < len(locs) and locs[key[2]] == wid:
                locs[key[2]] = None
        elif key[0] == "cache" and self.cache.get((key[1], key[2])) == wid:
            del self.cache[(key[1], key[2])]

    def forget(self, kind, ident):
        """The shuffle or cached collection ``ident`` is gone: drop its records."""
        if kind == "shuffle":
            self.shuffles.pop(ident, None)
            self.shuffle_made.pop(ident, None)
        else:
            for k in [k for k in self.cache_made if k[0] == ident]:
                self.cache_made.pop(k)
                self.cache.pop(k, None)

    def versions(self):
        """Every version a recorded output was made at (lost ones included:
        recomputing them reads it)."""
        return set(self.shuffle_made.values()) | set(self.cache_made.values())

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
        count as not cached.
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

    def missing_maps(self, shuffle_id):
        """Map partitions of ``shuffle_id`` whose output is lost."""
        return [m for m, w in enumerate(self.shuffles.get(shuffle_id, ())) if w is None]

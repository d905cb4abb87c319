"""What a stage ships in place, checked before it goes: region objects
that tasks use by offset, and the relocations of those that go to workers
not forked from the driver.

DESIGN.  Before a stage's version begins, ``vouch`` pickles what the stage
will ship once, so that the checks (clamor/runtime/serialize.py) and the
relocation walks (clamor/memory/portable.py) that may write region pages
run before the version that tasks read.  After it begins,
``check_in_place`` lists the relocations of what ships to workers not
forked from the driver (or refuses it), and ``relocation_news`` adds to a
task for such a worker the targets it has not bound and the pages whose
lists changed.
"""
import pickle

import numpy as np

from .. import errors
from ..memory import portable, region, walk
from ..memory.heap import release_dropped
from . import serialize
from .collection import Parallel, Shuffled


class Shipping:
    """The in-place checks of one Cluster's stages.  ``forked``: some
    worker is forked from the driver; ``others``: some worker is not.
    ``pool``: the Cluster's workers (clamor/runtime/pool.py)."""

    def __init__(self, pool, forked, others):
        self.pool, self.forked, self.others = pool, forked, others
        self.conversions_seen = 0   # walk.conversions when the free lists were last emptied

    def vouch(self, kind, node, parent, action, arg, parts):
        """Before a stage begins: pickle what it will ship once, so that the
        region objects it ships in place are checked now.  The check may
        rewrite an instance's dict (walk._own_keys); a write after the stage
        began would not reach its tasks: forked workers read the pages as
        the stage began them, and for workers not forked it would be a page
        version whose relocations no walk listed.  With forked workers only,
        the task alone is walked here (its functions capture the globals);
        a region instance reached only through partition data that still
        needs the rewrite travels by value, once (serialize._vouched).
        A verdict remembered from an earlier stage that rests on bytes the
        driver wrote since (``d[k] = obj`` of the same size) is forgotten
        first: the stage's own begin, which would tell, comes after."""
        self.release_converted()
        serialize.note_changed(region.dirty_pages())
        forked, others = self.forked, self.others
        roots = []
        serialize.dumps_task({"kind": kind, "node": node, "parent": parent, "action": action, "arg": arg},
                             roots=roots, forked=forked, portable=others)
        if not others:
            return
        src = sources(node if kind != "map" else node.deps[parent])
        every = range(node.deps[parent].num_partitions if kind == "map" else node.num_partitions)
        for p in every if parts is None else parts:
            serialize.dumps({"src": {s.id: s.task_data(p) for s in src}}, roots=roots, forked=forked,
                            portable=True)
        if roots:
            self.relocate_early(roots)

    def relocate_early(self, roots):
        """The relocation walks of ``roots`` (and of earlier stages' objects
        the driver changed since) before the stage's version begins.  A
        walk may write region pages: an instance's dict given keys of its
        own, an object outside the region brought in.  Only a version begun
        after the write shows it, and a list of bytes the version does not
        have agrees with none of its pages (the worker that fetched one
        died).  The check after the begin (check_in_place) then finds
        nothing to write.  A refusal is left to that check, which says it
        with the workers it concerns."""
        spawned = [w for w in self.pool.workers.values() if w.spawned]
        if not spawned or not all(w.same_base for w in spawned):
            return
        rel = portable.driver()
        rel.note_changed(region.dirty_pages())
        try:
            changed = rel.prepare(roots, region.version_current() + 1, bring_in=True,
                                  seeds_agree=all(w.hash_ok for w in spawned))
        except errors.NotShareable:
            return
        self.invalidate_relocated(changed)

    def release_converted(self):
        """Dicts that a walk replaced since the free lists were last emptied
        (walk._own_keys) may sit on CPython's free lists: the payload's own
        dicts must not be made of them, or a check remembered for an
        address would pass them as region objects.  Empty the lists then."""
        if walk.conversions[0] != self.conversions_seen:
            self.conversions_seen = walk.conversions[0]
            release_dropped()

    def check_in_place(self, job, parts, roots):
        """Region objects travel by offset, used in place.  A worker not
        forked from the driver can use them only if they are portable: their
        pages' relocations are listed now (clamor/memory/portable.py), and
        pages whose lists changed are dropped by those workers.
        NotShareable if a task of ``parts`` may go to such a worker and they
        are not portable, or the worker cannot relocate (another region
        base, another hash seed)."""
        workers = self.pool.workers
        may = set()
        for p in parts:
            may.update(job.only.get(p) or workers)
        others = sorted(w for w in may if w in workers and workers[w].spawned)
        if not others:
            return
        what = f"a region {type(roots[0]).__name__} at {id(roots[0]):#x}"
        elsewhere = [w.decode() for w in others if not workers[w].same_base]
        if elsewhere:
            raise errors.NotShareable(
                f"{what} is used by this stage, and worker(s) {', '.join(elsewhere)} map the region at another "
                f"address (--base): Python objects built under clamor.heap() are used in place only at the "
                f"driver's address. Keep such data in region arrays, which every worker reads")
        unseeded = [w.decode() for w in others if not workers[w].hash_ok]
        try:
            changed = portable.driver().prepare(roots, region.version_current(), seeds_agree=not unseeded)
        except errors.NotShareable as err:
            if unseeded and "PYTHONHASHSEED" in str(err):
                raise errors.NotShareable(f"{err} (worker(s) {', '.join(unseeded)} hash differently)") from None
            raise
        self.invalidate_relocated(changed)

    def invalidate_relocated(self, changed):
        """Spawned workers drop the pages whose relocation lists changed."""
        if changed.size:
            for w in self.pool.workers.values():
                if w.spawned:
                    had = w.reloc_inval if w.reloc_inval is not None else changed
                    w.reloc_inval = np.union1d(had, changed).astype(np.uint64)

    def relocation_news(self, wid, w, inval):
        """Before a task goes to a worker not forked from the driver: the
        relocation targets it has not bound yet (TARGETS), and the pages
        whose relocation lists changed, added to ``inval``."""
        rel = portable.driver()
        specs = rel.specs_for(w.reloc_sent)
        if specs:
            self.pool.sock.send_multipart([wid, b"TARGETS", pickle.dumps(specs)])
            w.reloc_sent.update(i for i, _ in specs)
        extra, w.reloc_inval = w.reloc_inval, None
        if extra is None or not extra.size:
            return inval
        if inval:
            extra = np.union1d(np.frombuffer(inval, dtype=np.uint64), extra)
        return extra.astype(np.uint64).tobytes()


def sources(node):
    """Parallel sources reachable from ``node`` within its stage (not across
    a shuffle), whose per-partition data travels with each task."""
    out, stack, seen = [], [node], set()
    while stack:
        c = stack.pop()
        if c.id in seen:
            continue
        seen.add(c.id)
        if isinstance(c, Parallel):
            out.append(c)
        if not isinstance(c, Shuffled):
            stack.extend(c.deps)
    return out


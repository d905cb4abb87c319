"""Running stages on the driver: planning, the event loop, recovery.

DESIGN.  The driver thread that calls an action does everything here: it
plans stages (one per shuffle not yet computed, then the result stage),
feeds events to the pure scheduler (clamor/runtime/scheduler.py) and carries out its
instructions over the cluster's ROUTER socket.  Results become visible only
when a stage finishes (the BSP barrier).

A *job* is one logical stage: some partitions of a collection, computed at
one *version* (the stage number whose page versions its tasks read).  A new
stage begins a new version (the driver's writes since the last one are
versioned and the changed pages listed for the workers to drop).  A lineage
re-run is a job at an old version: the version at which the lost output was
first made (clamor/runtime/lineage.py), so it reads exactly the bytes the original
task read, even if the driver has updated the globals since.

A job runs as one or more *attempts*, each a scheduler stage over the
partitions still missing.  Before each attempt the driver makes sure the
job's inputs exist: map outputs of the shuffles it reads, cached partitions
it reads; lost ones are first recomputed by nested jobs at their own
versions, as many stages back as needed.  A task that fetches a block from a
peer that turns out to be gone fails with a FetchFailed (promptly: the
driver tells every worker which peers are lost), the attempt is cancelled,
inputs are recovered, and a new attempt runs what is still missing.  A
result reported by any attempt counts, once per partition; a map output
counts only while its worker lives.  A worker lost while running tasks has
them re-queued by the scheduler (``recover``); a task lost with its worker
``max_attempts`` times, or a job needing more than ``max_attempts``
attempts, fails with WorkerLost.

A collection unpersisted after stages read its cached partitions leaves a
snapshot record (clamor/runtime/lineage.py): a re-run of such a stage restores the
partitions it read with a nested job at their version, and its tasks read
the restored copies (``restore`` in the stage's block locations: the
collection is treated as cached again for them).  The copies are dropped
when the action ends.  The driver keeps at most ``unpersisted_versions``
page versions for snapshots alone; past that a re-run that would need an
older one fails with VersionExpired.

Worker-side page versions: a worker keeps pages across stages; before each
task it drops the pages changed between the version its copies reflect and
the task's version, in either direction, so a re-run of an old version sees
old bytes and the next new task sees new ones again.
"""
import collections
import json
import logging
import os
import pickle
import signal
import time

import numpy as np
import psutil
import zmq

from .. import errors
from ..memory import region
from . import serialize
from .collection import Parallel, Shuffled
from ..memory.heap import outside, release_dropped
from ..memory import portable, samehost, walk
from .driver import read_join, read_leave, welcome
from .liveness import pid_alive, shares_pids
from .interrupt import Deferred
from .progress import StageProgress
from .scheduler import (Cancel, Run, StageAborted, StageCancelledEvent, StageFinished, StageSubmittedEvent, TaskDoneEvent,
                        TaskFailedEvent, TaskSkippedEvent, TickEvent, TaskSpec, WorkerJoinedEvent, WorkerLostEvent)

log = logging.getLogger("clamor")



def _maps(w):
    """Worker ``w`` maps the driver's pages (same host)."""
    return (w.get("same_host") or {}).get("mode") == "map"

class _InputsLost(Exception):
    """Internal: the running attempt lost an input or an output; retry."""


class _Job:
    __slots__ = ("kind", "node", "parent", "action", "arg", "parts", "version", "results", "losses", "stat",
                 "bar", "reads", "rerun", "attempts", "asids", "only")

    def __init__(self, kind, node, parent, action, arg, parts, version, rerun, only=None):
        self.kind, self.node, self.parent, self.action, self.arg = kind, node, parent, action, arg
        self.parts, self.version, self.rerun = list(parts), version, rerun
        self.results = {}                       # partition -> value (map jobs: worker id)
        self.losses = collections.Counter()     # partition -> times lost with a worker
        self.reads = (set(), set())             # (shuffle ids, cache keys) the tasks fetch
        self.attempts = 0
        self.asids = []                         # its attempts' scheduler stage ids
        self.only = only or {}                  # partition -> the workers it may run on (Cluster.run)

    @property
    def computes(self):
        """The collection whose partitions the tasks compute."""
        return self.node.deps[self.parent] if self.kind == "map" else self.node


class Stages:
    """The part of Cluster that runs stages (see the module docstring)."""

    # Page versions kept only for the snapshots of unpersisted collections
    # (beyond those of live outputs): past this many, the oldest expire.
    unpersisted_versions = 8

    def __reduce__(self):
        raise errors.NotSerializable("a task cannot capture the Cluster: it stays on the driver "
                                     "(use it outside the functions you pass to map, filter, ...)")

    # -- planning -----------------------------------------------------------------------
    @outside
    def _run_action(self, node, kind, arg, partitions=None, only=None):
        self._check()
        release_dropped()
        self._conversions_seen = walk.conversions[0]
        try:
            self._catch_up()
            for st in self._plan(node):
                self._run_job("map", st[0], parent=st[1])
            parts = list(range(node.num_partitions)) if partitions is None else partitions
            return self._run_job("result", node, action=kind, arg=arg, parts=parts, only=only)
        finally:
            self._drop_restored()
            self._idle_since = time.monotonic()

    def _catch_up(self):
        """Between actions nobody reads the control socket.  Read what waits
        there (heartbeats, joins, late reports), and do not count the time
        nobody listened as a worker's silence: a cluster left idle longer
        than ``heartbeat_timeout`` lost every worker at its next action.  (A
        worker that died meanwhile is found by its pid or its closed
        connection; one that went silent, within ``heartbeat_timeout``.)"""
        now = time.monotonic()
        idle = self._idle_since
        if idle is not None:
            for info in self._workers.values():
                info["last_hb"] += now - idle
            self._idle_since = None
        with Deferred() as interrupt:
            for _ in range(100000):
                try:
                    frames = self._sock.recv_multipart(flags=zmq.NOBLOCK)
                except zmq.Again:
                    break
                for ins in self._on_message(frames):
                    # (no stage runs, so nothing is assigned: only late copies are cancelled)
                    if isinstance(ins, Cancel) and ins.worker in self._workers:
                        self._sock.send_multipart([ins.worker, b"CANCEL", pickle.dumps(ins.key)])
            interrupt.check()

    def _plan(self, node):
        """Map stages never computed that ``node`` needs, dependencies first."""
        out, seen = [], set()
        lin = self._lineage

        def cached_everywhere(c):
            return c.cached and all((c.id, p) in lin.cache_made for p in range(c.num_partitions))

        def visit(c):
            if c.id in seen or cached_everywhere(c):
                return
            seen.add(c.id)
            for i, d in enumerate(c.deps):
                visit(d)
                if isinstance(c, Shuffled) and c.shuffle_ids[i] not in lin.shuffles:
                    out.append((c, i))
        visit(node)
        return out

    def _begin_stage(self):
        """Number the next stage and end the driver's epoch: pages written
        since the last stage are versioned, and the changed ones listed for
        the workers to drop."""
        self._drop_forgotten()
        # notice workers that died while the cluster was idle, before giving
        # them tasks; first read the heartbeats that came meanwhile (the
        # check before a stage, _vouch, may take longer than the time-out)
        self._catch_up()
        for ins in self._check_liveness():
            if isinstance(ins, StageAborted):
                raise ins.error
        if not self._workers and not self._expected:   # none left, none coming
            raise errors.WorkerLost("no live workers (every worker was lost and none is being replaced)")
        sid = self._versions.begin()
        # The page versions worth keeping are those of the stages a task may
        # still read at: this one, those recorded outputs were made at (lost
        # ones included: lineage re-runs read there), and those of tasks
        # still running (a losing copy of an earlier action, or one that
        # outlived a failed attempt, runs to its end).  A version between
        # them is dropped: a collection cached once, then a global updated
        # at every stage, kept a version per stage, and the driver ran out
        # of room for them.
        running = {k[0] for w in self._workers for k in self._sched.running(w)}
        self._attempt_version = {a: v for a, v in self._attempt_version.items() if a in running or a in self._jobs}
        self._lineage.prune(self.unpersisted_versions)
        # A worker that maps the driver's pages may read, until its next
        # task drops what changed, the locations of the stage it last ran at;
        # one that fetches them may fetch there until then (its collector,
        # between tasks, visits the region objects it tracks: a worker died
        # of a version collected under it).
        mapping = {w["seen"] for w in self._workers.values() if _maps(w)}
        last_ran = {w["seen"] for w in self._workers.values()}
        running_at = set(self._attempt_version.values())
        keep = self._versions.keep({sid} | self._lineage.versions() | running_at | last_ran,
                                   floor=min({sid} | mapping | running_at))
        # (changed-page lists are asked for between a worker's version and one of these)
        self._versions.trim(set(keep) | last_ran)
        return sid

    def _invalidations(self, w, version):
        """Pages worker ``w`` must drop before a task at ``version``: those
        changed at every stage boundary between the version its copies
        reflect and ``version`` (either way: a re-run goes back)."""
        seen, w["seen"] = w["seen"], version
        # (its mappings of pages that moved name the old locations)
        return self._versions.changed_between(seen, version, moved=_maps(w)).astype(np.uint64).tobytes()

    # -- jobs and attempts ----------------------------------------------------------
    def _run_job(self, kind, node, parent=None, action=None, arg=None, parts=None, version=None, only=None):
        rerun = version is not None
        if version is None:
            self._vouch(kind, node, parent, action, arg, parts)
            version = self._begin_stage()
        if kind == "map":
            parts = list(range(node.deps[parent].num_partitions)) if parts is None else parts
            self._lineage.shuffle_started(node.shuffle_ids[parent], node.deps[parent].num_partitions, version)
        job = _Job(kind, node, parent, action, arg, parts, version, rerun, only)
        if rerun:
            self._totals["recovery_jobs"] += 1
            log.info("recomputing %d partition(s) of %r at stage %d", len(parts), job.computes, version)
        try:
            self._run_attempts(job)
        except BaseException:
            if kind == "map" and not rerun:
                # A shuffle never completed is not kept: the next action
                # computes it afresh, at its own version (its outputs so far
                # read the globals as this stage saw them).
                sid = node.shuffle_ids[parent]
                self._lineage.forget("shuffle", sid)
                self._forget(("shuffle", sid))      # the workers drop its blocks
            raise
        finally:
            for a in job.asids:    # late reports of its tasks now only free slots
                self._jobs.pop(a, None)
        if kind == "map":
            sid = node.shuffle_ids[parent]
            for p in job.parts:
                self._lineage.map_output(sid, p, job.results[p])
            return None
        return [job.results[p] for p in job.parts]

    def _run_attempts(self, job):
        kind = job.kind
        while True:
            self._ensure_inputs(job)
            if kind == "map":   # an output is only as good as its worker
                for p in [p for p, w in job.results.items() if w not in self._workers]:
                    del job.results[p]
            missing = [p for p in job.parts if p not in job.results]
            if not missing:
                break
            if job.attempts >= self.max_attempts:
                raise errors.WorkerLost(f"stage {job.version}: gave up after {job.attempts} attempts lost to failed "
                                        f"workers ({len(missing)} of {len(job.parts)} partitions missing)")
            if not self._workers and not self._expected:
                raise errors.WorkerLost(f"stage {job.version}: no live workers (every worker was lost and "
                                        f"none is being replaced)")
            job.attempts += 1
            try:
                self._attempt(job, missing)
            except _InputsLost as err:
                log.info("stage %d: %s; retrying what is missing", job.version, err)
                continue

    def _ensure_inputs(self, job):
        """Recompute, at their own versions, the lost outputs ``job`` reads."""
        for _ in range(self.max_attempts * 4):
            shuffled, lost_cache, reads = self._lineage.needs(job.computes, job.parts,
                                                              recompute=job.action == "cache",
                                                              version=job.version)
            todo = False
            for c in shuffled:
                for i, sid in enumerate(c.shuffle_ids):
                    miss = self._lineage.missing_maps(sid)
                    if miss:
                        todo = True
                        self._run_job("map", c, parent=i, parts=miss, version=self._lineage.shuffle_made[sid])
            for version in sorted(lost_cache):
                for c, ps in lost_cache[version].items():
                    todo = True
                    self._run_job("result", c, action="cache", parts=ps, version=version)
            if not todo:
                job.reads = reads
                return
        raise errors.WorkerLost("inputs of a stage kept being lost while they were recomputed")

    def _attempt(self, job, missing):
        asid = next(self._attempt_ids)
        node = job.node
        desc = f"stage {job.version}: " + ("shuffle map" if job.kind == "map" else job.action)
        if job.rerun:
            desc += " (recomputing lost partitions)"
        in_place, roots = [], []
        self._release_converted()
        forked = self.start_method == "fork" and self.nworkers > 0
        others = self.start_method != "fork" or self.remote > 0
        payload = serialize.dumps_task({"kind": job.kind, "node": node, "parent": job.parent,
                                        "action": job.action, "arg": job.arg, "locs": self._locs(job.version)},
                                       objects=in_place, roots=roots, forked=forked, portable=others,
                                       version=job.version)
        sources = _sources(job.computes)
        extras = {p: serialize.dumps({"p": p, "src": {s.id: s.task_data(p) for s in sources}}, objects=in_place,
                                     roots=roots, forked=forked, portable=others, version=job.version)
                  for p in missing}
        if roots:
            self._check_in_place(job, missing, roots)
        lineage = _cached_ids(node)
        nparts = len(job.parts)
        tasks = []
        # A worker is preferred for at most its fair share of the stage, so
        # a replacement (or any worker that ran nothing here before) is not
        # left idle while another holds every partition's affinity.
        share = -(-len(missing) // max(1, len(self._workers)))
        affine = collections.Counter()
        for p in missing:
            cached = tuple({w for (c, q), w in self._lineage.cache.items() if q == p and c in lineage})
            # Otherwise the worker that last ran partition p of a stage this
            # wide: iterative jobs re-read the same region pages, which that
            # worker holds already.
            last = self._affinity.get((nparts, p))
            prefer = cached
            if not prefer and last in self._workers and affine[last] < share:
                affine[last] += 1
                prefer = (last,)
            tasks.append(TaskSpec((asid, p), asid, p, prefer, job.only.get(p, ())))
        stat = {"stage": job.version, "kind": job.kind if job.kind == "map" else job.action, "tasks": len(tasks),
                "durations": [], "faults": 0, "bytes_from_driver": 0, "bytes_from_peers": 0, "bytes_mapped": 0,
                "wire_bytes": 0, "wire_bytes_diff": 0, "diff_pages": 0,
                "payload_bytes": len(payload), "task_data_bytes": sum(len(e) for e in extras.values()),
                "attempt": job.attempts, "rerun": job.rerun}
        job.stat, job.bar = stat, StageProgress(len(tasks), desc, self.progress)
        self._stat_opened(asid, stat)
        self._jobs[asid] = job
        self._attempt_version[asid] = job.version
        for w in self._workers.values():   # payloads sent, of attempts still in progress only
            w["stages"].intersection_update(self._jobs)
        job.asids.append(asid)
        t0 = time.perf_counter()
        log.debug("%s: %d tasks (attempt %d)", desc, len(tasks), job.attempts)
        try:
            self._drive(asid, job, tuple(tasks), payload, extras)
        finally:
            job.bar.close()
            stat["duration_s"] = time.perf_counter() - t0
            self._record(stat)

    def _vouch(self, kind, node, parent, action, arg, parts):
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
        self._release_converted()
        serialize.note_changed(region.dirty_pages())
        forked = self.start_method == "fork" and self.nworkers > 0
        others = self.start_method != "fork" or self.remote > 0
        roots = []
        serialize.dumps_task({"kind": kind, "node": node, "parent": parent, "action": action, "arg": arg},
                             roots=roots, forked=forked, portable=others)
        if not others:
            return
        src = _sources(node if kind != "map" else node.deps[parent])
        every = range(node.deps[parent].num_partitions if kind == "map" else node.num_partitions)
        for p in every if parts is None else parts:
            serialize.dumps({"src": {s.id: s.task_data(p) for s in src}}, roots=roots, forked=forked,
                            portable=True)
        if roots:
            self._relocate_early(roots)

    def _relocate_early(self, roots):
        """The relocation walks of ``roots`` (and of earlier stages' objects
        the driver changed since) before the stage's version begins.  A
        walk may write region pages: an instance's dict given keys of its
        own, an object outside the region brought in.  Only a version begun
        after the write shows it, and a list of bytes the version does not
        have agrees with none of its pages (the worker that fetched one
        died).  The check after the begin (_check_in_place) then finds
        nothing to write.  A refusal is left to that check, which says it
        with the workers it concerns."""
        spawned = [w for w in self._workers.values() if w.get("spawned")]
        if not spawned or not all(w.get("same_base") for w in spawned):
            return
        rel = portable.driver()
        rel.note_changed(region.dirty_pages())
        try:
            changed = rel.prepare(roots, region.stage_current() + 1, bring_in=True,
                                  seeds_agree=all(w.get("hash_ok") for w in spawned))
        except errors.NotShareable:
            return
        self._invalidate_relocated(changed)

    def _release_converted(self):
        """Dicts that a walk replaced since the free lists were last emptied
        (walk._own_keys) may sit on CPython's free lists: the payload's own
        dicts must not be made of them, or a check remembered for an
        address would pass them as region objects.  Empty the lists then."""
        if walk.conversions[0] != self._conversions_seen:
            self._conversions_seen = walk.conversions[0]
            release_dropped()

    def _check_in_place(self, job, parts, roots):
        """Region objects travel by offset, used in place.  A worker not
        forked from the driver can use them only if they are portable: their
        pages' relocations are listed now (clamor/memory/portable.py), and
        pages whose lists changed are dropped by those workers.
        NotShareable if a task of ``parts`` may go to such a worker and they
        are not portable, or the worker cannot relocate (another region
        base, another hash seed)."""
        may = set()
        for p in parts:
            may.update(job.only.get(p) or self._workers)
        others = sorted(w for w in may if self._workers.get(w, {}).get("spawned"))
        if not others:
            return
        what = f"a region {type(roots[0]).__name__} at {id(roots[0]):#x}"
        elsewhere = [w.decode() for w in others if not self._workers[w].get("same_base")]
        if elsewhere:
            raise errors.NotShareable(
                f"{what} is used by this stage, and worker(s) {', '.join(elsewhere)} map the region at another "
                f"address (--base): Python objects built under clamor.heap() are used in place only at the "
                f"driver's address. Keep such data in region arrays, which every worker reads")
        unseeded = [w.decode() for w in others if not self._workers[w].get("hash_ok")]
        try:
            changed = portable.driver().prepare(roots, region.stage_current(), seeds_agree=not unseeded)
        except errors.NotShareable as err:
            if unseeded and "PYTHONHASHSEED" in str(err):
                raise errors.NotShareable(f"{err} (worker(s) {', '.join(unseeded)} hash differently)") from None
            raise
        self._invalidate_relocated(changed)

    def _invalidate_relocated(self, changed):
        """Spawned workers drop the pages whose relocation lists changed."""
        if changed.size:
            for w in self._workers.values():
                if w.get("spawned"):
                    w["reloc_inval"] = np.union1d(w.get("reloc_inval", changed), changed).astype(np.uint64)

    def _drive(self, asid, job, tasks, payload, extras):
        """Submit attempt ``asid`` and run the event loop until it ends."""
        self._current = (asid, payload, extras)
        self._trouble = None
        # The scheduler's clock first: a task's run time counts from the last
        # TickEvent, and before a cluster's first one the clock read 0.
        pending = collections.deque(self._sched.handle(TickEvent(time.monotonic())))
        pending.extend(self._sched.handle(StageSubmittedEvent(asid, tasks)))
        next_check = time.monotonic() + 0.5
        alone_since = None
        try:
            with Deferred() as interrupt:
                while True:
                    interrupt.check()
                    if self._trouble is not None:     # before sending anything more
                        err, self._trouble = self._trouble, None
                        raise err
                    while pending:
                        ins = pending.popleft()
                        if isinstance(ins, Run):
                            # A Run decided before its worker was lost in the same batch of
                            # events is stale: WorkerLostEvent already took the task back.
                            if ins.worker in self._workers:
                                self._send_task(ins)
                        elif isinstance(ins, Cancel):
                            if ins.worker in self._workers:
                                self._sock.send_multipart([ins.worker, b"CANCEL", pickle.dumps(ins.key)])
                            self._totals["copies_cancelled"] += 1
                        elif isinstance(ins, StageAborted) and ins.stage_id == asid:
                            raise ins.error
                        elif isinstance(ins, StageFinished) and ins.stage_id == asid:
                            return
                    if all(p in job.results for p in job.parts):
                        return        # the rest are duplicates of other attempts' tasks
                    job.bar.update(0)
                    if self._sock.poll(100):
                        pending.extend(self._sched.handle(TickEvent(time.monotonic())))
                        for _ in range(10000):
                            try:
                                frames = self._sock.recv_multipart(flags=zmq.NOBLOCK)
                            except zmq.Again:
                                break
                            pending.extend(self._on_message(frames))
                    elif self.speculation is not None:
                        pending.extend(self._sched.handle(TickEvent(time.monotonic())))
                    if time.monotonic() >= next_check:
                        pending.extend(self._check_liveness())
                        next_check = time.monotonic() + 0.5
                        if self._workers:
                            alone_since = None
                        elif alone_since is None:
                            alone_since = time.monotonic()
                        elif time.monotonic() - alone_since > self.start_timeout:
                            raise errors.WorkerLost(f"no live workers for {self.start_timeout}s")
        except BaseException:
            # Given up (a failed task, a lost input, Ctrl-C): the workers drop
            # this attempt's tasks still queued with them instead of running
            # them ahead of the next action's.
            self._cancel_attempt(asid)
            raise
        finally:
            self._current = self._trouble = None
            self._sched.handle(StageCancelledEvent(asid))
            # Runs not sent yet: their slots would never be reported free.
            for ins in pending:
                if isinstance(ins, Run):
                    self._sched.handle(TaskSkippedEvent(ins.key, ins.worker))


    def _cancel_attempt(self, asid):
        for wid in self._workers:
            for key in self._sched.running(wid):
                if key[0] == asid:
                    try:
                        self._sock.send_multipart([wid, b"CANCEL", pickle.dumps(key)], flags=zmq.NOBLOCK)
                    except zmq.ZMQError:
                        pass

    def _send_task(self, ins):
        asid, payload, extras = self._current
        job = self._jobs[asid]
        w = self._workers[ins.worker]
        if any(ins.key in other["sent"] for other in self._workers.values()):
            self._totals["speculative_copies"] += 1   # (a task re-sent after a loss is not one)
        w["sent"].add(ins.key)
        first = ins.stage_id not in w["stages"]
        w["stages"].add(ins.stage_id)
        version = job.version
        inval = self._invalidations(w, version) if w["seen"] != version else b""
        if w.get("spawned"):
            inval = self._relocation_news(ins.worker, w, inval)
        self._sock.send_multipart([ins.worker, b"TASK", pickle.dumps(ins.key), str(ins.stage_id).encode(),
                                   str(version).encode(), payload if first else b"", extras[ins.partition], inval])

    def _relocation_news(self, wid, w, inval):
        """Before a task goes to a worker not forked from the driver: the
        relocation targets it has not bound yet (TARGETS), and the pages
        whose relocation lists changed, added to ``inval``."""
        rel = portable.driver()
        specs = rel.specs_for(w["reloc_sent"])
        if specs:
            self._sock.send_multipart([wid, b"TARGETS", pickle.dumps(specs)])
            w["reloc_sent"].update(i for i, _ in specs)
        extra = w.pop("reloc_inval", None)
        if extra is None or not extra.size:
            return inval
        if inval:
            extra = np.union1d(np.frombuffer(inval, dtype=np.uint64), extra)
        return extra.astype(np.uint64).tobytes()

    def _locs(self, version):
        """Where the blocks are, for tasks reading at ``version``: cached
        partitions made after it are not theirs to read (they compute
        those), each named with the version it was made at."""
        eps = {w: info["blocks"] for w, info in self._workers.items()}
        lin = self._lineage
        cache = {k: (eps[w], lin.cache_made[k]) for k, w in lin.cache.items()
                 if w in eps and lin.cache_made[k] <= version}
        # copies restored from an unpersisted collection's snapshot, for a re-run that read it
        cache.update({k: (eps[w], v) for k, (w, v) in lin.restored_locs(version).items() if w in eps})
        return {"shuffle": {s: (lin.shuffle_made[s], [eps.get(w) for w in locs]) for s, locs in lin.shuffles.items()},
                "cache": cache, "restore": lin.restore_ids(version)}

    # -- messages -----------------------------------------------------------------------
    # frames in each message a worker sends, its identity first
    _FRAMES = {b"HB": 3, b"JOIN": 3, b"LEAVE": 3, b"HELLO": 3, b"DONE": 5, b"SKIP": 4, b"FAIL": 5}

    def _on_message(self, frames):
        if len(frames) < 2 or self._FRAMES.get(frames[1], len(frames)) != len(frames):
            log.warning("dropped a malformed message of %d frames (%r)", len(frames), frames[1:2])
            return []
        ident, kind = frames[0], frames[1]
        if kind == b"HB":
            wid = frames[2]
            if wid in self._workers:
                self._workers[wid]["last_hb"] = time.monotonic()
            return []
        if kind == b"JOIN":
            return self._join(ident, frames[2])
        if kind == b"LEAVE":
            return self._left(frames[2])
        if kind == b"HELLO":
            return self._joined(ident, pickle.loads(frames[2]))
        w = self._workers.get(ident)
        if w is None:       # a worker already declared lost: nothing it says counts
            return []
        w["last_hb"] = time.monotonic()
        if kind not in (b"DONE", b"SKIP", b"FAIL"):
            return []
        key = pickle.loads(frames[2])
        w["sent"].discard(key)
        self._account(w, key[0], frames[3 if kind == b"SKIP" else 4])
        if kind == b"DONE":
            res = serialize.loads(frames[3])
            job = self._jobs.get(key[0])
            if job is not None:
                for cid, p in res["cached"]:
                    # A re-run only restores partitions cached before: one it
                    # computes on the way for the first time read old globals.
                    if not job.rerun or (cid, p) in self._lineage.cache_made:
                        self._lineage.cached(cid, p, ident, job.version)
                    if job.rerun:
                        self._lineage.restored_copy(cid, p, job.version, ident)
                if key[1] not in job.results:
                    # a map task's result is where its buckets are: the worker itself
                    job.results[key[1]] = ident if job.kind == "map" else res["value"]
                    self._affinity[(len(job.parts), key[1])] = ident
                    stat = job.stat
                    if "durations" in stat:   # (an earlier attempt's stats are closed)
                        stat["durations"].append(res["duration"])
                        job.bar.update()
                else:
                    self._totals["duplicate_results"] += 1
            return self._sched.handle(TaskDoneEvent(key, ident, None))
        if kind == b"SKIP":
            return self._sched.handle(TaskSkippedEvent(key, ident))
        if kind == b"FAIL":
            msg, tb, missing = pickle.loads(frames[3])
            if missing is None:
                return self._sched.handle(TaskFailedEvent(key, ident, errors.TaskError(msg, tb)))
            # A block this task needed could not be fetched.
            if not self.recover:
                return self._sched.handle(TaskFailedEvent(key, ident, errors.WorkerLost(msg)))
            by_ep = {info["blocks"]: wid for wid, info in self._workers.items()}
            for ep, block in missing:
                if ep in by_ep:
                    self._lineage.lose_block(by_ep[ep], block)
            if self._current is not None and key[0] == self._current[0]:
                self._trouble = self._trouble or _InputsLost(msg)
            return self._sched.handle(TaskSkippedEvent(key, ident))
        return []   # (not reached: DONE, SKIP and FAIL are handled above)

    def _account(self, w, asid, frame):
        """Count what worker ``w`` moved since its previous report (or its
        HELLO) for attempt ``asid``, the one this report is about.  Workers
        send their cumulative counters with every DONE, SKIP and FAIL, so the
        figures add up by construction: a losing copy's fetches count, so
        do a failed task's and read-ahead that landed after a task ended
        (in the worker's next report), and nothing counts twice.  Each worker's
        reports arrive in order on one socket."""
        try:
            now = serialize.unpack_counters(frame)
        except errors.ProtocolError as err:   # counted nowhere, rather than stop the action
            log.warning("worker %s sent a malformed report: %s", w.get("pid"), err)
            return
        last = w.get("counters") or {}
        w["counters"] = now
        w["served"], w["followed"], w["fallbacks"] = now["served"], now["redirects"], now["fallbacks"]
        w["direct"], w["timeouts"] = now["direct"], now["timeouts"]
        moved = ("faults", "bytes_fetched", "bytes_from_peers", "mapped", "wire", "diff_wire", "diff_pages")
        if any(now[k] < last.get(k, 0) for k in moved):
            last = {}   # a task zeroed the worker's counters (clamor.reset_stats())
        d = {k: now[k] - last.get(k, 0) for k in moved}
        # (The worker's snapshot reads bytes_fetched and bytes_from_peers one
        # after the other: a fetch landing between them can move one run of
        # pages between the two columns of consecutive reports, never in or
        # out of their sum.)
        self._count_moved(asid, {"faults": d["faults"], "bytes_from_peers": d["bytes_from_peers"],
                                 "bytes_from_driver": d["bytes_fetched"] - d["bytes_from_peers"],
                                 "bytes_mapped": d["mapped"], "wire_bytes": d["wire"],
                                 "wire_bytes_diff": d["diff_wire"], "diff_pages": d["diff_pages"]})

    def _join(self, ident, frame):
        """A worker not forked from here asks to join (clamor/runtime/worker.py):
        one this cluster spawned, or one of its ``remote`` workers."""
        try:
            body = read_join(frame)
            pid, pidns = body["pid"], body["pidns"]
        except (ValueError, TypeError, KeyError) as err:
            log.warning("dropped a malformed JOIN: %s", err)
            return []
        local = shares_pids(pidns)
        if local and not pid_alive(pid):    # it gave up waiting for an answer (the driver was not reading)
            return []
        wid = self._joining.pop(pid, None) if local else None
        if wid is None:
            if self._closed or self._remote_open <= 0:
                reason = ("the cluster is closed" if self._closed else
                          f"it expects no more workers ({self.remote} remote, all joined)")
                self._sock.send_multipart([ident, b"REFUSED", json.dumps({"reason": reason}).encode()])
                return []
            self._remote_open -= 1
            wid = b"w%d" % next(self._wids)
            self._remote.add(wid)
            if not local:
                self._far.add(wid)
            self._pid_of[wid] = pid
            self._expected.add(wid)
        self._joined_ids.add(wid)
        self._welcomed_at[wid] = time.monotonic()
        base = body["base"]
        self._join_info[wid] = {"hash_ok": body["hash"] == portable.hash_digest(),
                                "same_base": base is None or base == region.base()}
        self._sock.send_multipart([ident, b"WELCOME", welcome(self.page_endpoint, wid=wid.decode(),
                                   same_host=samehost.info() if self.same_host == "map" else None)])
        return []

    def _left(self, frame):
        """A welcomed worker that will not join after all (its images differ
        from the driver's): its place is free again."""
        try:
            body = read_leave(frame)
            wid = body["wid"].encode()
        except (ValueError, TypeError, KeyError, AttributeError) as err:   # (no wid: AttributeError)
            log.warning("dropped a malformed LEAVE: %s", err)
            return []
        if wid in self._expected and wid in self._joined_ids:
            self._expected.discard(wid)
            self._joining = {p: w for p, w in self._joining.items() if w != wid}
            if wid in self._remote:
                self._remote.discard(wid)
                self._remote_open += 1
            log.warning("worker %s (pid %s) refused to join: %s", wid.decode(), self._pid_of.get(wid),
                        body["reason"])
        return []

    def _joined(self, wid, info):
        if wid in self._workers or wid not in self._expected:
            return []
        self._expected.discard(wid)
        self._welcomed_at.pop(wid, None)
        self._start_failures = 0
        # A forked worker's copies reflect the stage it was forked at, which a
        # stage begun before its HELLO may have changed; one that joined has
        # fetched nothing yet.
        seen = self._born.pop(wid, region.stage_current())
        mode = info.get("same_host") if isinstance(info.get("same_host"), dict) else {}
        info["same_host"] = {"mode": "map" if mode.get("mode") == "map" else "fetch", "reason": str(mode.get("reason", ""))[:500]}
        if self.same_host == "map" and info["same_host"]["mode"] == "fetch":
            log.log(logging.INFO if wid in self._far else logging.WARNING, "worker %s fetches the driver's pages "
                    "instead of mapping them: %s", wid.decode(), info["same_host"]["reason"])
        info.update(last_hb=time.monotonic(), stages=set(), seen=seen, sent=set(),
                    far=wid in self._far, spawned=wid in self._joined_ids, reloc_sent=set(),
                    **self._join_info.pop(wid, {}))
        self._workers[wid] = info
        for other in self._workers:   # its endpoint may be a lost worker's, reused: no longer dead
            if other != wid:
                self._sock.send_multipart([other, b"LIVE", pickle.dumps([info["blocks"]])])
        replacement = int(wid[1:]) >= self.nworkers + self.remote
        log.log(logging.INFO if replacement else logging.DEBUG, "worker %s (pid %d) joined", wid.decode(), info["pid"])
        slots = info.get("slots")
        if isinstance(slots, bool) or not isinstance(slots, int) or not 1 <= slots <= 4096:
            slots = self.slots    # (None: the cluster's)
        return self._sched.handle(WorkerJoinedEvent(wid, slots))

    # -- losing workers -----------------------------------------------------------------
    def _check_liveness(self):
        out = []
        now = time.monotonic()
        for wid, info in list(self._workers.items()):
            reason = None
            try:
                if not info["far"] and psutil.Process(info["pid"]).status() == psutil.STATUS_ZOMBIE:
                    reason = "process exited"
            except psutil.NoSuchProcess:
                reason = "process gone"
            if reason is None and info["far"] and not self._connected(wid):
                reason = "its connection closed"
            if reason is None and now - info["last_hb"] > self.heartbeat_timeout:
                reason = f"no heartbeat for {now - info['last_hb']:.1f}s"
            if reason:
                out.extend(self._lose(wid, reason))
        for wid in list(self._expected):   # a replacement that died before its HELLO
            if wid in self._far:
                # no pid to check: one silent past start_timeout after its WELCOME is gone
                if now - self._welcomed_at.get(wid, now) > self.start_timeout:
                    self._expected.discard(wid)
                    self._remote.discard(wid)
                    self._remote_open += 1
                    log.warning("worker %s was welcomed %.0f s ago and never said HELLO; its place is open "
                                "again", wid.decode(), now - self._welcomed_at.pop(wid))
                continue
            pid = self._pid_of[wid]
            try:
                dead = psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                dead = True
            if dead:
                self._expected.discard(wid)
                self._totals["workers_lost"] += 1
                self._start_failures += 1
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass
                if self._start_failures > self.max_attempts:
                    log.error("worker %s (pid %d) died while starting; %d replacements have failed to start, "
                              "not forking more", wid.decode(), pid, self._start_failures)
                    if self._current is not None and not self._workers and not self._expected:
                        self._trouble = self._trouble or errors.WorkerLost(
                            f"no live workers ({self._start_failures} replacements died while starting)")
                    continue
                log.warning("worker %s (pid %d) died while starting", wid.decode(), pid)
                self._replace(wid)
        return out

    def _connected(self, wid):
        """Whether the control socket still has a connection to ``wid``: a
        worker this host cannot check by pid is lost as soon as its
        connection closes, not only after ``heartbeat_timeout``."""
        self._sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        try:
            self._sock.send_multipart([wid, b"PING"], flags=zmq.NOBLOCK)
            return True
        except zmq.ZMQError as err:
            return err.errno != zmq.EHOSTUNREACH    # (EAGAIN: its queue is full, but it is there)
        finally:
            self._sock.setsockopt(zmq.ROUTER_MANDATORY, 0)

    def _lose(self, wid, reason):
        info = self._workers.pop(wid)
        self._gone[wid] = {k: info[k] for k in ("served", "followed", "fallbacks", "direct", "timeouts") if k in info}
        log.warning("worker %s (pid %d) lost: %s", wid.decode(), info["pid"], reason)
        self._totals["workers_lost"] += 1
        # One that stopped answering may still run: it must not come back.
        # Once reaped, close() must never wait for, or kill, its reused pid.
        if info["far"]:
            self._sock.send_multipart([wid, b"STOP"])
        elif _kill_and_reap(info["pid"]) and info["pid"] in self._pids:
            self._pids.remove(info["pid"])
        if info.get("pages"):
            region.forget_peer(info["pages"])
        # What it was running: tasks sent to it and not reported.  (The
        # scheduler may have given it more, in a batch of losses declared
        # one by one: those it never had.)
        running = self._sched.running(wid) & info["sent"]
        shuffles, keys = self._lineage.lose_worker(wid)
        for other in self._workers:   # fetches from it fail at once rather than time out
            self._sock.send_multipart([other, b"LOST", pickle.dumps([info["blocks"]]),
                                       pickle.dumps([info["pages"]] if info.get("pages") else [])])
        out = self._sched.handle(WorkerLostEvent(wid, reason))
        self._replace(wid)
        if self.recover and self._current is not None:
            t = self._loss_trouble(wid, reason, running, shuffles, keys)
            # giving up outranks retrying: with no worker left, a retry would wait start_timeout for nothing
            if t is not None and (self._trouble is None or isinstance(t, errors.WorkerLost)):
                self._trouble = t
        return out

    def _replace(self, wid):
        """A local worker lost gets a replacement (``replace_workers``); a
        remote one leaves its place to the next worker that joins."""
        if wid in self._remote:
            self._remote_open += 1
        elif self.replace_workers and not self._closed:
            self._spawn_worker()

    def _loss_trouble(self, wid, reason, running, shuffles, keys):
        """What losing ``wid`` means for the running attempt: None (its
        tasks were re-queued), _InputsLost (retry), or WorkerLost (give up)."""
        asid = self._current[0]
        job = self._jobs[asid]
        for key in running:
            if key[0] == asid and key[1] not in job.results:   # (not a copy that lost the race anyway)
                job.losses[key[1]] += 1
                self._totals["tasks_rerun"] += 1
                if job.losses[key[1]] >= self.max_attempts:
                    return errors.WorkerLost(f"partition {key[1]} of stage {job.version} was lost with its worker "
                                             f"{job.losses[key[1]]} times (last: worker {wid.decode()}: {reason})")
        if not self._workers and not self._expected and not self.replace_workers:
            return errors.WorkerLost(f"no live workers (worker {wid.decode()} lost: {reason})")
        read_shuffles, read_cache = job.reads
        outputs_lost = job.kind == "map" and any(w == wid for w in job.results.values())
        if outputs_lost or shuffles & read_shuffles or keys & read_cache:
            return _InputsLost(f"worker {wid.decode()} lost: {reason}")
        return None

    # -- dropping blocks ----------------------------------------------------------------
    def _forget(self, prefix):
        # Called by a finalizer, so at any moment and in any thread: only
        # note it; the blocks are dropped before the next stage.
        self._forgotten.append(prefix)

    def _drop_forgotten(self):
        drops = []
        while self._forgotten:
            prefix = self._forgotten.popleft()
            drops.append(prefix)
            self._lineage.forget(*prefix)
        if drops:
            for wid in self._workers:
                self._sock.send_multipart([wid, b"DROP", pickle.dumps(drops)])

    def _drop_cache(self, cid):
        """``unpersist``: the workers drop the copies; lineage keeps the
        versions they were made at for re-runs of the stages so far."""
        if self._closed or not self._started:
            return
        self._lineage.unpersist(cid, until=region.stage_current() + 1)
        for wid in self._workers:
            self._sock.send_multipart([wid, b"DROP", pickle.dumps([("cache", cid)])])

    def _drop_restored(self):
        """The action ended: the copies restored for its re-runs go."""
        keys = self._lineage.drop_restored()
        if keys and not self._closed:
            for wid in self._workers:
                self._sock.send_multipart([wid, b"DROP", pickle.dumps(keys)])


def _kill_and_reap(pid, wait=1.0):
    """SIGKILL a worker and reap it (a zombie otherwise until close()).
    Bounded: a process stuck in the kernel is reaped by close() instead.
    True once it is reaped (or was already)."""
    try:
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + wait
        while not os.waitpid(pid, os.WNOHANG)[0]:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.002)
    except (ProcessLookupError, ChildProcessError):
        pass
    return True


def _cached_ids(node):
    out, stack = set(), [node]
    while stack:
        c = stack.pop()
        if c.cached:
            out.add(c.id)
        stack.extend(c.deps)
    return out


def _sources(node):
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


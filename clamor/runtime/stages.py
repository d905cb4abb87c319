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
attempts, fails with WorkerLost.  (A job's record: clamor/runtime/job.py.)

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
import itertools
import logging
import pickle
import time

import numpy as np
import zmq

from .. import errors
from ..memory import region
from . import serialize
from .collection import Shuffled
from ..memory.heap import outside, release_dropped
from ..memory import walk
from .interrupt import Deferred
from .job import _InputsLost, _Job, _cached_ids
from .progress import StageProgress
from .shipping import sources as shipped_sources
from .scheduler import (Cancel, Run, StageAborted, StageCancelledEvent, StageFinished, StageSubmittedEvent, TaskDoneEvent,
                        TaskFailedEvent, TaskSkippedEvent, TickEvent, TaskSpec, WorkerJoinedEvent, WorkerLostEvent)

log = logging.getLogger("clamor")


class StageRunner:
    """Runs a Cluster's stages (see the module docstring), on its parts:
    the control socket ``sock``, the workers (``pool``, runtime/pool.py),
    the lineage store, the scheduler, the version keeper, the in-place
    checks (``shipping``) and the accounts; ``forgotten``: the queue of
    blocks whose collection is gone (filled by finalizers).  ``opts``: the
    Cluster's RecoveryOptions; ``slots`` and ``progress`` its own."""

    # Page versions kept only for the snapshots of unpersisted collections
    # (beyond those of live outputs): past this many, the oldest expire.
    unpersisted_versions = 8

    def __init__(self, sock, pool, lineage, sched, versions, shipping, accounts, forgotten, opts, slots, progress):
        self._sock, self._pool, self._lineage, self._sched = sock, pool, lineage, sched
        self._versions, self._shipping, self._accounts = versions, shipping, accounts
        self._forgotten = forgotten
        self.recover, self.replace_workers, self.max_attempts = opts.recover, opts.replace_workers, opts.max_attempts
        self.speculation, self.start_timeout = opts.speculation, opts.start_timeout
        self.slots, self.progress = slots, progress
        self.closed = False
        self._idle_since = None  # when the last action ended: nobody read the socket since
        self._jobs = {}         # attempt (scheduler stage id) -> its job
        self._attempt_version = {}  # attempt -> its version, while a task of it may run
        self._attempt_ids = itertools.count(1)
        self._current = self._trouble = None
        self._affinity = {}     # (partitions in stage, partition) -> worker that last ran it

    # -- planning -----------------------------------------------------------------------
    @outside
    def run_action(self, node, kind, arg, partitions=None, only=None):
        release_dropped()
        self._shipping.conversions_seen = walk.conversions[0]
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
            self._pool.heard.pause(now - idle)
            self._idle_since = None
        with Deferred() as interrupt:
            for _ in range(100000):
                try:
                    frames = self._sock.recv_multipart(flags=zmq.NOBLOCK)
                except zmq.Again:
                    break
                for ins in self._on_message(frames):
                    # (no stage runs, so nothing is assigned: only late copies are cancelled)
                    if isinstance(ins, Cancel) and ins.worker in self._pool.workers:
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

    def _begin_version(self):
        """Begin the next page version, which a new stage reads at, and end
        the driver's epoch: pages written since the last version are
        versioned, and the changed ones listed for the workers to drop."""
        self._drop_forgotten()
        # notice workers that died while the cluster was idle, before giving
        # them tasks; first read the heartbeats that came meanwhile (the
        # check before a stage, Shipping.vouch, may take longer than the time-out)
        self._catch_up()
        for ins in self._check_liveness():
            if isinstance(ins, StageAborted):
                raise ins.error
        if not self._pool.workers and not self._pool.expected:   # none left, none coming
            raise errors.WorkerLost("no live workers (every worker was lost and none is being replaced)")
        sid = self._versions.begin()
        self._keep_versions(sid)
        return sid

    def _keep_versions(self, sid):
        """Free the page versions no task can read any more (``sid`` the
        newest), as a stage begins and as it ends: then the driver's next
        writes copy pages where the versions its workers left were."""
        # Worth keeping: the versions a task may still read at: this one,
        # those recorded outputs were made at (lineage re-runs read there),
        # those of tasks still running (a losing copy, or one that outlived
        # a failed attempt).  Not one per stage between them: a collection
        # cached once, then a global updated at every stage, kept a version
        # per stage, and the driver ran out of room for them.
        running = {k[0] for w in self._pool.workers for k in self._sched.running(w)}
        self._attempt_version = {a: v for a, v in self._attempt_version.items() if a in running or a in self._jobs}
        self._lineage.prune(self.unpersisted_versions)
        # A worker may read the stage it last ran at until its next task drops
        # what changed (a mapping one its locations; a fetching one's collector
        # visits its region objects between tasks).
        mapping = {w.seen for w in self._pool.workers.values() if w.maps}
        last_ran = {w.seen for w in self._pool.workers.values()}
        running_at = set(self._attempt_version.values())
        keep = self._versions.keep({sid} | self._lineage.versions() | running_at | last_ran,
                                   floor=min({sid} | mapping | running_at))
        self._versions.trim(set(keep) | last_ran)   # (change lists go from a worker's version to these)

    def _invalidations(self, w, version):
        """Pages worker ``w`` must drop before a task at ``version``: those
        changed at every stage boundary between the version its copies
        reflect and ``version`` (either way: a re-run goes back)."""
        seen, w.seen = w.seen, version
        # (its mappings of pages that moved name the old locations)
        return self._versions.invalidations(seen, version, maps=w.maps).astype(np.uint64).tobytes()

    # -- jobs and attempts ----------------------------------------------------------
    def _run_job(self, kind, node, parent=None, action=None, arg=None, parts=None, version=None, only=None):
        rerun = version is not None
        if version is None:
            self._shipping.vouch(kind, node, parent, action, arg, parts)
            version = self._begin_version()
        if kind == "map":
            parts = list(range(node.deps[parent].num_partitions)) if parts is None else parts
            self._lineage.shuffle_started(node.shuffle_ids[parent], node.deps[parent].num_partitions, version)
        job = _Job(kind, node, parent, action, arg, parts, version, rerun, only)
        if rerun:
            self._accounts.totals["recovery_jobs"] += 1
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
            for p in job.parts:
                self._lineage.map_output(node.shuffle_ids[parent], p, job.results[p])
        if not rerun:
            self._keep_versions(region.version_current())
        return None if kind == "map" else [job.results[p] for p in job.parts]

    def _run_attempts(self, job):
        kind = job.kind
        while True:
            self._ensure_inputs(job)
            if kind == "map":   # an output is only as good as its worker
                for p in [p for p, w in job.results.items() if w not in self._pool.workers]:
                    del job.results[p]
            missing = [p for p in job.parts if p not in job.results]
            if not missing:
                break
            if job.attempts >= self.max_attempts:
                raise errors.WorkerLost(f"stage {job.version}: gave up after {job.attempts} attempts lost to failed "
                                        f"workers ({len(missing)} of {len(job.parts)} partitions missing)")
            if not self._pool.workers and not self._pool.expected:
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
        self._shipping.release_converted()
        forked, others = self._shipping.forked, self._shipping.others
        payload = serialize.dumps_task({"kind": job.kind, "node": node, "parent": job.parent,
                                        "action": job.action, "arg": job.arg, "locs": self._locs(job.version)},
                                       objects=in_place, roots=roots, forked=forked, portable=others,
                                       version=job.version)
        sources = shipped_sources(job.computes)
        extras = {p: serialize.dumps({"p": p, "src": {s.id: s.task_data(p) for s in sources}}, objects=in_place,
                                     roots=roots, forked=forked, portable=others, version=job.version)
                  for p in missing}
        if roots:
            self._shipping.check_in_place(job, missing, roots)
        lineage = _cached_ids(node)
        nparts = len(job.parts)
        tasks = []
        # A worker is preferred for at most its fair share of the stage, so
        # a replacement (or any worker that ran nothing here before) is not
        # left idle while another holds every partition's affinity.
        share = -(-len(missing) // max(1, len(self._pool.workers)))
        affine = collections.Counter()
        for p in missing:
            cached = tuple({w for (c, q), w in self._lineage.cache.items() if q == p and c in lineage})
            # Otherwise the worker that last ran partition p of a stage this
            # wide: iterative jobs re-read the same region pages, which that
            # worker holds already.
            last = self._affinity.get((nparts, p))
            prefer = cached
            if not prefer and last in self._pool.workers and affine[last] < share:
                affine[last] += 1
                prefer = (last,)
            tasks.append(TaskSpec((asid, p), asid, p, prefer, job.only.get(p, ())))
        stat = {"stage": job.version, "kind": job.kind if job.kind == "map" else job.action, "tasks": len(tasks),
                "durations": [], "faults": 0, "bytes_from_driver": 0, "bytes_from_peers": 0, "bytes_mapped": 0,
                "wire_bytes": 0, "wire_bytes_diff": 0, "diff_pages": 0,
                "payload_bytes": len(payload), "task_data_bytes": sum(len(e) for e in extras.values()),
                "attempt": job.attempts, "rerun": job.rerun}
        job.stat, job.bar = stat, StageProgress(len(tasks), desc, self.progress)
        self._accounts.opened(asid, stat)
        self._jobs[asid] = job
        self._attempt_version[asid] = job.version
        for w in self._pool.workers.values():   # payloads sent, of attempts still in progress only
            w.stages.intersection_update(self._jobs)
        job.asids.append(asid)
        t0 = time.perf_counter()
        log.debug("%s: %d tasks (attempt %d)", desc, len(tasks), job.attempts)
        try:
            self._drive(asid, job, tuple(tasks), payload, extras)
        finally:
            job.bar.close()
            stat["duration_s"] = time.perf_counter() - t0
            self._accounts.record(stat)

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
                            if ins.worker in self._pool.workers:
                                self._send_task(ins)
                        elif isinstance(ins, Cancel):
                            if ins.worker in self._pool.workers:
                                self._sock.send_multipart([ins.worker, b"CANCEL", pickle.dumps(ins.key)])
                            self._accounts.totals["copies_cancelled"] += 1
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
                        if self._pool.workers:
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
        for wid in self._pool.workers:
            for key in self._sched.running(wid):
                if key[0] == asid:
                    try:
                        self._sock.send_multipart([wid, b"CANCEL", pickle.dumps(key)], flags=zmq.NOBLOCK)
                    except zmq.ZMQError:
                        pass

    def _send_task(self, ins):
        asid, payload, extras = self._current
        job = self._jobs[asid]
        w = self._pool.workers[ins.worker]
        if any(ins.key in other.sent for other in self._pool.workers.values()):
            self._accounts.totals["speculative_copies"] += 1   # (a task re-sent after a loss is not one)
        w.sent.add(ins.key)
        first = ins.stage_id not in w.stages
        w.stages.add(ins.stage_id)
        version = job.version
        inval = self._invalidations(w, version) if w.seen != version else b""
        if w.spawned:
            inval = self._shipping.relocation_news(ins.worker, w, inval)
        self._sock.send_multipart([ins.worker, b"TASK", pickle.dumps(ins.key), str(ins.stage_id).encode(),
                                   str(version).encode(), payload if first else b"", extras[ins.partition], inval])

    def _locs(self, version):
        """Where the blocks are, for tasks reading at ``version``: cached
        partitions made after it are not theirs to read (they compute
        those), each named with the version it was made at."""
        eps = {w: info.blocks for w, info in self._pool.workers.items()}
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
            if frames[2] in self._pool.workers:
                self._pool.heard.heard(frames[2])
            return []
        if kind == b"JOIN":
            self._pool.join(ident, frames[2])
            return []
        if kind == b"LEAVE":
            self._pool.left(frames[2])
            return []
        if kind == b"HELLO":
            return self._joined(ident, pickle.loads(frames[2]))
        w = self._pool.workers.get(ident)
        if w is None:       # a worker already declared lost: nothing it says counts
            return []
        self._pool.heard.heard(ident)
        if kind not in (b"DONE", b"SKIP", b"FAIL"):
            return []
        key = pickle.loads(frames[2])
        w.sent.discard(key)
        self._accounts.account(w, key[0], frames[3 if kind == b"SKIP" else 4])
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
                    self._accounts.totals["duplicate_results"] += 1
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
            by_ep = {info.blocks: wid for wid, info in self._pool.workers.items()}
            for ep, block in missing:
                if ep in by_ep:
                    self._lineage.lose_block(by_ep[ep], block)
            if self._current is not None and key[0] == self._current[0]:
                self._trouble = self._trouble or _InputsLost(msg)
            return self._sched.handle(TaskSkippedEvent(key, ident))
        return []   # (not reached: DONE, SKIP and FAIL are handled above)

    def _joined(self, wid, info):
        rec = self._pool.hello(wid, info)
        if rec is None:
            return []
        slots = rec.slots
        if isinstance(slots, bool) or not isinstance(slots, int) or not 1 <= slots <= 4096:
            slots = self.slots    # (None: the cluster's)
        return self._sched.handle(WorkerJoinedEvent(wid, slots))

    # -- losing workers -----------------------------------------------------------------
    def _check_liveness(self):
        out = []
        trouble = self._pool.check(lambda wid, reason: out.extend(self._lose(wid, reason)))
        if trouble is not None and self._current is not None:
            self._trouble = self._trouble or trouble
        return out

    def _lose(self, wid, reason):
        rec = self._pool.remove(wid, reason)
        # What it was running: tasks sent to it and not reported.  (The
        # scheduler may have given it more, in a batch of losses declared
        # one by one: those it never had.)
        running = self._sched.running(wid) & rec.sent
        shuffles, keys = self._lineage.lose_worker(wid)
        self._pool.tell_lost(rec)
        out = self._sched.handle(WorkerLostEvent(wid, reason))
        self._pool.replace(wid)
        if self.recover and self._current is not None:
            t = self._loss_trouble(wid, reason, running, shuffles, keys)
            # giving up outranks retrying: with no worker left, a retry would wait start_timeout for nothing
            if t is not None and (self._trouble is None or isinstance(t, errors.WorkerLost)):
                self._trouble = t
        return out

    def _loss_trouble(self, wid, reason, running, shuffles, keys):
        """What losing ``wid`` means for the running attempt: None (its
        tasks were re-queued), _InputsLost (retry), or WorkerLost (give up)."""
        asid = self._current[0]
        job = self._jobs[asid]
        for key in running:
            if key[0] == asid and key[1] not in job.results:   # (not a copy that lost the race anyway)
                job.losses[key[1]] += 1
                self._accounts.totals["tasks_rerun"] += 1
                if job.losses[key[1]] >= self.max_attempts:
                    return errors.WorkerLost(f"partition {key[1]} of stage {job.version} was lost with its worker "
                                             f"{job.losses[key[1]]} times (last: worker {wid.decode()}: {reason})")
        if not self._pool.workers and not self._pool.expected and not self.replace_workers:
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
            self._pool.send_all(b"DROP", pickle.dumps(drops))

    def _drop_cache(self, cid):
        """``unpersist``: the workers drop the copies; lineage keeps the
        versions they were made at for re-runs of the stages so far."""
        if self.closed:
            return
        self._lineage.unpersist(cid, until=region.version_current() + 1)
        self._pool.send_all(b"DROP", pickle.dumps([("cache", cid)]))

    def _drop_restored(self):
        """The action ended: the copies restored for its re-runs go."""
        keys = self._lineage.drop_restored()
        if keys and not self.closed:
            self._pool.send_all(b"DROP", pickle.dumps(keys))

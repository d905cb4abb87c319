"""Cluster: the driver side of the BSP runtime.

DESIGN.  The embedded default forks N local workers from the driver.  Fork,
not spawn: Python objects the driver builds in the region point at type
objects and other interpreter state outside it, and those addresses are
only the same in a process of the same image.  Each worker gets its pager
and page server back after fork (clamor/region.py) and runs
clamor.executor.Runtime.

The driver thread that calls an action does everything: it plans stages
(one per shuffle, then the result stage), feeds events to the pure
scheduler (clamor/scheduler.py) and carries out its instructions over one
ROUTER socket.  Results become visible only when a stage finishes (the BSP
barrier).  A worker that dies is noticed through psutil (local processes)
or a missing heartbeat, and the stage fails with WorkerLost.
"""
import atexit
import collections
import logging
import os
import pickle
import signal
import statistics
import time
import weakref

import numpy as np
import psutil
import zmq

from . import errors, region, serialize
from .collection import NpyFiles, Parallel, Range, Shuffled, TextFiles
from .executor import worker_main
from .heap import install as install_heap_hooks
from .share import note_fork
from .progress import StageProgress
from .scheduler import (Run, Scheduler, StageAborted, StageFinished, StageSubmitted, TaskDone, TaskFailed,
                        TaskSpec, WorkerJoined, WorkerLost)

log = logging.getLogger("clamor")
_live = weakref.WeakSet()
# Redirect a page request to a worker that holds the page (paper section 4.2):
# never, to a random holder, or to the less loaded of two random holders.
REPLICATION = {"off": 0, "random": 1, "two-choices": 2}


@atexit.register
def _close_all():
    for cl in list(_live):
        cl.close()


class Cluster:
    """A driver and ``workers`` local worker processes.

    ``page_size``/``region_size``/``base`` set the region's geometry if this
    process has no region yet.  ``slots`` is how many tasks a worker may hold
    at once (running plus queued).  ``progress``: None shows a bar for stages
    over two seconds when stderr is a terminal; False never does.
    """

    def __init__(self, workers=None, page_size=None, region_size=None, base=None, slots=2, progress=None,
                 heartbeat_timeout=10.0, start_timeout=60.0, replication="two-choices"):
        if workers is None:
            workers = os.cpu_count() or 1
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise errors.ConfigError(f"workers must be a positive int, not {workers!r}")
        if not isinstance(slots, int) or slots < 1:
            raise errors.ConfigError(f"slots must be a positive int, not {slots!r}")
        if replication not in REPLICATION:
            raise errors.ConfigError(f"replication must be one of {sorted(REPLICATION)}, not {replication!r}")
        self.replication = replication
        self.nworkers = workers
        self.slots = slots
        self.progress = progress
        self.heartbeat_timeout = heartbeat_timeout
        self.start_timeout = start_timeout
        self._geometry = (base, region_size, page_size)
        self._started = self._closed = False
        self._stage_stats = collections.deque(maxlen=1000)
        self._totals = collections.Counter()
        self._forgotten = collections.deque()  # blocks whose collection is gone

    # -- life cycle -------------------------------------------------------------------
    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.close()

    def start(self):
        if self._started:
            return self
        base, size, psize = self._geometry
        if region.role() is None:
            region.init(base=base, size=size, page_size=psize)
        elif region.role() != "driver":
            raise errors.RegionError("a Cluster runs in the driver, and this process is a worker")
        elif psize and psize != region.page_size():
            raise errors.ConfigError(f"the region already has {region.page_size()}-byte pages; "
                                     f"a cluster cannot use {psize} (page size is fixed per region)")
        self.page_endpoint = region.server_endpoint() or region.serve()
        region.set_replication(REPLICATION[self.replication])
        region.reset_peers()  # holders from an earlier cluster in this process are gone
        # Workers inherit the allocator wrappers: a region object a worker
        # drops must never reach glibc's or pymalloc's free.
        install_heap_hooks()
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.linger = 0
        self._sock.bind("tcp://127.0.0.1:*")
        self.endpoint = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._sched = Scheduler()
        self._workers = {}      # wid -> {"pid", "blocks", "last_hb", "stages"}
        self._pids = []
        note_fork()
        me = os.getpid()
        for i in range(self.nworkers):
            wid = b"w%d" % i
            pid = os.fork()
            if pid == 0:
                worker_main(self.endpoint, wid, me)
            self._pids.append(pid)
        self._started = True
        _live.add(self)
        try:
            self._await_workers()
        except BaseException:
            self.close()
            raise
        self._shuffle_locs = {}  # shuffle id -> [blocks endpoint per map partition]
        self._cache_locs = {}    # (collection id, partition) -> wid
        self._made_at = {}       # shuffle id or (collection id, partition) -> stage that made it
        self._changes = {}       # stage -> pages the driver changed just before it
        self._affinity = {}      # (partitions in stage, partition) -> worker that last ran it
        log.info("cluster up: %d workers, page server %s", self.nworkers, self.page_endpoint)
        return self

    def _await_workers(self):
        deadline = time.monotonic() + self.start_timeout
        while len(self._workers) < self.nworkers:
            left = deadline - time.monotonic()
            if left <= 0 or not self._sock.poll(int(min(left, 0.5) * 1000)):
                self._check_pids_at_start()
                if left <= 0:
                    raise errors.WorkerLost(f"{len(self._workers)} of {self.nworkers} workers started "
                                            f"within {self.start_timeout}s")
                continue
            frames = self._sock.recv_multipart()
            if frames[1] == b"HELLO":
                info = pickle.loads(frames[2])
                info.update(last_hb=time.monotonic(), stages=set(), seen=region.stage_current())
                self._workers[frames[0]] = info
                self._sched.handle(WorkerJoined(frames[0], self.slots))

    def _check_pids_at_start(self):
        for pid in self._pids:
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done:
                raise errors.WorkerLost(f"worker process {pid} exited during start-up")

    def close(self, timeout=5.0):
        """Stop every worker (STOP, then SIGKILL after ``timeout``) and reap."""
        if self._closed or not self._started:
            self._closed = True
            return
        self._closed = True
        _live.discard(self)
        for wid in list(getattr(self, "_workers", {})):
            try:
                self._sock.send_multipart([wid, b"STOP"], flags=zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
        deadline = time.monotonic() + timeout
        for pid in self._pids:
            while True:
                try:
                    done, _ = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    break
                if done:
                    break
                if time.monotonic() > deadline:
                    try:
                        os.kill(pid, signal.SIGKILL)
                        os.waitpid(pid, 0)
                    except (ProcessLookupError, ChildProcessError):
                        pass
                    break
                time.sleep(0.005)
        self._sock.close()
        self._ctx.term()
        region.reset_peers()

    @property
    def worker_pids(self):
        return list(self._pids)

    # -- sources ----------------------------------------------------------------------
    def _check(self):
        if not self._started:
            self.start()
        if self._closed:
            raise errors.ClamorError("this cluster is closed")

    def _nparts(self, partitions, n=None):
        if partitions is None:
            partitions = self.nworkers * 2
            if n is not None:
                partitions = max(1, min(partitions, n))
        if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
            raise errors.ConfigError(f"partitions must be a positive int, not {partitions!r}")
        return partitions

    def parallelize(self, data, partitions=None):
        """A collection of ``data`` (a sequence or ndarray) cut into
        ``partitions`` contiguous slices.  A region ndarray travels by
        reference, anything else by value with the task that reads it."""
        self._check()
        if not hasattr(data, "__len__") or not hasattr(data, "__getitem__"):
            data = list(data)
        return Parallel(self, data, self._nparts(partitions, len(data)))

    def range(self, start, stop=None, step=1, partitions=None):
        self._check()
        if stop is None:
            start, stop = 0, start
        if step == 0:
            raise errors.ConfigError("range() step must not be zero")
        return Range(self, start, stop, step, self._nparts(partitions, len(range(start, stop, step))))

    def read_text(self, paths, partitions=None, encoding="utf-8"):
        """Lines of the text files ``paths`` (a path, a glob or a list)."""
        self._check()
        if partitions is not None:
            self._nparts(partitions)  # ConfigError for 0, negative, non-int
        return TextFiles(self, paths, partitions, encoding)

    def read_npy(self, paths):
        """One partition per .npy file; its rows are the elements."""
        self._check()
        return NpyFiles(self, paths)

    # -- running ------------------------------------------------------------------------
    def _run_action(self, node, kind, arg, partitions=None):
        self._check()
        for st in self._plan(node):
            self._run_stage("map", st[0], parent=st[1])
        parts = list(range(node.num_partitions)) if partitions is None else partitions
        return self._run_stage("result", node, action=kind, arg=arg, partitions=parts)

    def _plan(self, node):
        """Map stages still needed for ``node``, dependencies first."""
        out, seen = [], set()

        def cached_everywhere(c):
            return c.cached and all((c.id, p) in self._cache_locs for p in range(c.num_partitions))

        def visit(c):
            if c.id in seen or cached_everywhere(c):
                return
            seen.add(c.id)
            for i, d in enumerate(c.deps):
                visit(d)
                if isinstance(c, Shuffled) and c.shuffle_ids[i] not in self._shuffle_locs:
                    out.append((c, i))
        visit(node)
        return out

    def _locs(self):
        eps = {w: info["blocks"] for w, info in self._workers.items()}
        return {"shuffle": self._shuffle_locs,
                "cache": {k: eps[w] for k, w in self._cache_locs.items() if w in eps}}

    def _begin_stage(self):
        """Number the next stage and end the driver's epoch: pages written
        since the last stage are versioned, and the changed ones listed for
        the workers to drop."""
        self._drop_forgotten()
        # notice workers that died while the cluster was idle, before giving
        # them tasks
        for ins in self._check_liveness():
            if isinstance(ins, StageAborted):
                raise ins.error
        sid = region.stage_current() + 1
        changed = region.stage_begin(sid)
        if changed.size:
            self._changes[sid] = changed
        # versions older than anything a live partition was computed at are
        # of no use to anyone (lineage re-runs read at their own stage)
        region.versions_gc(min([sid] + list(self._made_at.values())))
        oldest = min((w["seen"] for w in self._workers.values()), default=sid)
        for s in [s for s in self._changes if s <= oldest]:
            del self._changes[s]
        return sid

    def _invalidations(self, w, sid):
        """Pages worker ``w`` must drop before its first task of stage
        ``sid``: those changed at every stage boundary since it last ran."""
        parts = [ch for s, ch in self._changes.items() if w["seen"] < s <= sid]
        w["seen"] = sid
        if not parts:
            return b""
        return np.unique(np.concatenate(parts)).astype(np.uint64).tobytes()

    def _run_stage(self, kind, node, parent=None, action=None, arg=None, partitions=None):
        sid = self._begin_stage()
        if kind == "map":
            partitions = list(range(node.deps[parent].num_partitions))
            desc = f"stage {sid}: shuffle map"
        else:
            desc = f"stage {sid}: {action}"
        payload = serialize.dumps({"kind": kind, "node": node, "parent": parent, "action": action, "arg": arg,
                                   "locs": self._locs()})
        sources = _sources(node.deps[parent] if kind == "map" else node)
        extras = {p: serialize.dumps({"p": p, "src": {s.id: s.task_data(p) for s in sources}})
                  for p in partitions}
        lineage = _cached_ids(node)
        nparts = len(partitions)
        prefer = {}
        for p in partitions:
            cached = tuple({w for (c, q), w in self._cache_locs.items() if q == p and c in lineage})
            # Otherwise the worker that last ran partition p of a stage this
            # wide: iterative jobs re-read the same region pages, which that
            # worker holds already.
            last = self._affinity.get((nparts, p))
            prefer[p] = cached or ((last,) if last in self._workers else ())
        tasks = tuple(TaskSpec((sid, p), sid, p, prefer[p]) for p in partitions)
        stat = {"stage": sid, "kind": kind if kind == "map" else action, "tasks": len(tasks), "durations": [],
                "faults": 0, "bytes_from_driver": 0, "bytes_from_peers": 0,
                "payload_bytes": len(payload), "task_data_bytes": sum(len(e) for e in extras.values())}
        t0 = time.perf_counter()
        bar = StageProgress(len(tasks), desc, self.progress)
        log.debug("%s: %d tasks", desc, len(tasks))
        try:
            results = self._drive(sid, tasks, payload, extras, stat, bar)
        finally:
            bar.close()
            stat["duration_s"] = time.perf_counter() - t0
            self._record(stat)
        if kind == "map":
            self._shuffle_locs[node.shuffle_ids[parent]] = [self._workers[results[p]]["blocks"]
                                                            for p in partitions]
            self._made_at[node.shuffle_ids[parent]] = sid
            return None
        return [results[p] for p in partitions]

    def _drive(self, sid, tasks, payload, extras, stat, bar):
        """Submit stage ``sid`` and run the event loop until it ends."""
        outcome = {}
        pending = collections.deque(self._sched.handle(StageSubmitted(sid, tasks)))
        next_check = time.monotonic() + 0.5
        while True:
            while pending:
                ins = pending.popleft()
                if isinstance(ins, Run):
                    self._send_task(ins, payload, extras)
                elif isinstance(ins, StageFinished):
                    outcome[ins.stage_id] = ("ok", ins.results)
                elif isinstance(ins, StageAborted):
                    outcome[ins.stage_id] = ("err", ins.error)
            if sid in outcome:
                status, val = outcome[sid]
                if status == "err":
                    raise val
                return val
            bar.update(0)
            if self._sock.poll(100):
                for _ in range(10000):
                    try:
                        frames = self._sock.recv_multipart(flags=zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    pending.extend(self._on_message(frames, stat, bar))
            if time.monotonic() >= next_check:
                pending.extend(self._check_liveness())
                next_check = time.monotonic() + 0.5

    def _send_task(self, ins, payload, extras):
        w = self._workers[ins.worker]
        first = ins.stage_id not in w["stages"]
        w["stages"].add(ins.stage_id)
        inval = self._invalidations(w, ins.stage_id) if w["seen"] < ins.stage_id else b""
        self._sock.send_multipart([ins.worker, b"TASK", pickle.dumps(ins.key), str(ins.stage_id).encode(),
                                   payload if first else b"", extras[ins.partition], inval])

    def _on_message(self, frames, stat, bar):
        ident, kind = frames[0], frames[1]
        if kind == b"HB":
            wid = frames[2]
            if wid in self._workers:
                self._workers[wid]["last_hb"] = time.monotonic()
            return []
        if ident in self._workers:
            self._workers[ident]["last_hb"] = time.monotonic()
        if kind == b"DONE":
            key = pickle.loads(frames[2])
            res = serialize.loads(frames[3])
            if key[0] == stat["stage"]:
                self._affinity[(stat["tasks"], key[1])] = ident
            if ident in self._workers:  # cumulative counters of that worker
                w = self._workers[ident]
                w["served"], w["followed"], w["fallbacks"] = res["served"], res["redirects"], res["fallbacks"]
                w["direct"] = res.get("direct", 0)
            for cid, p in res["cached"]:
                self._cache_locs[(cid, p)] = ident
                self._made_at[(cid, p)] = key[0]
            if key[0] == stat["stage"]:
                stat["durations"].append(res["duration"])
                for k in ("faults", "bytes_from_driver", "bytes_from_peers"):
                    stat[k] += res[k]
                bar.update()
            # a map task's result is where its buckets are: the worker itself
            value = ident if key[0] == stat["stage"] and stat["kind"] == "map" else res["value"]
            return self._sched.handle(TaskDone(key, ident, value))
        if kind == b"FAIL":
            key = pickle.loads(frames[2])
            msg, tb, fetch = pickle.loads(frames[3])
            err = errors.WorkerLost(msg) if fetch else errors.TaskError(msg, tb)
            return self._sched.handle(TaskFailed(key, ident, err))
        return []

    def _check_liveness(self):
        out = []
        now = time.monotonic()
        for wid, info in list(self._workers.items()):
            reason = None
            try:
                proc = psutil.Process(info["pid"])
                if proc.status() == psutil.STATUS_ZOMBIE:
                    reason = "process exited"
            except psutil.NoSuchProcess:
                reason = "process gone"
            if reason is None and now - info["last_hb"] > self.heartbeat_timeout:
                reason = f"no heartbeat for {now - info['last_hb']:.1f}s"
            if reason:
                log.warning("worker %s (pid %d) lost: %s", wid.decode(), info["pid"], reason)
                del self._workers[wid]
                self._forget_worker(wid, info)
                out.extend(self._sched.handle(WorkerLost(wid, reason)))
        return out

    def _forget_worker(self, wid, info):
        if info.get("pages"):
            region.forget_peer(info["pages"])
        self._cache_locs = {k: w for k, w in self._cache_locs.items() if w != wid}
        dead = info["blocks"]
        self._shuffle_locs = {s: eps for s, eps in self._shuffle_locs.items() if dead not in eps}
        self._made_at = {k: s for k, s in self._made_at.items() if k in self._cache_locs or k in self._shuffle_locs}

    def _forget(self, prefix):
        # Called by a finalizer, so at any moment and in any thread: only
        # note it; the blocks are dropped before the next stage.
        self._forgotten.append(prefix)

    def _drop_forgotten(self):
        drops = []
        while self._forgotten:
            kind, ident = prefix = self._forgotten.popleft()
            drops.append(prefix)
            if kind == "shuffle":
                self._shuffle_locs.pop(ident, None)
                self._made_at.pop(ident, None)
            else:
                for k in [k for k in self._cache_locs if k[0] == ident]:
                    del self._cache_locs[k]
                    self._made_at.pop(k, None)
        if drops:
            for wid in self._workers:
                self._sock.send_multipart([wid, b"DROP", pickle.dumps(drops)])

    def _drop_cache(self, cid):
        if self._closed or not self._started:
            return
        keys = [k for k in self._cache_locs if k[0] == cid]
        for k in keys:
            del self._cache_locs[k]
            self._made_at.pop(k, None)
        for wid in self._workers:
            self._sock.send_multipart([wid, b"DROP", pickle.dumps([("cache", cid)])])

    # -- statistics --------------------------------------------------------------------
    def _record(self, stat):
        d = stat.pop("durations")
        stat["task_s"] = ({"min": min(d), "median": statistics.median(d), "max": max(d)} if d
                          else {"min": 0.0, "median": 0.0, "max": 0.0})
        self._stage_stats.append(stat)
        self._totals["stages"] += 1
        for k in ("tasks", "faults", "bytes_from_driver", "bytes_from_peers"):
            self._totals[k] += stat[k]
        self._totals["task_seconds"] += sum(d)

    def stats(self):
        """Totals over this cluster's stages, and the per-stage list."""
        out = {k: self._totals[k] for k in ("stages", "tasks", "faults", "bytes_from_driver", "bytes_from_peers")}
        out["task_seconds"] = float(self._totals["task_seconds"])
        out["workers"] = len(getattr(self, "_workers", {}))
        drv = out["driver"] = region.stats()
        ws = getattr(self, "_workers", {})
        # a peer asked on a redirect or straight on a hint; a fallback is either kind that failed
        direct = sum(w.get("direct", 0) for w in ws.values())
        followed = sum(w.get("followed", 0) for w in ws.values()) + direct
        fallbacks = sum(w.get("fallbacks", 0) for w in ws.values())
        out["replication"] = {
            "policy": self.replication,
            "bytes_served_by_driver": drv["bytes_served"],
            "bytes_served_by_peer": {w.decode(): info.get("served", 0) for w, info in ws.items()},
            "redirects": drv["redirects"],
            "direct_requests": direct,
            "hint_bytes": drv["hint_bytes"],
            "redirect_hit_rate": (followed - fallbacks) / followed if followed else 0.0,
        }
        out["stages_detail"] = list(self._stage_stats)
        return out

    def stage_stats(self):
        return list(self._stage_stats)


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

"""The worker side of the BSP runtime: run tasks, keep blocks, serve them.

DESIGN.  A worker process has three threads that matter here.  The main
thread runs tasks one at a time, in arrival order, from a DEALER socket to
the driver's control ROUTER (the driver keeps up to ``slots`` tasks queued
per worker, so the next one is already here when a task ends).  A service
thread owns a ROUTER socket that serves this worker's blocks (shuffle
buckets and cached partitions) to peers, and a DEALER that sends the driver
a heartbeat every second.  The C pager and page server (csrc/) run beside
them without the GIL, and a lifeline thread kills the worker as soon as
the driver process is gone, even in the middle of a task
(clamor/runtime/liveness.py).

Control messages, multipart:

    driver -> worker   TASK key attempt version stage_payload|"" task_extras invalidated-pages|""
                       CANCEL key          (another copy of the task finished first)
                       LOST pickled-list-of-block-endpoints pickled-list-of-page-endpoints
                                           (peers that died)
                       LIVE pickled-list-of-block-endpoints   (a new peer at one of those)
                       DROP pickled-list-of-block-key-prefixes
                       TARGETS pickled-list-of-(id, spec)   (relocation targets to
                                           bind before the next task: a worker not
                                           forked from the driver only)
                       STOP
    worker -> driver   HELLO pickled-info    (its counters at start among them)
                       DONE key pickled-result pickled-counters
                       SKIP key pickled-counters   (a cancelled task dropped before it ran)
                       FAIL key pickled-(message, traceback, missing-blocks|None) pickled-counters
    heartbeat socket   HB worker-id

Every report carries the worker's counters as they stand (``counters()``:
cumulative since it started, never per task), and the driver attributes
what moved since the worker's previous report to the stage the report is
about (clamor/runtime/accounting.py ``account``).  So nothing a worker fetched goes
uncounted: not read-ahead that lands after its task, nor pickling a result,
nor the work of a losing copy, a skipped or a failed task.

``attempt`` names the stage payload (sent with a worker's first task of
it); ``version`` is the stage whose page versions the task reads, older
than the newest for a lineage re-run.  Messages wait in an inbox, so that
a CANCEL that arrived behind a queued TASK is seen before the task runs, a
STOP ends the worker without running the tasks queued ahead of it (close()
does not wait for them), and a LOST is seen while a task waits for blocks
from that peer.

Block keys are tuples: ("shuffle", shuffle_id, map_partition, bucket,
version) and ("cache", collection_id, partition, version), the version being
the stage the task that made the block read at: only the blocks the driver
recorded are read, by that name, so a copy left by a failed task, a losing
copy or a re-run at another version is never mistaken for them.  Blocks are
stored frozen (``freeze``: pickled by value), so what a task does to the copy it is handed never
reaches the store.  A peer asks [GET, pickled-key] and gets [OK,
pickled-key, pickled-block] or [MISSING, pickled-key].
"""
import collections
import gc
import logging
import os
import pickle
import threading
import time
import traceback

import cloudpickle
import numpy as np
import zmq

from .. import errors
from ..memory import portable, region, samehost
from . import code, serialize
from .liveness import Beat, LinkWatch, heartbeats
from .collection import partition_result
from .security import Guard
from .versions import change_version

log = logging.getLogger("clamor.worker")

BLOCK_TIMEOUT_MS = int(os.environ.get("CLAMOR_BLOCK_TIMEOUT_MS", "30000"))


class FetchFailed(Exception):
    """Blocks this task needs could not be fetched: ``missing`` lists
    (endpoint, key) pairs.  The driver recomputes them from lineage."""

    def __init__(self, msg, missing):
        super().__init__(msg)
        self.missing = missing


class Service(threading.Thread):
    """Serves blocks to peers and sends heartbeats (a liveness.Beat every
    ``heartbeat`` seconds, as the driver's WELCOME or fork said)."""

    def __init__(self, ctx, store, driver, wid, security, guard, bind, heartbeat=1.0):
        super().__init__(name="clamor-blocks", daemon=True)
        self.store = store
        self.sock = ctx.socket(zmq.ROUTER)
        self.sock.linger = 0
        security.server(self.sock)
        guard.watch(self.sock, "block server")
        _bind(self.sock, bind)
        self.endpoint = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.hb = ctx.socket(zmq.DEALER)
        self.hb.linger = 0
        security.client(self.hb)
        self.hb.connect(driver)
        self.wid = wid
        self.beat = Beat(self._send_hb, heartbeat)   # (the driver's loss is the main thread's to see)
        self.stopped = threading.Event()

    def _send_hb(self):
        self.hb.send_multipart([b"HB", self.wid], flags=zmq.NOBLOCK)   # (no answer comes)

    def run(self):
        while not self.stopped.is_set():
            self.beat.tick()
            if not self.sock.poll(max(1, min(250, int(self.beat.due() * 1000)))):
                continue
            frames = self.sock.recv_multipart()
            if len(frames) != 3 or frames[1] != b"GET":
                self.sock.send_multipart([frames[0], b"BAD"])
                continue
            try:
                block = self.store.get(pickle.loads(frames[2]))
            except Exception:  # malformed key from a peer: answer, keep serving
                block = None
            if block is None:
                self.sock.send_multipart([frames[0], b"MISSING", frames[2]])
            else:
                self.sock.send_multipart([frames[0], b"OK", frames[2], block])   # stored frozen
        self.sock.close()
        self.hb.close()


def freeze(block):
    """What the block store keeps: the block's bytes, by value (a region
    array's data too), never the live object.  A cached partition or a
    shuffle bucket is a snapshot: a later task that changes what it was
    handed (an in-place combiner, a sort, an append), or a driver write to
    the region pages under it, cannot change it.  A peer gets the same
    bytes."""
    return cloudpickle.dumps(block, protocol=pickle.HIGHEST_PROTOCOL)


def thaw(data):
    """A fresh copy of a stored block."""
    return pickle.loads(data)


class TaskContext:
    """What a collection's ``_compute`` may ask of the worker during a task."""

    def __init__(self, runtime, locs, extras, version=0):
        self.rt = runtime
        self.locs = locs
        self.extras = extras
        self.version = version
        self.new_cached = []

    def source_data(self, cid, p):
        return self.extras["src"][cid]

    def cached_partition(self, cid, p):
        """The copy the driver recorded, or None: compute it.  Copies are
        named by the version they were made at, and only recorded ones
        count: a copy made by a task that failed, by a losing copy, or by a
        re-run at an older version than the recorded one is never read."""
        if (cid, p) in self.new_cached:   # this task computed it already (read twice, as by zip)
            return thaw(self.rt.store[("cache", cid, p, self.version)])
        loc = self.locs.get("cache", {}).get((cid, p))
        if loc is None:
            return None
        ep, made = loc
        key = ("cache", cid, p, made)
        if ep == self.rt.endpoint:
            part = self.rt.store.get(key)
            return thaw(part) if part is not None else None
        # A failure propagates: computing it here would read the globals
        # at this task's version, and the partition was made at its own.
        return self.rt.fetch([(ep, key)])[key]

    def cache_partition(self, cid, p, part):
        self.rt.store[("cache", cid, p, self.version)] = freeze(part)
        self.new_cached.append((cid, p))

    def shuffle_blocks(self, sid, nmaps, r):
        made, eps = self.locs["shuffle"][sid]
        local, remote = [], []
        for m in range(nmaps):
            key = ("shuffle", sid, m, r, made)
            if eps[m] == self.rt.endpoint and key in self.rt.store:
                local.append(thaw(self.rt.store[key]))
            else:
                remote.append((eps[m], key))
        got = self.rt.fetch(remote) if remote else {}
        return local + [got[k] for _, k in remote]


class Runtime:
    """A worker's side of the runtime.  ``link_grace``: watch the control
    connection (ZMTP heartbeats, ``self.link``), for a worker that cannot
    check the driver's process by PID; the connection must be made within
    that many seconds."""

    def __init__(self, driver, wid, security, link_grace=None, blocks="tcp://127.0.0.1:*", slots=None,
                 heartbeat=1.0):
        self.driver = driver
        self.wid = wid
        self.security = security
        self.ctx = zmq.Context()
        self.guard = Guard(self.ctx, security, f"worker {wid.decode()}")
        self.store = {}
        self.stages = collections.OrderedDict()   # attempt -> the stage's payload, pickled
        self.loaded = collections.OrderedDict()   # attempt -> the payload loaded (holds region objects)
        self.peers = {}
        self.inbox = collections.deque()   # messages from the driver not yet handled
        self.cancelled = set()             # keys of queued tasks the driver cancelled
        self.bind_error = None             # why relocation targets could not be bound here
        self.dead = set()                  # block endpoints of peers the driver declared lost
        self.stopping = False              # a STOP came: queued tasks are not run
        self.slots = slots
        self.service = Service(self.ctx, self.store, driver, wid, security, self.guard, blocks, heartbeat)
        self.guard.start()
        self.endpoint = self.service.endpoint
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.linger = 0
        security.client(self.sock)
        self.sock.setsockopt(zmq.IDENTITY, wid)
        self.link = None
        if link_grace is not None:
            heartbeats(self.sock)
            self.link = LinkWatch(self.sock, link_grace)
        self.sock.connect(driver)

    # -- blocks from peers --------------------------------------------------------
    def _peer(self, ep):
        s = self.peers.get(ep)
        if s is None:
            s = self.peers[ep] = self.ctx.socket(zmq.DEALER)
            s.linger = 0
            s.sndtimeo = BLOCK_TIMEOUT_MS   # (a connection ended for good would block a send forever)
            self.security.client(s)
            s.connect(ep)
        return s

    def fetch(self, wanted):
        """{key: block} for [(endpoint, key)], all requests in flight at once.
        Raises FetchFailed naming every block not received: a peer lost (the
        driver says so, or it has no endpoint), a peer without the block, or
        a time-out."""
        gone = [(ep, k) for ep, k in wanted if ep is None or ep in self.dead]
        if gone:
            raise FetchFailed(f"blocks {[k for _, k in gone][:3]} are on lost workers", gone)
        socks = {}
        for ep, key in wanted:
            s = self._peer(ep)
            try:
                s.send_multipart([b"GET", pickle.dumps(key)])
            except zmq.Again:
                raise FetchFailed(f"block {key} could not be asked of {ep} within {BLOCK_TIMEOUT_MS} ms",
                                  [(ep, key)]) from None
            socks[s] = socks.get(s, 0) + 1
        out, where = {}, {k: ep for ep, k in wanted}
        poller = zmq.Poller()
        for s in socks:
            poller.register(s, zmq.POLLIN)
        poller.register(self.sock, zmq.POLLIN)   # a LOST from the driver ends the wait
        deadline = time.monotonic() + BLOCK_TIMEOUT_MS / 1000
        try:
            while len(out) < len(wanted):
                left = deadline - time.monotonic()
                ready = dict(poller.poll(max(0, int(left * 1000)))) if left > 0 else {}
                if not ready:
                    missing = [(where[k], k) for k in where if k not in out]
                    raise FetchFailed(f"blocks {[k for _, k in missing][:3]} not received within "
                                      f"{BLOCK_TIMEOUT_MS} ms", missing)
                if self.sock in ready:
                    self._receive()
                    lost = [(where[k], k) for k in where if k not in out and where[k] in self.dead]
                    if lost:
                        raise FetchFailed(f"blocks {[k for _, k in lost][:3]} are on lost workers", lost)
                for s in ready:
                    if s is self.sock:
                        continue
                    frames = s.recv_multipart()
                    if frames[0] != b"OK":
                        key = pickle.loads(frames[1]) if len(frames) > 1 else None
                        raise FetchFailed(f"peer has no block {key}", [(where.get(key), key)])
                    out[pickle.loads(frames[1])] = serialize.loads(frames[2])
        except FetchFailed:
            # replies may still come on these sockets: never read them as
            # answers to later requests
            for ep in {ep for ep, _ in wanted}:
                s = self.peers.pop(ep, None)
                if s is not None:
                    s.close()
            raise
        return out

    # -- the inbox ---------------------------------------------------------------------
    def _receive(self):
        """Move every message waiting from the driver into the inbox, acting
        at once on STOP, CANCEL and LOST."""
        while True:
            try:
                frames = self.sock.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                return
            if frames[0] == b"STOP":
                self.stopping = True
            elif frames[0] == b"CANCEL":
                self.cancelled.add(frames[1])
            elif frames[0] == b"LOST":
                self.dead.update(pickle.loads(frames[1]))
                for ep in pickle.loads(frames[2]) if len(frames) > 2 else ():
                    region.peer_gone(ep)      # its page server too: no more hinted requests to it
            elif frames[0] == b"LIVE":   # a new worker at an endpoint a lost one had
                self.dead.difference_update(pickle.loads(frames[1]))
            else:
                self.inbox.append(frames)

    # -- tasks ----------------------------------------------------------------------
    def run_task(self, stage, extras, version=0):
        ctx = TaskContext(self, stage["locs"], extras, version)
        p = extras["p"]
        node = stage["node"]
        if stage["kind"] == "map":
            i = stage["parent"]
            buckets = node.bucketize(i, node.deps[i].partition(p, ctx))
            sid = node.shuffle_ids[i]
            for r, b in enumerate(buckets):
                self.store[("shuffle", sid, p, r, version)] = freeze(b)
            value = None
        else:
            value = partition_result(stage["action"], node.partition(p, ctx), stage["arg"])
        return value, ctx.new_cached

    def loop(self, alive=None):
        """Run tasks until STOP, or until ``alive()`` (checked each second
        the driver is silent) says the driver is gone; by default, until
        this process's parent, the driver that forked it, is."""
        self.service.start()
        info = {"pid": os.getpid(), "blocks": self.endpoint, "pages": region.server_endpoint(),
                "counters": counters(), "slots": self.slots, "same_host": samehost.status()}
        self.sock.send_multipart([b"HELLO", pickle.dumps(info)])
        if alive is None:
            driver_pid = os.getppid()

            def alive():
                return os.getppid() == driver_pid
        try:
            while True:
                if not self.inbox:
                    if not self.sock.poll(1000):
                        if not alive():
                            log.warning("driver is gone; worker %s exits", self.wid.decode())
                            return
                        continue
                self._receive()
                if self.stopping:
                    return
                if not self.inbox:
                    continue
                frames = self.inbox.popleft()
                kind = frames[0]
                if kind == b"DROP":
                    prefixes = pickle.loads(frames[1])
                    for k in [k for k in self.store if any(k[:len(px)] == px for px in prefixes)]:
                        self.store.pop(k, None)
                    continue
                if kind == b"TARGETS":
                    self._targets(frames[1])
                    continue
                if kind == b"TASK":
                    self._task(frames)
        finally:
            self.service.stopped.set()
            self.service.join(2)
            if self.link is not None:
                self.link.close()   # its monitor first: it watches self.sock
            self.sock.close()
            for s in self.peers.values():
                s.close()
            self.guard.stop()

    def _targets(self, frame):
        """Bind the relocation targets the driver's next tasks name
        (clamor/memory/portable.py); a failure fails those tasks, with its
        reason, instead of a page that could not be relocated."""
        try:
            portable.bind(pickle.loads(frame))
        except Exception as err:
            self.bind_error = err

    def _release_region_objects(self):
        """Drop every reference this worker holds to region objects before
        their pages change.

        A worker's reference-count writes live in its own copy of a page.
        A page dropped and fetched again has the driver's counts: a
        reference the worker took before would then be released against a
        count that never had it, and the object would be freed here, its
        memory handed to this worker's own objects by CPython's free lists
        and numpy's caches, over bytes the driver still uses.  Loaded
        stages are loaded again from their bytes, and a collection frees
        the cycles that held region objects."""
        if self.loaded:
            self.loaded.clear()
            gc.collect()

    def _task(self, frames):
        key, attempt, version = frames[1], int(frames[2]), int(frames[3])
        payload, extras, inval = frames[4], frames[5], frames[6]
        if payload:
            self.stages[attempt] = payload
            while len(self.stages) > 16:
                self.stages.popitem(last=False)
        # Pages the driver changed between this worker's last version and the
        # task's: dropped even if the task is skipped, since the driver counts
        # this worker as up to date once it has sent them.
        change_version(version, np.frombuffer(inval, dtype=np.uint64),
                       self._release_region_objects if inval else None)
        if key in self.cancelled:   # another copy finished while this one waited here
            self.cancelled.discard(key)
            self.sock.send_multipart([b"SKIP", key, serialize.pack_counters(counters())])
            return
        if len(self.cancelled) > 4096:   # cancels of tasks that had already run
            self.cancelled.clear()
        region.ensure_handler_first()
        t0 = time.perf_counter()
        try:
            if self.bind_error is not None:
                raise self.bind_error
            stage = self.loaded.get(attempt)
            if stage is None:
                stage = self.loaded[attempt] = serialize.loads(self.stages[attempt])
                while len(self.loaded) > 16:
                    self.loaded.popitem(last=False)
            try:
                value, cached = self.run_task(stage, serialize.loads(extras), version)
            finally:
                region.sweep_dead()
            res = {"value": value, "cached": cached, "duration": time.perf_counter() - t0}
            # by value, like a stored block: a result is what the task saw, not
            # a reference the driver would read at its own, later version
            done = freeze(res)
            # the counters after it: pickling region rows may fault
            self.sock.send_multipart([b"DONE", key, done, serialize.pack_counters(counters())])
        except BaseException as err:  # SystemExit from user code too: report it, keep the worker
            missing = err.missing if isinstance(err, FetchFailed) else None
            msg = f"{type(err).__name__}: {err}"
            self.sock.send_multipart([b"FAIL", key, pickle.dumps((msg, traceback.format_exc(), missing)),
                                      serialize.pack_counters(counters())])


def _bind(sock, endpoint):
    """Bind ``sock`` to ``endpoint``; "tcp://HOST:LO-HI": the first free
    port of the range."""
    rng = region.port_range(endpoint)
    if rng is None:
        sock.bind(endpoint)
        return
    host, lo, hi = rng
    for port in range(lo, hi + 1):
        try:
            sock.bind(f"tcp://{host}:{port}")
            return
        except zmq.ZMQError as err:
            if err.errno != zmq.EADDRINUSE:
                raise
    raise errors.TransportError(f"no free port in {lo}-{hi} on {host} for the block server")


def counters():
    """This worker's counters as they stand, sent with every report: all
    cumulative since the worker started (the driver takes differences).
    ``bytes_fetched`` counts the bytes from peers too."""
    st = region.stats()
    return {"faults": st["faults"], "bytes_fetched": st["bytes_fetched"], "bytes_from_peers": st["bytes_from_peers"],
            "served": st["bytes_served"], "redirects": st["redirects"], "direct": st["peer_direct"],
            "fallbacks": st["peer_fallbacks"], "timeouts": st["peer_timeouts"],
            "mapped": st["pages_mapped"] * region.page_size(), "wire": st["wire_bytes_fetched"],
            "diff_wire": st["diff_wire_bytes"], "diff_pages": st["diff_pages"]}


def worker_main(driver, wid, security, host, ports="*", heartbeat=1.0):
    """What a forked worker runs (clamor.runtime.liveness.fork does the rest)."""
    # Every object inherited at fork goes to the collector's permanent
    # generation: region objects among them have their list links in region
    # pages, which the driver rewrites, and this worker's collections must
    # never walk or relink them.
    gc.freeze()
    code.note_forked()
    Runtime(driver, wid, security, blocks=f"tcp://{host}:{ports}", heartbeat=heartbeat).loop()

"""The driver's side of clamor on Dask: versions, the page server and the
control endpoint workers join through.

Versions are the region's page versions, kept by the one version keeper
(clamor/runtime/versions.py) as a Cluster's are.  A region array pickled
for Dask is stamped with the newest version; if the driver wrote to the
region since it began, a new version begins first, so the stamp names the
bytes as they are now and later writes go to new page versions.  The
changed pages of each version are kept for workers that move between
versions.

The control endpoint (a ROUTER, CURVE or PLAIN with the secret, like a
Cluster's) answers JOIN (the one schema of every driver, read and written
by clamor/runtime/driver.py), CHANGES, TARGETS, PING and LEAVE: see
docs/wire.md#clamordasks-control-endpoint.

The driver's Python threads keep out of heap() blocks, as a Cluster's do
(clamor.memory.gate): the control endpoint and the keeper wait in C and
run Python only while no block is open, and the Dask client's event loop
(a LocalCluster's scheduler and nannies run on it too), the thread it
offloads work to and Dask's profiler threads are asked to park while one
is.  So a block may run
after attach: what Dask's threads free does not reach the free lists the
block's objects are made from.

A keeper thread asks the scheduler, every half second, which versions its
tasks may still read, and frees the page versions no task needs, nor a
graph pickled in the last STAMP_HOLD seconds (it may still be on its way
to the scheduler: Dask's graphs and the keeper's question travel on
different connections, so their order is not known).
"""
import asyncio
import errno
import json
import logging
import pickle
import threading
import time

import numpy as np
import zmq

from .. import errors
from ..memory import gate, portable, region, samehost
from ..runtime import security
from ..runtime.versions import VersionKeeper
from ..runtime.driver import read_join, read_leave, set_replication, welcome
from ..runtime.liveness import Heard
from . import _pickling, _values

log = logging.getLogger("clamor.dask")

KEEP_PERIOD = 0.5   # seconds between the keeper's questions to the scheduler
STAMP_HOLD = 30.0   # seconds a version stamped into a graph is kept, whatever the scheduler says
PEER_GRACE = 5.0    # seconds without a ping before a worker's page server is forgotten
PING_PERIOD = 0.5   # seconds between a worker's pings (its heartbeats), as the WELCOME says


def _threads(client):
    """(thread ident, knock, name) of each thread of Dask's in this process
    that runs Python on its own: the event loop of the client (and of its
    cluster, if that has one of its own here), the thread Dask offloads
    work to from that loop (a scheduler's graph, unpickled and ordered
    there at every submit; a message over 10 MB), and Dask's profilers."""
    out, seen = [], set()
    for what, loop in (("the Dask client's event loop", getattr(client, "loop", None)),
                       ("the Dask cluster's event loop", getattr(getattr(client, "cluster", None), "loop", None))):
        aio = getattr(loop, "asyncio_loop", None)
        if aio is None or id(aio) in seen:
            continue
        seen.add(id(aio))
        ident = _loop_thread(aio)
        if ident is None:
            log.warning("%s did not answer within 10 s: it is not kept out of clamor.heap() blocks, whose "
                        "objects may then come from CPython's free lists, outside the region", what)
        else:
            out.append((ident, _knocker(aio), what))
    try:
        from distributed.utils import _offload_executor as pool
        ident = pool.submit(threading.get_ident).result(timeout=10)   # (starts its one thread)
    except Exception as err:  # another Dask, or shut down: nothing to hold
        log.debug("no offload thread of Dask's to keep out of heap() blocks: %s", err)
    else:
        out.append((ident, _submitter(pool), "Dask's offload thread"))
    return out + _profilers()


def _profilers():
    """Dask's profiler threads in this process (one per server, on Python
    3.12 and later: a LocalCluster's scheduler runs here), which sample an
    event loop's stack every 10 ms and make and free dicts and lists as they
    do.  They run a plain loop: parked by a profile hook (knock None)."""
    try:
        from distributed.profile import _watch
    except ImportError:  # another Dask
        return []
    return [(t.ident, None, "Dask's profiler thread") for t in threading.enumerate()
            if getattr(t, "_target", None) is _watch and t.ident is not None]


def _submitter(pool):
    def knock(park):
        try:
            pool.submit(park)
        except RuntimeError:   # shut down
            return False
        return True
    return knock


def _loop_thread(aio, timeout=10.0):
    """The ident of the thread that runs asyncio loop ``aio``."""
    try:
        if asyncio.get_running_loop() is aio:
            return threading.get_ident()
    except RuntimeError:  # no loop runs in this thread
        pass
    box, done = [], threading.Event()

    def tell():
        box.append(threading.get_ident())
        done.set()
    try:
        aio.call_soon_threadsafe(tell)
    except RuntimeError:  # closed
        return None
    return box[0] if done.wait(timeout) else None


def _knocker(aio):
    def knock(park):
        if aio.is_closed() or not aio.is_running():
            return False
        aio.call_soon_threadsafe(park)
        return True
    return knock


def _live_versions(dask_scheduler=None):
    plugin = dask_scheduler.plugins.get("clamor")
    return plugin.live() if plugin is not None else None


class Driver:
    """This process's region served to the workers of one Dask client."""

    def __init__(self, client, secret, encrypt, host, replication="two-choices"):
        self.client = client
        self.replication = replication
        self._peers = Heard()             # a worker's page server -> when it last pinged
        self._hashes = {}                 # a worker's identity -> its str hash digest (JOIN)
        self._sent = {}                   # a worker's identity -> the relocation targets it was sent
        self.security = security.Security(secret, encrypt)
        self.host = host
        self._lock = threading.Lock()     # the versions, and the tables below
        self._versions = VersionKeeper()  # the page versions and the pages changed at each
        self._stamps = {}                 # version -> when it was last stamped
        self._gone = threading.Event()    # detached: requests are answered BYE
        self._stop = threading.Event()
        self._serving = gate.Gated()     # the control endpoint's thread, and the keeper's
        self._keeping = gate.Gated()
        self._residents = []              # Dask's threads here, parked during heap() blocks
        self.versions_kept = 1

    # -- versions --------------------------------------------------------

    @property
    def version(self):
        """The newest version: the last stage that changed bytes."""
        return self._versions.newest

    def stamp(self):
        """The version of a region array being pickled now: the last stage
        whose bytes differ from the one before.  (Pages written back to
        what they held, such as a region object's reference count during
        pickling, begin a stage but not a version: a graph pickled twice
        with nothing changed between pickles, and tokenizes, the same.)"""
        with self._lock:
            if region.dirty_count():
                self._begin()
            v = self.version
            self._stamps[v] = time.monotonic()
            return v

    def _begin(self, relocated=None):
        # (``relocated``: pages whose relocation lists changed at the new version)
        self._versions.begin(relocated)

    def ship(self, obj):
        """(offset, version) of region object ``obj`` sent to a task: its
        pages' relocation lists are those of that version (a first send,
        or one after the driver changed what its last walk read, lists
        them; pages whose lists changed begin a version of their own, so
        workers drop them).  NotShareable if it cannot be used in place."""
        base = region.base()
        if not base <= id(obj) < base + region.size():
            raise errors.NotShareable(f"clamor.dask.ref takes an object built under clamor.heap(); this "
                                      f"{type(obj).__name__} is not in the region")
        with self._lock:
            if region.dirty_count():
                self._begin()
            nxt = region.version_current() + 1
            try:
                relocated = portable.driver().prepare([obj], nxt, seeds_agree=self._seeds_agree(), bring_in=True)
            except errors.NotShareable as err:
                if "PYTHONHASHSEED" not in str(err):
                    raise
                raise errors.NotShareable(
                    f"{str(err).split(':')[0]}: its str hashes are seeded per process, and a Dask worker's seed "
                    f"differs from this driver's.  Dask's nanny starts workers with PYTHONHASHSEED=6640 unless "
                    f"distributed.nanny.pre-spawn-environ sets another: start the driver with "
                    f"PYTHONHASHSEED=6640 (or set both to the same number)") from None
            if relocated.size:
                self._begin(relocated)
            v = self.version
            self._stamps[v] = time.monotonic()
            return id(obj) - base, v

    def _seeds_agree(self):
        mine = portable.hash_digest()
        return all(h == mine for h in list(self._hashes.values()))

    def changes(self, lo, hi, gated=None):
        """Pages changed at the stages after ``lo`` up to ``hi`` (either
        order).  ``gated``: the calling thread's, if it is gated."""
        self._hold(gated)
        try:
            return self._versions.changed_between(lo, hi)
        finally:
            self._lock.release()

    def _hold(self, gated):
        """Take the lock; ``gated``: the calling thread's (see Gated.hold)."""
        if gated is None:
            self._lock.acquire()
        else:
            gated.hold(self._lock)

    def keep(self, live, gated=None):
        """Free the page versions that neither the scheduler's tasks
        (``live``: the versions its plugin names) nor a graph stamped in
        the last STAMP_HOLD seconds may read.  ``gated``: the calling
        thread's, if it is gated."""
        self._hold(gated)
        try:
            recent = time.monotonic() - STAMP_HOLD
            self._stamps = {v: t for v, t in self._stamps.items() if t >= recent}
            versions = {self.version} | set(live) | set(self._stamps)
            self._versions.keep(versions | {region.version_current()})
            self.versions_kept = len(versions)
        finally:
            self._lock.release()

    # -- life --------------------------------------------------------------

    def start(self):
        if region.role() is None:
            region.init()
        elif region.role() != "driver":
            raise errors.RegionError("clamor.dask.attach() runs in the driver, and this process is a worker")
        if region.server_endpoint():   # left by a closed Cluster, with its keys: again, with these
            region.stop_serving()
        self.security.core()
        self.pages = region.serve(f"tcp://{self.host}:*")
        region.reset_peers()
        set_replication(self.replication)
        samehost.share(False)
        with self._lock:
            self._begin()   # from here on, a write is a new version
        self._ctx = zmq.Context()
        self._sock, self._guard = security.control_socket(self._ctx, self.security, "driver (dask)")
        try:
            self._sock.bind(f"tcp://{self.host}:*")
        except zmq.ZMQError as err:
            self._close_sockets()
            region.stop_serving()
            raise errors.TransportError(f"cannot listen on {self.host}: {err}") from err
        self.endpoint = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        _pickling.install(self.stamp)
        _pickling.set_shipper(self.ship)
        _values.install()
        self._server = threading.Thread(target=self._serve, name="clamor-dask-control", daemon=True)
        self._server.start()
        self._keeper = threading.Thread(target=self._keep_loop, name="clamor-dask-keeper", daemon=True)
        self._keeper.start()
        self._residents = [gate.keep_out(ident, knock, name) for ident, knock, name in _threads(self.client)]

    def unpark(self):
        """Dask's threads run freely again, even inside a heap() block
        (detach needs the client's loop there)."""
        for r in self._residents:
            gate.let_in(r)

    def stop(self, grace=0.0):
        """Stop stamping and serving pages.  The control endpoint answers
        BYE for ``grace`` seconds more (workers not told by Dask learn it
        so), then closes."""
        _values.uninstall()
        _pickling.uninstall()
        self.unpark()
        self._gone.set()
        self._grace = grace
        self._stop.set()
        self._keeping.stop()          # (even while a heap() block is open)
        if threading.current_thread() is not self._keeper:
            self._keeper.join()
        if grace <= 0:
            self._serving.stop()
            self._server.join()
        region.stop_serving()
        portable.reset()   # (the roots sent to tasks, and their lists)

    def _keep_loop(self):
        gated = self._keeping
        while True:
            if gated.wait(int(KEEP_PERIOD * 1000)) == -errno.ECANCELED:
                return
            try:
                if self._stop.is_set():
                    return
                self._keep_once()
            finally:
                gated.done()

    def _keep_once(self):
        if self.client.status in ("closing", "closed"):
            log.info("the Dask client closed: clamor detaches from it")
            from . import _detach_closed
            _detach_closed(self)
            return
        try:
            live = self.client.run_on_scheduler(_live_versions)
        except Exception as err:  # the scheduler away for a moment: keep everything
            log.debug("could not ask the scheduler for live versions: %s", err)
            return
        if live is not None:
            self.keep(live, self._keeping)
        self._forget_silent()

    def _forget_silent(self):
        for ep, silent in self._peers.silent(PEER_GRACE):
            log.info("the worker serving pages at %s has not pinged for %g s: forgotten", ep, silent)
            self._forget(ep)

    def _forget(self, ep):
        if self._peers.forget(ep):
            region.forget_peer(ep)

    def _serve(self):
        gated = self._serving
        gated.set_sockets([self._sock])
        deadline = None
        try:
            while True:
                rc = gated.wait(100)
                if rc == -errno.ECANCELED:
                    return
                try:
                    if self._gone.is_set():
                        if deadline is None:
                            deadline = time.monotonic() + self._grace
                        if time.monotonic() >= deadline:
                            return
                    if rc == -errno.EINTR or rc == 0:
                        continue
                    if rc < 0:
                        log.error("the control endpoint stopped: %s", zmq.strerror(-rc))
                        return
                    frames = self._sock.recv_multipart()
                    try:
                        self._answer(frames)
                    except (ValueError, TypeError, KeyError, IndexError) as err:
                        log.warning("a malformed request on the control endpoint: %s", err)
                        self._sock.send_multipart([frames[0], b"ERROR", str(err).encode()])
                finally:
                    gated.done()
        finally:
            self._close_sockets()

    def _answer(self, frames):
        who, kind = frames[0], frames[1]
        if self._gone.is_set():
            self._sock.send_multipart([who, b"BYE", b""])
        elif kind == b"JOIN":
            self._hashes[who] = str(read_join(frames[2])["hash"])
            self._sock.send_multipart([who, b"WELCOME", welcome(self.pages, version=self.version,
                                                                heartbeat=PING_PERIOD)])
        elif kind == b"CHANGES":
            lo, hi = json.loads(frames[2])
            self._sock.send_multipart([who, b"CHANGES",
                                       self.changes(lo, hi, self._serving).astype(np.uint64).tobytes()])
        elif kind == b"TARGETS":
            self._hold(self._serving)
            try:
                sent = self._sent.setdefault(who, set())
                specs = portable.driver().specs_for(sent)
                sent.update(i for i, _ in specs)
            finally:
                self._lock.release()
            self._sock.send_multipart([who, b"TARGETS", pickle.dumps(specs)])
        elif kind == b"PING":
            if frames[2]:
                self._peers.heard(frames[2].decode())
            self._sock.send_multipart([who, b"PONG", b""])
        elif kind == b"LEAVE":
            pages = read_leave(frames[2])["pages"]
            if pages:
                self._forget(pages)
            self._sock.send_multipart([who, b"BYE", b""])
        else:
            raise ValueError(f"unknown request {kind[:32]!r}")

    def _close_sockets(self):
        self._sock.close()
        self._guard.stop()
        self._ctx.term()

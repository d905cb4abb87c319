"""Cluster: the driver side of the BSP runtime.

DESIGN.  The embedded default forks N local workers from the driver.  Fork,
because Python objects the driver builds in the region point at type
objects and other interpreter state outside it, and those addresses are
only the same in a process of the same image.  Each worker gets its pager
and page server back after fork (clamor/memory/region.py) and runs
clamor.runtime.executor.Runtime.  Workers that were not forked (spawned
with ``start_method="spawn"``, or ``remote`` ones started by hand) join
first (clamor/runtime/worker.py: JOIN, WELCOME) and then run the same
Runtime; they read region arrays and refuse region objects.

A Cluster is built of parts, each with its own state: the workers
(``WorkerPool``, clamor/runtime/pool.py), the page versions
(``VersionKeeper``, clamor/runtime/versions.py), the lineage store
(clamor/runtime/lineage.py), the stage runner (``StageRunner``,
clamor/runtime/stages.py), the in-place checks (clamor/runtime/shipping.py)
and the accounts behind stats() (clamor/runtime/accounting.py); its
settings are three groups (clamor/runtime/options.py).

The driver thread that calls an action runs the stages over one ROUTER
socket.  A worker that dies is noticed within half a second
through psutil (processes in the driver's PID namespace) or after
``heartbeat_timeout`` without a heartbeat; it is killed and reaped, its
work is recomputed from lineage on the others (clamor/runtime/lineage.py),
and a local one is replaced (a remote one leaves its place to the next
that joins).

Workers live as long as the driver process, whichever thread started them
(clamor/runtime/liveness.py), and no longer than their Cluster: close(), the end of
a ``with``, the Cluster being garbage-collected, or the driver's exit stop
them.  The finalizer holds what stopping takes (socket, context, process
ids), never the Cluster itself.
"""
import collections
import gc
import logging
import numbers
import os
import signal
import time
import weakref

import numpy as np
import zmq

from . import liveness, serialize
from .. import errors
from ..memory import byvalue, region
from .collection import NpyFiles, Parallel, Range, TextFiles
from ..memory.heap import install as install_heap_hooks
from ..memory.heap import outside
from . import security
from .lineage import Lineage
from ..memory import portable
from ..memory.share import note_fork
from ..memory import samehost
from .accounting import StageAccounts
from .pool import PoolOptions, WorkerPool
from .options import grouped
from .scheduler import Scheduler
from .shipping import Shipping
from .stages import StageRunner
from .versions import VersionKeeper
from .driver import refuse_if_in_use, set_replication

log = logging.getLogger("clamor")
_live = weakref.WeakSet()   # started and not closed (region.close() checks it)


def any_open():
    """True while a Cluster of this process is open.  One dropped without
    close() but not yet collected (in a reference cycle) is collected
    first: its finalizer closes it."""
    if any(not c._closed for c in list(_live)):
        gc.collect()
    return any(not c._closed for c in list(_live))


def _refuse_close():
    if any_open():
        return "a Cluster of this process is still open: close it before the region"
    return None


region.add_close_guard(_refuse_close)


def _only_open_cluster():
    """One open Cluster per process: page versions, the changed-page lists
    and the peer directory belong to the region, and the region is the
    process's."""
    refuse_if_in_use()
    if any_open():
        raise errors.RegionInUse("another Cluster of this process is open: close it (or leave its with-block) "
                                 "before starting a new one; one process runs one Cluster at a time, since "
                                 "page versions and the page directory belong to the process's region")


class Cluster:
    """A driver and its workers: ``clamor.Cluster(workers=4)``.

    Its settings come in three groups (clamor/runtime/options.py), and each
    setting may also be given alone, by its name:

    - ``workers``: a count, or ``clamor.WorkerOptions(workers, remote,
      start_method, slots, same_host)``;
    - ``network``: ``clamor.NetworkOptions(listen, pages_port, worker_ports,
      secret, encrypt, replication)``;
    - ``recovery``: ``clamor.RecoveryOptions(recover, replace_workers,
      max_attempts, speculation, heartbeat_timeout, start_timeout)``.

    ``page_size``/``region_size``/``base`` set the region's geometry if this
    process has no region yet.  ``slots`` is how many tasks a worker may hold
    at once (running plus queued).  ``progress``: None shows a bar for stages
    over two seconds when stderr is a terminal; False never does.

    Failures: with ``recover`` (the default) the work of a lost worker is
    recomputed from lineage and the action returns the same result as
    without the failure; without it the action raises WorkerLost.
    ``replace_workers`` forks a new worker for each one lost.
    ``max_attempts`` bounds how often one partition may be lost with its
    worker, and how many attempts one stage may take, before WorkerLost.
    ``speculation``: True (Spark's defaults: a second copy of a task running
    1.5x longer than the stage's median once 75% of its tasks are done),
    False, or a ``clamor.Speculation(multiplier, quantile, min_runtime)``.

    ``workers`` local workers are started with ``start_method``: "fork"
    (the default: Python objects built under ``clamor.heap()`` are used in
    place) or "spawn" (fresh interpreters, ``clamor worker``: region arrays
    only, see docs/guide.md).  ``remote`` more workers, started by hand with
    ``join_command()``, are waited for before the first stage.

    Every socket of the cluster admits only processes that hold its
    ``secret`` (default: CLAMOR_SECRET, else a fresh random one, read back
    from ``cl.secret``) and, with ``encrypt`` (the default), encrypts what
    it sends (clamor/runtime/security.py).

    ``same_host``: "map" (the default) lets every worker on this host map
    the region's pages where they lie, read-only, instead of fetching them
    over a socket; a worker that cannot (another host or network namespace,
    another user) fetches, and ``stats()["same_host"]`` says why.  "fetch"
    makes every worker fetch.  The default is CLAMOR_SAME_HOST, else "map".

    ``workers`` defaults to ``os.cpu_count()`` (to 0 with ``remote``).  ``replication``:
    "two-choices" (default), "random" or "off" (peers serving hot pages).
    ``heartbeat_timeout``: seconds of silence after which a worker is lost
    (workers beat at a quarter of it, at most once a second).
    ``start_timeout``: seconds to wait for workers to start.  Bad settings
    raise ConfigError.  One Cluster may be open in a process at a time.
    """

    def __init__(self, workers=None, *, network=None, recovery=None, progress=None, page_size=None,
                 region_size=None, base=None, **settings):
        w, net, rec = grouped(workers, network, recovery, settings)
        self.options = {"workers": w, "network": net, "recovery": rec}
        self.same_host, self.nworkers, self.remote = w.same_host, w.workers, w.remote
        self.start_method, self.slots = w.start_method, w.slots
        self.recover, self.replace_workers = rec.recover, rec.replace_workers
        self.speculation, self.max_attempts = rec.speculation, rec.max_attempts
        self.heartbeat_timeout, self.start_timeout = rec.heartbeat_timeout, rec.start_timeout
        self.replication = net.replication
        self._listen, self._host = _listen_endpoint(net.listen)
        self._pages_port = net.pages_port or "*"
        self._worker_ports, self._ports = net.worker_ports, net.ports
        # the cluster's secret: given, else CLAMOR_SECRET, else a fresh one
        self._security = security.Security(security.from_environment(net.secret) or security.new_secret(),
                                           net.encrypt)
        self.encrypt = self._security.encrypt
        self.progress = progress
        self._geometry = (base, region_size, page_size)
        self._opened = self._started = self._closed = False
        self._accounts = StageAccounts()       # what the stages moved and took
        self._totals = self._accounts.totals
        self._forgotten = collections.deque()  # blocks whose collection is gone

    def __reduce__(self):
        raise errors.NotSerializable("a task cannot capture the Cluster: it stays on the driver "
                                     "(use it outside the functions you pass to map, filter, ...)")

    # Page versions kept only for the snapshots of unpersisted collections
    # (beyond those of live outputs): past this many, the oldest expire.
    _unpersisted_versions = StageRunner.unpersisted_versions

    @property
    def unpersisted_versions(self):
        return self._unpersisted_versions

    @unpersisted_versions.setter
    def unpersisted_versions(self, n):
        self._unpersisted_versions = n
        if self._opened:
            self._runner.unpersisted_versions = n

    # -- what collections ask of their cluster ----------------------------------------
    def _run_action(self, node, kind, arg, partitions=None, only=None):
        self._check()
        return self._runner.run_action(node, kind, arg, partitions, only)

    def _forget(self, prefix):
        # Called by a finalizer, so at any moment and in any thread: only
        # note it; the blocks are dropped before the next stage.
        self._forgotten.append(prefix)

    def _drop_cache(self, cid):
        """``unpersist``: the workers drop the copies (lineage keeps the
        versions they were made at)."""
        if self._closed or not self._started:
            return
        self._runner._drop_cache(cid)

    def _check_liveness(self):
        return self._runner._check_liveness()

    # -- life cycle -------------------------------------------------------------------
    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.close()

    @outside   # libzmq's objects and the workers' state must not land in a heap() block
    def start(self):
        """Map the region if needed, start the page server, fork the
        workers and wait for them (``start_timeout``).  Leaving ``with`` or
        ``close()`` stops them.  Raises RegionInUse while another Cluster of
        this process is open, RegionError in a worker, ConfigError for a
        geometry the region does not have, WorkerLost if workers do not
        start, ClamorError once closed."""
        self._open()
        if self._started:
            return self
        try:
            # Copy-on-write from now on: a forked worker may fetch a page
            # before its first task (the interpreter's after-fork work, the
            # arguments it was forked with), and a driver write made after
            # that must reach the changed list of the first stage.
            region.version_begin(region.version_current() + 1)
            self._pool.spawn(self.nworkers)
            self._started = self._pool.started = True
            self._await_workers()
            self._runner._idle_since = time.monotonic()
        except BaseException:
            self.close()
            raise
        log.info("cluster up: %d workers, page server %s, region write-protected by %s (%s)", len(self._workers),
                 self.page_endpoint, *region.write_protection().values())
        return self

    @outside
    def _open(self):
        """What start() does before it starts workers: the region, the page
        server, the control socket (``endpoint``)."""
        if self._closed:
            raise errors.ClamorError("this cluster is closed")
        if self._opened:
            return
        base, size, psize = self._geometry
        if region.role() is None:
            region.init(base=base, size=size, page_size=psize)
        elif region.role() != "driver":
            raise errors.RegionError("a Cluster runs in the driver, and this process is a worker")
        else:
            for name, want, have in (("page_size", psize, region.page_size()), ("region_size", size, region.size()),
                                     ("base", base, region.base())):
                if want and want != have:   # None or 0: the default, whatever it is
                    raise errors.ConfigError(f"this process's region already has {name} {have:#x}; a cluster "
                                             f"cannot use {want!r} (the region's geometry is fixed when it is mapped)")
        _only_open_cluster()
        self._security.core()   # the page server and every socket the core opens from now on
        served = region.server_endpoint()
        if served:   # started before, without this cluster's keys: again
            region.stop_serving()
        if not served or (self._host != "127.0.0.1" or self._pages_port != "*"):
            served = f"tcp://{self._host}:{self._pages_port}"   # where remote workers reach it
        self._page_endpoint = region.serve(served)
        region.set_fork_ports(*(self._worker_ports or (0, 0)))   # forked workers' page servers
        set_replication(self.replication)
        samehost.share(self.same_host == "map")   # forked workers map the driver's pages, or fetch them
        samehost.decline("the cluster was made with same_host='fetch'" if self.same_host == "fetch" else
                         "the driver's memfd could not be mapped after fork")
        region.reset_peers()  # holders from an earlier cluster in this process are gone
        # Workers inherit the allocator wrappers: a region object a worker
        # drops must never reach glibc's or pymalloc's free.
        install_heap_hooks()
        self._ctx = zmq.Context()
        self._sock, self._guard = security.control_socket(self._ctx, self._security, "driver")
        try:
            self._sock.bind(self._listen)
        except zmq.ZMQError as err:
            raise errors.TransportError(f"cannot listen on {self._listen}: {err}") from err
        self.endpoint = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._sched = Scheduler(recover=self.recover, speculation=self.speculation)
        self._pool = WorkerPool(self._sock, self.endpoint, self._security, self._host, PoolOptions(
            nworkers=self.nworkers, remote=self.remote, start_method=self.start_method, same_host=self.same_host,
            worker_ports=self._worker_ports, ports=self._ports, heartbeat_timeout=self.heartbeat_timeout,
            start_timeout=self.start_timeout, max_attempts=self.max_attempts, replace_workers=self.replace_workers),
            self._page_endpoint, self._totals)
        self._shipping = Shipping(self._pool, forked=self.start_method == "fork" and self.nworkers > 0,
                                  others=self.start_method != "fork" or self.remote > 0)
        self._lineage = Lineage()
        self._versions = VersionKeeper(moves=True)   # the page versions and what changed at each
        self._runner = StageRunner(self._sock, self._pool, self._lineage, self._sched, self._versions,
                                   self._shipping, self._accounts, self._forgotten, self.options["recovery"],
                                   self.slots, self.progress)
        self._runner.unpersisted_versions = self._unpersisted_versions
        # the driver's counters are the process's: stats() reports this cluster's share
        self._driver0 = region.stats()
        # Stops the workers when the Cluster is collected or at exit, if
        # close() has not; it must not reference the Cluster.
        self._finalizer = weakref.finalize(self, _shutdown, os.getpid(), self._sock, self._ctx, self._guard,
                                           self._pool.workers, self._pool.expected, self._pool.pid_of,
                                           self._pool.pids, self._pool.procs)
        _live.add(self)
        note_fork()
        self._opened = True

    def _await_workers(self):
        pool = self._pool
        deadline = time.monotonic() + self.start_timeout
        while len(pool.workers) < self.nworkers + self.remote:
            left = deadline - time.monotonic()
            if left <= 0 or not self._sock.poll(int(min(left, 0.5) * 1000)):
                pool.check_pids_at_start()
                self._runner._check_liveness()    # a welcomed worker gone before its HELLO frees its place
                if left <= 0:
                    raise errors.WorkerLost(pool.who_joined(self.join_command))
                continue
            self._runner._on_message(self._sock.recv_multipart())

    # The pool's, under the names tests and benchmarks read.
    _workers = property(lambda self: self._pool.workers)
    _expected = property(lambda self: self._pool.expected)
    _pid_of = property(lambda self: self._pool.pid_of)
    _pids = property(lambda self: self._pool.pids)

    @property
    def page_endpoint(self):
        """The page server workers are sent to (in WELCOME): the driver's,
        once the cluster is open; None before."""
        pool = self.__dict__.get("_pool")
        return pool.page_endpoint if pool is not None else self.__dict__.get("_page_endpoint")

    @page_endpoint.setter
    def page_endpoint(self, endpoint):
        self._page_endpoint = endpoint
        if self.__dict__.get("_pool") is not None:
            self._pool.page_endpoint = endpoint

    @property
    def secret(self):
        """The cluster's join secret: a worker started by hand needs it, in
        CLAMOR_SECRET or a file named by --secret-file."""
        return self._security.secret

    def join_command(self):
        """The command that starts a worker which joins this cluster (one of
        its ``remote`` workers).  Ready before start() waits for them."""
        self._open()
        return f"clamor worker {self.endpoint}" + ("" if self.encrypt else " --no-encrypt")

    @outside
    def close(self, timeout=5.0):
        """Stop every worker (STOP, then SIGKILL after ``timeout``) and reap."""
        self._closed = True
        if self._opened:
            self._pool.closed = self._runner.closed = True
        _live.discard(self)
        # The relocation lists were this cluster's workers': the objects they
        # kept listed may go now (a later cluster lists what it ships).
        portable.reset()
        fin = getattr(self, "_finalizer", None)
        state = fin.detach() if fin is not None else None
        if state is not None:   # (None: closed already)
            _, fn, args, _ = state
            fn(*args, timeout=timeout)
        # what forked workers inherited references to may be freed now
        if self._opened:
            self._pool.held.clear()

    @property
    def worker_pids(self):
        """Process ids of the current workers (live or starting), oldest first."""
        if not self._started:
            return []
        return self._pool.pids_in_order()

    def run(self, fn, *args, workers=None, **kwargs):
        """Call ``fn(*args, **kwargs)`` once on each worker, or on those
        ``workers`` names (indexes into ``worker_pids``' order, live ones
        only), as one stage; returns the results in that order.  Like a
        task, the call reads the globals as they stand now, and what it
        moves counts in ``stats()``.  A call that raises fails with
        TaskError; a worker lost before its call ends fails it with
        WorkerLost (the call runs there or nowhere)."""
        self._check()
        live = self._pool.live_ids()
        if workers is None:
            chosen = live
        else:
            if isinstance(workers, int):
                workers = [workers]
            chosen = []
            for i in workers:
                if isinstance(i, bool) or not isinstance(i, numbers.Integral) or not 0 <= i < len(live):
                    raise errors.ConfigError(f"workers names live workers by index, 0 to {len(live) - 1}, "
                                             f"not {i!r}")
                chosen.append(live[int(i)])
        if not chosen:
            return []
        node = Parallel(self, range(len(chosen)), len(chosen)).map(lambda _: fn(*args, **kwargs))
        try:
            parts = self._run_action(node, "collect", None, only={p: (w,) for p, w in enumerate(chosen)})
        except errors.WorkerLost as err:
            names = ", ".join(w.decode() for w in chosen if w not in self._workers) or "?"
            raise errors.WorkerLost(f"run(): worker {names} was lost before its call returned ({err})") from err
        return [r for part in parts for r in part]

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
        if isinstance(partitions, bool) or not isinstance(partitions, numbers.Integral) or partitions < 1:
            raise errors.ConfigError(f"partitions must be a positive int, not {partitions!r}")
        return int(partitions)

    def parallelize(self, data, partitions=None):
        """A collection of ``data`` (a sequence or ndarray) cut into
        ``partitions`` contiguous slices.  A region ndarray travels by
        reference, anything else by value with the task that reads it."""
        self._check()
        if not isinstance(data, (list, tuple, range, str, bytes, np.ndarray)):
            data = list(data)   # any other iterable: a dict gives its keys, as list(d) does
        return Parallel(self, data, self._nparts(partitions, len(data)))

    def range(self, start, stop=None, step=1, partitions=None):
        """The integers of ``range(start, stop, step)``, cut into
        ``partitions`` slices (default: two per worker).  ConfigError for a
        zero step or a bad partition count."""
        self._check()
        if stop is None:
            start, stop = 0, start
        if step == 0:
            raise errors.ConfigError("range() step must not be zero")
        return Range(self, start, stop, step, self._nparts(partitions, len(range(start, stop, step))))

    def read_text(self, paths, partitions=None, encoding="utf-8"):
        """Lines of the text files ``paths`` (a path, a glob or a list),
        without their line ends; byte ranges split on line starts, read by
        the workers.  FileNotFoundError for a path or glob that names no
        file; ConfigError for an encoding that does not write a newline as
        the byte 0x0a (UTF-16, UTF-32)."""
        self._check()
        if partitions is not None:
            partitions = self._nparts(partitions)  # ConfigError for 0, negative, non-int
        try:
            newline = "\n".encode(encoding)
        except (LookupError, TypeError) as err:
            raise errors.ConfigError(f"unknown text encoding {encoding!r}") from err
        if newline != b"\n":   # files are split at newline bytes
            raise errors.ConfigError(f"read_text needs an encoding in which a newline is the byte 0x0a "
                                     f"(UTF-8, Latin-1, ASCII, ...), not {encoding!r}")
        return TextFiles(self, paths, partitions, encoding)

    def read_npy(self, paths):
        """One partition per .npy file; its rows are the elements.
        FileNotFoundError for a path or glob that names no file."""
        self._check()
        return NpyFiles(self, paths)

    # -- statistics --------------------------------------------------------------------
    def stats(self):
        """Totals over this cluster's stages, and the per-stage list."""
        out = {k: self._totals[k] for k in ("stages", "tasks", "faults", "bytes_from_driver", "bytes_from_peers")}
        out["task_seconds"] = float(self._totals["task_seconds"])
        out["workers"] = len(getattr(self, "_workers", {}))
        drv = out["driver"] = region.stats()
        since = {k: drv[k] - getattr(self, "_driver0", {}).get(k, 0) for k in ("bytes_served", "redirects", "hint_bytes")}
        # lost workers too: what they served and fetched before they went
        pool = getattr(self, "_pool", None)
        ws = {**pool.gone, **{w: r.served_counts() for w, r in pool.workers.items()}} if pool else {}
        # a peer asked on a redirect or straight on a hint; a fallback is either kind that failed
        direct = sum(w.get("direct", 0) for w in ws.values())
        followed = sum(w.get("followed", 0) for w in ws.values()) + direct
        fallbacks = sum(w.get("fallbacks", 0) for w in ws.values())
        out["replication"] = {
            "policy": self.replication,
            "bytes_served_by_driver": since["bytes_served"],
            "bytes_served_by_peer": {w.decode(): info.get("served", 0) for w, info in ws.items()},
            "redirects": since["redirects"],
            "direct_requests": direct,
            "hint_bytes": since["hint_bytes"],
            "redirect_hit_rate": (followed - fallbacks) / followed if followed else 0.0,
            "peer_timeouts": sum(w.get("timeouts", 0) for w in ws.values()),
        }
        out["by_value"] = byvalue.counts()   # region objects workers could not use in place (process-wide)
        out["checks"] = serialize.check_stats()   # what the checks before stages keep (process-wide)
        out["bytes_mapped"] = self._totals["bytes_mapped"]
        out["wire_bytes"] = self._totals["wire_bytes"]
        # of wire_bytes, those that came as diffs against a worker's kept copy, and their pages
        out["wire_bytes_diff"] = self._totals["wire_bytes_diff"]
        out["diff_pages"] = self._totals["diff_pages"]
        out["write_protection"] = region.write_protection()
        out["same_host"] = {"mode": self.same_host,
                            "workers": {w.decode(): dict(info.same_host or {"mode": "fetch", "reason": "unknown"})
                                        for w, info in (pool.workers.items() if pool else ())}}
        out["recovery"] = {k: self._totals[k] for k in (
            "workers_lost", "workers_replaced", "tasks_rerun", "recovery_jobs", "speculative_copies",
            "copies_cancelled", "duplicate_results")}
        out["stages_detail"] = self.stage_stats()
        return out

    def stage_stats(self):
        """Per stage (the last 1000): its version, kind, tasks, durations,
        faults, bytes from the driver and from peers, payload sizes.  A
        stage's faults and bytes are what its workers reported moving since
        their previous report, whichever copy of a task it was about (a
        losing or failed one too): read-ahead that lands after a worker's
        last task of a stage counts in its next report.  A copy that
        outlives its stage adds to it when it reports, during a later
        action; the totals of stats() are always the sum."""
        return self._accounts.stage_stats()


def _listen_endpoint(listen):
    """(endpoint, host) of a ``listen`` setting: None (loopback, any port),
    "HOST:PORT" or "tcp://HOST:PORT".  The host must be an address of this
    host that workers can reach, not a wildcard: it is also where the page
    server listens and what forked workers' servers bind."""
    if listen is None:
        return "tcp://127.0.0.1:*", "127.0.0.1"
    if not isinstance(listen, str):
        raise errors.ConfigError(f"listen must be 'HOST:PORT' or 'tcp://HOST:PORT', not {listen!r}")
    ep = listen if listen.startswith("tcp://") else "tcp://" + listen
    host, sep, port = ep[6:].rpartition(":")
    if not sep or not host or not (port == "*" or (port.isdigit() and int(port) <= 65535)):
        raise errors.ConfigError(f"listen must be 'HOST:PORT' or 'tcp://HOST:PORT' (port 0-65535 or *), "
                                 f"not {listen!r}")
    if host in ("*", "0.0.0.0", "[::]", "::"):
        raise errors.ConfigError(f"listen on an address of this host that the workers can reach, not {host!r}: "
                                 f"workers are told it, and the page server listens there too")
    return ep, host


@outside
def _shutdown(owner, sock, ctx, guard, workers, expected, pid_of, pids, procs, timeout=5.0):
    """Stop a cluster's workers (STOP, then SIGKILL after ``timeout``), reap
    them and close its socket.  Runs from close(), or as the Cluster's
    finalizer (garbage collection, exit)."""
    if os.getpid() != owner:   # a forked copy of the driver: not its workers, nor its libzmq
        return
    for wid in list(workers):
        try:
            sock.send_multipart([wid, b"STOP"], flags=zmq.NOBLOCK)
        except zmq.ZMQError:
            pass
    for wid in list(expected):   # still starting: nothing to finish (one started by hand goes once we do)
        if pid_of.get(wid) in pids:
            try:
                os.kill(pid_of[wid], signal.SIGKILL)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + timeout
    for pid in list(pids):
        liveness.reap(pid, deadline)
    for proc in procs:
        proc.poll()   # reaped above: the Popen learns it, and does not warn that it still runs
    sock.close()
    guard.stop()
    ctx.term()
    region.reset_peers()

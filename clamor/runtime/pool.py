"""A Cluster's workers: starting them, letting them join, telling when one
is lost.

DESIGN.  The pool owns who the workers are: the typed record of each live
one (``WorkerRecord``), the processes it started, the places held for
workers still starting or joining, and the counters of the lost ones.  It
shares the Cluster's control socket (a ROUTER) but reads nothing from it:
the Cluster's message loop hands it JOIN, LEAVE and HELLO, and asks it
every half second which workers are lost (``check``).  What a loss means
for the work (the scheduler, lineage, the running attempt) is the
Cluster's: the pool only ends the worker, tells the others, and starts a
replacement (``replace_workers``) or opens its place again (a remote one).
"""
import dataclasses
import gc
import itertools
import json
import logging
import os
import pickle
import signal
import time

import numpy as np
import zmq

from .. import errors
from ..memory import portable, region, samehost
from ..memory import classkeys
from ..memory.hooks import prepare_fork, prepare_next_fork
from . import code, liveness
from .driver import heartbeat_interval, read_join, read_leave, welcome
from .executor import worker_main
from .liveness import exit_state, pid_alive, shares_pids

log = logging.getLogger("clamor")


@dataclasses.dataclass(eq=False)
class WorkerRecord:
    """A live worker, as its HELLO said and as the driver keeps it."""
    pid: int
    blocks: str                  # its block server
    pages: str = None            # its page server (None: it serves none)
    slots: int = None            # tasks it holds at once (None: the cluster's)
    same_host: dict = None       # {"mode": "map" or "fetch", "reason"}
    counters: dict = None        # its counters at its last report (its HELLO's at first)
    seen: int = 0                # the page version its copies reflect
    far: bool = False            # its pid cannot be checked from here (another PID namespace)
    spawned: bool = False        # not forked from the driver: it joined with JOIN
    hash_ok: bool = False        # (spawned) its str hash seed is the driver's
    same_base: bool = False      # (spawned) it maps the region at the driver's address
    stages: set = dataclasses.field(default_factory=set)       # attempts whose payload it was sent
    sent: set = dataclasses.field(default_factory=set)         # task keys sent and not reported
    reloc_sent: set = dataclasses.field(default_factory=set)   # relocation targets it was sent
    reloc_inval: np.ndarray = None   # pages whose relocation lists changed since its last task
    served: int = 0              # page bytes it served, and its peer requests (stats())
    followed: int = 0
    fallbacks: int = 0
    direct: int = 0
    timeouts: int = 0

    @property
    def maps(self):
        """It maps the driver's pages (same host)."""
        return (self.same_host or {}).get("mode") == "map"

    def served_counts(self):
        """What stats() sums over lost workers too."""
        return {k: getattr(self, k) for k in ("served", "followed", "fallbacks", "direct", "timeouts")}


@dataclasses.dataclass(frozen=True)
class PoolOptions:
    """What the pool is told of the Cluster's settings (checked there)."""
    nworkers: int                # local workers to start
    remote: int                  # workers started by hand, waited for
    start_method: str            # "fork" or "spawn"
    same_host: str               # "map" or "fetch"
    worker_ports: tuple = None   # (lo, hi) of the workers' servers, or None: any
    ports: str = "*"             # the same, as "LO-HI" or "*"
    heartbeat_timeout: float = 10.0
    start_timeout: float = 60.0
    max_attempts: int = 4        # replacements that may die in a row before starting
    replace_workers: bool = True


class WorkerPool:
    """The workers of one Cluster (see the module docstring).  ``totals``:
    the Cluster's counters (workers lost and replaced go there)."""

    def __init__(self, sock, endpoint, security, host, opts, page_endpoint, totals):
        self.sock, self.endpoint, self.security, self.host = sock, endpoint, security, host
        self.opts = opts                # nworkers, remote, start_method, same_host, ports, timeouts, ...
        self.page_endpoint = page_endpoint
        self.totals = totals
        self.started = self.closed = False
        self.workers = {}       # wid -> WorkerRecord
        self.pids = []          # every worker process ever started, reaped at close
        self.pid_of = {}
        self.expected = set()   # started or welcomed, HELLO not yet received
        self.joining = {}       # pid -> wid: spawned, JOIN not yet received
        self.procs = []         # the spawned ones' Popen objects
        self.remote = set()     # wids of the workers started by hand
        self.far = set()        # wids whose pid this host cannot check (another PID namespace)
        self.joined_ids = set()   # wids of every worker that was not forked (it joined with JOIN)
        self.join_info = {}     # wid -> what its JOIN said of relocating (hash_ok, same_base)
        self.welcomed_at = {}   # wid -> when its WELCOME left, until its HELLO
        self.born = {}          # forked wid -> the version it was forked at
        self.held = {}          # id -> region object forked workers inherited a reference to (prepare_fork)
        self.remote_open = opts.remote   # hand-started workers still welcome
        self.start_failures = 0  # replacements in a row that died before joining
        self.gone = {}          # lost worker -> its last reported counters (stats())
        self.heard = liveness.Heard()   # live wid -> when it was last heard from (a heartbeat or any report)
        self._wids = itertools.count()

    # -- starting ---------------------------------------------------------------------------
    def spawn(self, count=1):
        """Start ``count`` more local workers; each joins when its HELLO arrives."""
        if self.opts.start_method != "fork":
            for _ in range(count):
                self._spawn_one()
            return
        # before the arguments are made: none may come from a free list
        for obj in prepare_fork():
            self.held.setdefault(id(obj), obj)
        if not self.started:
            classkeys.accept()      # (the Cluster's own workers: they have its classes' keys as frozen now)
        code.note_fork()
        # The forks after the first reuse its preparation: nothing between
        # them touches a region object, and no collection runs.
        collecting = gc.isenabled()
        gc.disable()
        try:
            for i in range(count):
                if i:
                    prepare_next_fork()
                self._spawn_one()
        finally:
            if collecting:
                gc.enable()

    def _spawn_one(self):
        o = self.opts
        wid = b"w%d" % next(self._wids)
        if o.start_method == "fork":
            pid = liveness.fork(worker_main, self.endpoint, wid, self.security, self.host, o.ports,
                                heartbeat_interval(o.heartbeat_timeout))
            self.born[wid] = region.version_current()   # the version its copies reflect until its first task
        else:
            args = ["--driver", self.endpoint, "--advertise", self.host] + \
                ([] if self.security.encrypt else ["--no-encrypt"])
            if o.worker_ports:
                args += ["--ports", o.ports]
            proc = liveness.spawn(args, {"CLAMOR_SECRET": self.security.secret})
            self.procs.append(proc)
            pid = proc.pid
            self.joining[pid] = wid
        self.pids.append(pid)
        self.pid_of[wid] = pid
        self.expected.add(wid)
        if self.started:
            self.totals["workers_replaced"] += 1
            log.info("started worker %s (pid %d) to replace a lost one", wid.decode(), pid)

    def check_pids_at_start(self):
        for pid in self.pids:
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done:
                raise errors.WorkerLost(f"worker process {pid} exited during start-up")

    def who_joined(self, join_command):
        """What start() says when workers did not start in time."""
        o = self.opts
        local = sum(w not in self.remote for w in self.workers)
        msg = [f"{local} of {o.nworkers} local workers started"] if o.nworkers else []
        if o.remote:
            joined = sorted(f"{w.decode()} (pid {self.pid_of[w]})" for w in self.workers if w in self.remote)
            msg.append(f"{len(joined)} of {o.remote} remote workers joined ({', '.join(joined) or 'none'}); "
                       f"each missing one starts with {join_command()!r}")
        return f"within {o.start_timeout}s: " + "; ".join(msg)

    def live_ids(self):
        """The live workers' ids, oldest first."""
        return sorted(self.workers, key=lambda w: int(w[1:]))

    def pids_in_order(self):
        """Process ids of the current workers (live or starting), oldest first."""
        return [self.pid_of[w] for w in sorted(set(self.workers) | self.expected, key=lambda w: int(w[1:]))]

    # -- joining (docs/wire.md#joining) -----------------------------------------------------
    def join(self, ident, frame):
        """A worker not forked from here asks to join (clamor/runtime/worker.py):
        one this cluster spawned, or one of its ``remote`` workers."""
        try:
            body = read_join(frame)
            pid, pidns = body["pid"], body["pidns"]
        except (ValueError, TypeError, KeyError) as err:
            log.warning("dropped a malformed JOIN: %s", err)
            return
        local = shares_pids(pidns)
        if local and not pid_alive(pid):    # it gave up waiting for an answer (the driver was not reading)
            return
        wid = self.joining.pop(pid, None) if local else None
        if wid is None:
            if self.closed or self.remote_open <= 0:
                reason = ("the cluster is closed" if self.closed else
                          f"it expects no more workers ({self.opts.remote} remote, all joined)")
                self.sock.send_multipart([ident, b"REFUSED", json.dumps({"reason": reason}).encode()])
                return
            self.remote_open -= 1
            wid = b"w%d" % next(self._wids)
            self.remote.add(wid)
            if not local:
                self.far.add(wid)
            self.pid_of[wid] = pid
            self.expected.add(wid)
        self.joined_ids.add(wid)
        self.welcomed_at[wid] = time.monotonic()
        base = body["base"]
        self.join_info[wid] = {"hash_ok": body["hash"] == portable.hash_digest(),
                               "same_base": base is None or base == region.base()}
        self.sock.send_multipart([ident, b"WELCOME", welcome(self.page_endpoint, wid=wid.decode(),
                                  same_host=samehost.info() if self.opts.same_host == "map" else None,
                                  heartbeat=heartbeat_interval(self.opts.heartbeat_timeout))])

    def left(self, frame):
        """A welcomed worker that will not join after all (its images differ
        from the driver's): its place is free again."""
        try:
            body = read_leave(frame)
            wid = body["wid"].encode()
        except (ValueError, TypeError, KeyError, AttributeError) as err:   # (no wid: AttributeError)
            log.warning("dropped a malformed LEAVE: %s", err)
            return
        if wid in self.expected and wid in self.joined_ids:
            self.expected.discard(wid)
            self.joining = {p: w for p, w in self.joining.items() if w != wid}
            if wid in self.remote:
                self.remote.discard(wid)
                self.remote_open += 1
            log.warning("worker %s (pid %s) refused to join: %s", wid.decode(), self.pid_of.get(wid),
                        body["reason"])

    def hello(self, wid, info):
        """A worker said HELLO: its record, or None if it is not one this
        pool started or welcomed and has not heard from."""
        if wid in self.workers or wid not in self.expected:
            return None
        self.expected.discard(wid)
        self.welcomed_at.pop(wid, None)
        self.start_failures = 0
        # A forked worker's copies reflect the version it was forked at, which a
        # version begun before its HELLO may have changed; one that joined has
        # fetched nothing yet.
        seen = self.born.pop(wid, region.version_current())
        mode = info.get("same_host") if isinstance(info.get("same_host"), dict) else {}
        same_host = {"mode": "map" if mode.get("mode") == "map" else "fetch", "reason": str(mode.get("reason", ""))[:500]}
        if self.opts.same_host == "map" and same_host["mode"] == "fetch":
            log.log(logging.INFO if wid in self.far else logging.WARNING, "worker %s fetches the driver's pages "
                    "instead of mapping them: %s", wid.decode(), same_host["reason"])
        rec = WorkerRecord(pid=info["pid"], blocks=info["blocks"], pages=info.get("pages"), slots=info.get("slots"),
                           same_host=same_host, counters=info.get("counters"), seen=seen,
                           far=wid in self.far, spawned=wid in self.joined_ids, **self.join_info.pop(wid, {}))
        self.workers[wid] = rec
        self.heard.heard(wid)
        for other in self.workers:   # its endpoint may be a lost worker's, reused: no longer dead
            if other != wid:
                self.sock.send_multipart([other, b"LIVE", pickle.dumps([rec.blocks])])
        replacement = int(wid[1:]) >= self.opts.nworkers + self.opts.remote
        log.log(logging.INFO if replacement else logging.DEBUG, "worker %s (pid %d) joined", wid.decode(), rec.pid)
        return rec

    # -- losing -----------------------------------------------------------------------------
    def check(self, lose):
        """Find the live workers lost now, and call ``lose(wid, reason)``
        for each (it calls ``remove``); workers that died while starting
        are replaced here.  Returns WorkerLost if replacements keep dying
        before they join and none is left, else None."""
        trouble = None
        now = time.monotonic()
        silent = dict(self.heard.silent(self.opts.heartbeat_timeout, now))
        for wid, rec in list(self.workers.items()):
            reason = None if rec.far else exit_state(rec.pid)
            if reason is None and rec.far and not self.connected(wid):
                reason = "its connection closed"
            if reason is None and wid in silent:
                reason = f"no heartbeat for {silent[wid]:.1f}s"
            if reason:
                lose(wid, reason)
        for wid in list(self.expected):   # a replacement that died before its HELLO
            if wid in self.far:
                # no pid to check: one silent past start_timeout after its WELCOME is gone
                if now - self.welcomed_at.get(wid, now) > self.opts.start_timeout:
                    self.expected.discard(wid)
                    self.remote.discard(wid)
                    self.remote_open += 1
                    log.warning("worker %s was welcomed %.0f s ago and never said HELLO; its place is open "
                                "again", wid.decode(), now - self.welcomed_at.pop(wid))
                continue
            pid = self.pid_of[wid]
            if exit_state(pid) is not None:
                self.expected.discard(wid)
                self.totals["workers_lost"] += 1
                self.start_failures += 1
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass
                if self.start_failures > self.opts.max_attempts:
                    log.error("worker %s (pid %d) died while starting; %d replacements have failed to start, "
                              "not forking more", wid.decode(), pid, self.start_failures)
                    if not self.workers and not self.expected:
                        trouble = errors.WorkerLost(
                            f"no live workers ({self.start_failures} replacements died while starting)")
                    continue
                log.warning("worker %s (pid %d) died while starting", wid.decode(), pid)
                self.replace(wid)
        return trouble

    def connected(self, wid):
        """Whether the control socket still has a connection to ``wid``: a
        worker this host cannot check by pid is lost as soon as its
        connection closes, not only after ``heartbeat_timeout``."""
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        try:
            self.sock.send_multipart([wid, b"PING"], flags=zmq.NOBLOCK)
            return True
        except zmq.ZMQError as err:
            return err.errno != zmq.EHOSTUNREACH    # (EAGAIN: its queue is full, but it is there)
        finally:
            self.sock.setsockopt(zmq.ROUTER_MANDATORY, 0)

    def remove(self, wid, reason):
        """End lost worker ``wid`` and return its record: one that stopped
        answering may still run, and must not come back; once reaped,
        close() must never wait for, or kill, its reused pid."""
        rec = self.workers.pop(wid)
        self.heard.forget(wid)
        self.gone[wid] = rec.served_counts()
        log.warning("worker %s (pid %d) lost: %s", wid.decode(), rec.pid, reason)
        self.totals["workers_lost"] += 1
        if rec.far:
            self.sock.send_multipart([wid, b"STOP"])
        elif kill_and_reap(rec.pid) and rec.pid in self.pids:
            self.pids.remove(rec.pid)
        if rec.pages:
            region.forget_peer(rec.pages)
        return rec

    def tell_lost(self, rec):
        """The others: fetches from ``rec``'s worker fail at once rather than time out."""
        for other in self.workers:
            self.sock.send_multipart([other, b"LOST", pickle.dumps([rec.blocks]),
                                      pickle.dumps([rec.pages] if rec.pages else [])])

    def replace(self, wid):
        """A local worker lost gets a replacement (``replace_workers``); a
        remote one leaves its place to the next worker that joins."""
        if wid in self.remote:
            self.remote_open += 1
        elif self.opts.replace_workers and not self.closed:
            self.spawn()

    def send_all(self, *frames):
        """The same message to every live worker."""
        for wid in self.workers:
            self.sock.send_multipart([wid, *frames])


def kill_and_reap(pid, wait=1.0):
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
